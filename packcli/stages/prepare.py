"""Resolving the tokenize stage before anything is written: the input files, the tokenizer
and its settings, and the backend that will encode (the fast one only after its self-check)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from packcli import __version__
from packcli.chat.encoder import ChatEncoder
from packcli.config import RunConfig
from packcli.errors import ConfigError
from packcli.fs import input_size
from packcli.names import TOKENS_DIR
from packcli.read import ReadStats, file_format, resolve_inputs
from packcli.stages.units import input_column, read_unit
from packcli.stages.work import require_out
from packcli.tokenize.backends import bounded_sample, choose_encoder, preload
from packcli.tokenize.records import SUCCESS
from packcli.tokenize.tokenizer import (
    LoadedTokenizer,
    load_tokenizer,
    local_tokenizer_file,
    resolve_special,
    set_special_in_text,
)

if TYPE_CHECKING:
    from packcli.chat.offsets import FastOffsets
    from packcli.chat.preference import PreferenceEncoder
    from packcli.tokenize.backends import Encoder

    # What tokenizes a unit: a text encoder (HF or a fast backend) or a chat record encoder.
    UnitEncoder: TypeAlias = Encoder | ChatEncoder | PreferenceEncoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tokenizing:
    """What the tokenize stage's result depends on, resolved once per task."""

    loaded: LoadedTokenizer
    eos: int | None
    bos: int | None
    settings: dict[str, Any]  # fingerprinted
    chat: ChatEncoder | PreferenceEncoder | None = None  # --format chat / preference
    # A mixture's sources: per source its (bos, eos) ids and what its units' shards depend
    # on beyond ``settings`` (text field, separators); empty without sources.
    sources: tuple[dict[str, Any], ...] = ()

    def specials(self, unit: dict[str, Any]) -> tuple[int | None, int | None]:
        """(bos, eos) of a unit's documents: its source's, else the run's."""
        if "source" in unit and self.sources:
            own = self.sources[unit["source"]]
            return own["bos"], own["eos"]
        return self.bos, self.eos

    @property
    def record(self) -> dict[str, Any]:
        return {
            "source": self.loaded.source,
            "sha256": self.loaded.fingerprint,
            "vocab_size": self.loaded.vocab_size,
            "eos_id": self.eos,
            "bos_id": self.bos,
            "disabled": list(self.loaded.disabled),
            "special_in_text": self.settings.get("special_in_text"),
        }


def resolve_tokenizing(cfg: RunConfig) -> Tokenizing:
    loaded = load_tokenizer(cfg.tokenize.tokenizer)
    if not cfg.chat.uses_template:  # a chat template's markers must stay special tokens
        set_special_in_text(loaded.tokenizer, cfg.tokenize.special_in_text)
    eos = resolve_special(loaded, cfg.tokenize.eos, "eos")
    bos = resolve_special(loaded, cfg.tokenize.bos, "bos")
    settings: dict[str, Any] = {
        "text_field": cfg.read.text_field,
        "on_bad_line": cfg.read.on_bad_line,
        "tokenizer_sha256": loaded.fingerprint,
        "eos": eos,
        "bos": bos,
        "shard_tokens": cfg.tokenize.shard_tokens,
        "packcli": __version__,
        # Bumped when what the reader accepts changes: v2 verifies compressed streams first
        # (work folders tokenized from a damaged file by v1 kept garbled lines).
        "reader": 2,
        # Bumped when where shards are cut changes (a grouped plan follows the shards): v2
        # cuts a unit expected to fit in two shards into about four (stages/tokenize.py).
        "shards": 2,
    }
    if not cfg.chat.uses_template:
        settings["special_in_text"] = cfg.tokenize.special_in_text
    chat = None
    if cfg.chat.is_preference:
        chat = _preference_encoder(cfg, loaded, bos, eos, settings)
    elif cfg.chat.uses_template:
        from packcli.chat import load_chat_template, special_tokens_from_config

        template = load_chat_template(cfg.tokenize.tokenizer, cfg.chat.chat_template)
        chat = ChatEncoder(
            loaded.tokenizer,
            template,
            train_on=cfg.chat.train_on,
            special_tokens=special_tokens_from_config(loaded.config),
            long_len=cfg.plan.long_len,
            overlong=cfg.plan.overlong,
            bos=bos,
            eos=eos,
        )
        # The chat path cuts dialogues at turn boundaries while tokenizing, so the long tier
        # and the policy are part of what the shards depend on.
        settings["chat"] = {
            **dataclasses.asdict(cfg.chat),
            # Bumped when the same inputs encode differently (2: spans located from a
            # sentinel rendering; --bos/--eos applied), so older shards are not reused.
            "encoder": 2,
            "template_source": template.source,
            "template_sha256": hashlib.sha256(template.text.encode("utf-8")).hexdigest(),
            "special_tokens": chat.special_tokens,
            "long_len": cfg.plan.long_len,
            "overlong": cfg.plan.overlong,
        }
    sources = tuple(
        {
            "name": src.name,
            "text_field": cfg.source_settings(k)["text_field"],
            "bos": resolve_special(loaded, cfg.source_settings(k)["bos"], "bos"),
            "eos": resolve_special(loaded, cfg.source_settings(k)["eos"], "eos"),
        }
        for k, src in enumerate(cfg.sources)
    )
    return Tokenizing(loaded, eos, bos, settings, chat, sources)


def _preference_encoder(
    cfg: RunConfig,
    loaded: LoadedTokenizer,
    bos: int | None,
    eos: int | None,
    settings: dict[str, Any],
) -> Any:
    """The ``--format preference`` encoder, and its part of the tokenize fingerprint (its own
    key: text and chat work folders keep their fingerprints and still resume).

    A chat template named with ``--chat-template`` must load; without one, pairs of strings
    need none, so a tokenizer without a template fails only on conversational pairs (each
    naming its line and why)."""
    from packcli.chat import ChatTemplateError, load_chat_template, special_tokens_from_config
    from packcli.chat.preference import PreferenceEncoder

    template, missing = None, ""
    try:
        template = load_chat_template(cfg.tokenize.tokenizer, cfg.chat.chat_template)
    except ChatTemplateError as exc:
        if cfg.chat.chat_template:
            raise
        missing = str(exc)
    encoder = PreferenceEncoder(
        loaded.tokenizer,
        template,
        special_tokens=special_tokens_from_config(loaded.config),
        long_len=cfg.plan.long_len,
        overlong=cfg.plan.overlong,
        bos=bos,
        eos=eos,
        template_missing=missing,
    )
    settings["preference"] = {
        "format": cfg.chat.format,
        "chat_template": cfg.chat.chat_template,
        # Bumped when the same inputs encode differently, so older shards are not reused.
        "encoder": 1,
        "template_source": template.source if template else None,
        "template_sha256": (
            hashlib.sha256(template.text.encode("utf-8")).hexdigest() if template else None
        ),
        "special_tokens": encoder.special_tokens,
        # Pairs are fitted to the long tier while tokenizing (--overlong truncate).
        "long_len": cfg.plan.long_len,
        "overlong": cfg.plan.overlong,
    }
    return encoder


@dataclass(frozen=True)
class Prepared:
    """The tokenize stage's inputs and tokenizer, resolved before anything is written."""

    paths: list[Path | str]  # a URL is a string (packcli/fs/)
    tok: Tokenizing
    early: Any = None  # a fast backend already loading (backends.preload)
    input_bytes: int = 0  # the inputs' sizes, summed
    # A mixture: the source of each path (paths are source after source); else None.
    path_sources: list[int] | None = None


def prepare_tokenize(cfg: RunConfig) -> Prepared:
    """Resolve everything a user can get wrong (input paths, the tokenizer, EOS/BOS, the
    chat template) before any file is touched: a failed rerun must not un-complete or
    delete a finished output."""
    require_out(cfg)
    if cfg.tokenize.num_proc:
        # The tokenizers' Rust thread pools read these when they first start in the process
        # (HF and gigatoken: rayon's global pool; fastokens: its own BPE pool).
        os.environ["RAYON_NUM_THREADS"] = str(cfg.tokenize.num_proc)
        os.environ["FASTOKENS_BPE_THREADS"] = str(cfg.tokenize.num_proc)
    # Never read back what packcli writes (rejected.jsonl, work files) as input.
    fences: tuple[Path | str, ...] = (cfg.out_path, cfg.work_path)
    if cfg.remote_out:
        fences += (cfg.remote_out,)
    path_sources = None
    if cfg.sources:
        paths, path_sources = _source_paths(cfg, fences)
    else:
        paths = resolve_inputs(cfg.read.inputs, exclude=fences, input_format=cfg.read.input_format)
    formats = [file_format(p, cfg.read.input_format) or "jsonl" for p in paths]
    if any(f != "jsonl" for f in formats):  # a column missing from a file: refused up front
        from packcli.read.columnar import check_columns

        if path_sources is None:
            check_columns(paths, formats, *input_column(cfg))
        for k in range(len(cfg.sources)):
            mine = [i for i, s in enumerate(path_sources or []) if s == k]
            field = cfg.source_settings(k)["text_field"]
            check_columns([paths[i] for i in mine], [formats[i] for i in mine], field, "text_field")
    early = None
    input_bytes = sum(input_size(p) for p in paths)
    if not (cfg.work_path / TOKENS_DIR / SUCCESS).is_file():
        # A fresh (or interrupted) tokenize stage: the fast backend will be wanted, so it
        # builds its tables while HF loads (a finished stage is reused and needs neither).
        early = preload(
            cfg.tokenize.backend,
            local_tokenizer_file(cfg.tokenize.tokenizer),
            input_bytes,
        )
    return Prepared(paths, resolve_tokenizing(cfg), early, input_bytes, path_sources)


def _source_paths(
    cfg: RunConfig, fences: tuple[Path | str, ...]
) -> tuple[list[Path | str], list[int]]:
    """A mixture's input files, source after source (each source's sorted by path, as one
    pool's are), and the source of each: a source's documents then hold consecutive doc ids.
    A file in two sources is refused (to weight a file, give its source a weight)."""
    paths: list[Path | str] = []
    sources: list[int] = []
    owner: dict[str, str] = {}
    for k, src in enumerate(cfg.sources):
        mine = resolve_inputs(src.inputs, exclude=fences, input_format=cfg.read.input_format)
        for p in mine:
            if (other := owner.setdefault(str(p), src.name)) != src.name:
                raise ConfigError(f"{p} is an input of sources {other} and {src.name}")
        paths += mine
        sources += [k] * len(mine)
    return paths, sources


SAMPLE_DOCS = 256


def choose_backend(
    cfg: RunConfig, tok: Tokenizing, units: list[dict[str, Any]], early: Any = None
) -> tuple[UnitEncoder, dict[str, Any]]:
    """HF, or a fast backend after it reproduced HF's ids on a sample
    (packcli/tokenize/backends.py).

    The sample is the first documents of the first input unit, the same for every task, so
    all tasks make the same choice. (Ids are identical either way; the check is what makes
    that true rather than hoped.)
    """

    @functools.cache
    def sample() -> list[str]:
        if not units:
            return []
        batches = read_unit(
            cfg,
            {**units[0], "paths": [units[0]["path"]]},  # the first file's documents
            SAMPLE_DOCS,
            ReadStats(),
            sample=True,
        )
        first = next(iter(batches), None)
        if first is None:
            return []
        if tok.chat is None:
            return first.texts
        return tok.chat.rendered_texts(first.texts)  # what the chat path encodes

    table = None
    if tok.chat is not None and cfg.tokenize.backend != "hf":
        from packcli.chat.offsets import ByteOffsets  # chat only: text packs skip its import

        table = ByteOffsets.of(tok.loaded.tokenizer)
        if table is None:
            reason = (
                "chat loss masks need character offsets, which packcli derives from ids only "
                "for byte-level BPE tokenizers"
            )
            if cfg.tokenize.backend != "auto":
                raise ConfigError(
                    f"tokenizer backend {cfg.tokenize.backend}: {reason}; use backend auto or hf"
                )
            return tok.chat, {
                "requested": cfg.tokenize.backend,
                "backend": "hf",
                "fallback_reason": reason,
            }
    encoder, record = choose_encoder(
        tok.loaded.tokenizer,
        cfg.tokenize.backend,
        sample,
        serialized=lambda: tok.loaded.serialized,
        input_bytes=sum(u["size"] for u in units),  # the whole input: every task agrees
        loading=early,
    )
    if tok.chat is None:
        return encoder, record
    if table is None or encoder.name == "hf":
        return tok.chat, record
    from packcli.chat.offsets import FastOffsets

    return _chat_offsets(cfg, tok, FastOffsets(encoder, table), sample(), record)


def _chat_offsets(
    cfg: RunConfig, tok: Tokenizing, fast: FastOffsets, sample: list[str], record: dict[str, Any]
) -> tuple[UnitEncoder, dict[str, Any]]:
    """The chat encoder on ``fast`` once its offsets equal HF's on the sample and the
    adversarial texts, else on HF (``auto``) or a ``ConfigError`` (a named backend)."""
    from packcli.chat.offsets import ADVERSARIAL, check_offsets

    assert tok.chat is not None
    check = check_offsets(fast, tok.loaded.tokenizer, [*bounded_sample(sample), *ADVERSARIAL])
    record["chat_offsets"] = check.to_json()
    if check.mismatch is None:
        return tok.chat.using(fast), record
    if cfg.tokenize.backend != "auto":
        raise ConfigError(
            f"tokenizer backend {fast.name}: {check.mismatch}; use backend auto or hf"
        )
    log.warning("chat on HF tokenizers, not %s: %s", fast.name, check.mismatch)
    record.update(backend="hf", fallback_reason=f"{fast.name}: {check.mismatch}")
    return tok.chat, record
