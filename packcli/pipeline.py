"""The orchestrator: read -> tokenize -> shards -> plan -> write -> finalize, with resume.

Each stage is a function that can run alone (``packcli tokenize|plan|write|finalize``, as
cluster tasks) or all together (``packcli pack``); both paths run the same code and give
byte-identical Parquet files. Output folder layout::

    OUT/README.md                       dataset card (Hub YAML configs + dataset_info)
    OUT/packcli.json                    resolved config + report + file hashes; written last,
                                        so its presence marks a complete output
    OUT/data/{long,short}/train-*.parquet
    OUT/.packcli/                       work folder (--work-dir moves it):
        tokens/stage.json               tokenize settings, input files, tokenizer
        tokens/files/<key>/             one input file's shards + _SUCCESS.json
        tokens/_SUCCESS.json            index of all shards (global doc ids)
        plan.npz, plan.json             the plan (reads only lengths)
        write/<config>-<i>.json         one record per finished Parquet file
        packcli-work.json               marks the folder as packcli's (and names its output)

Resume: a stage's unit of work (an input file, a byte span of a big one or a group of small
ones; a tokenized shard; an output file) is skipped when its completion record carries the
current fingerprint, which covers everything the result depends on (input paths, sizes and
mtimes, tokenizer, settings, packcli version). Only this module and the CLI print;
everything below logs.

Other people's folders and finished outputs: a non-empty ``--out`` is written into only when
it holds packcli's marks (``packcli.json``, or the work folder's marker); everything a user
can get wrong is resolved before the first file is touched, and ``packcli.json`` is removed
only just before something it vouches for changes, so a failed or all-reused rerun leaves a
finished output finished. ``pack`` holds locks on the output and work folders
(``packcli/lock.py``).

A URL ``--out`` (``s3://...``) is made in a local staging folder (``RunConfig.out_path``)
exactly as a local output, and ``finalize`` then uploads it file by file, ``packcli.json``
last (``packcli/fs.py``); the remote prefix obeys the same ownership rule as a folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tqdm import tqdm

from packcli import __version__
from packcli.arrow_np import to_numpy
from packcli.backends import bounded_sample, choose_encoder, preload
from packcli.card import CONFIG_NAMES, MARKER, STATS_DIR, render_card
from packcli.chat.encoder import ChatEncoder, ChatStats, tokenize_chat_batches
from packcli.chat.offsets import ADVERSARIAL, ByteOffsets, FastOffsets, check_offsets
from packcli.config import (
    ChatConfig,
    PlanConfig,
    ReadConfig,
    RunConfig,
    TokenizeConfig,
    WriteConfig,
)
from packcli.encode import StageTimes, prefetch, tokenize_batches
from packcli.errors import ConfigError, InputError, PackcliError
from packcli.executors import Executor
from packcli.faults import crash_point
from packcli.fs import (
    as_input,
    check_remote_output,
    input_entry,
    input_size,
    redact,
    upload_output,
)
from packcli.lock import OUT_LOCK, hold
from packcli.plan import Plan, RowLayout, plan_two_tier
from packcli.read import (
    DocBatch,
    ReadStats,
    RejectSink,
    count_newlines,
    file_format,
    iter_batches,
    resolve_inputs,
    shift_reject_lines,
    split_spans,
    splittable,
    suffix_format,
)
from packcli.report import TOKENS_PER_STEP, build_report
from packcli.shards import (
    CHAT_SHARD_SCHEMA,
    PREFERENCE_SHARD_SCHEMA,
    SHARD_SCHEMA,
    SUCCESS,
    ShardWriter,
    TokenShards,
    atomic_write_bytes,
    atomic_write_json,
    manifest_name,
    sha256_file,
    shard_intact,
)
from packcli.tasks import assign_by_size
from packcli.tokenizer import (
    LoadedTokenizer,
    SpecialStringCounter,
    load_tokenizer,
    local_tokenizer_file,
    resolve_special,
    set_special_in_text,
)
from packcli.workstore import (
    LocalWork,
    WorkStore,
    check_remote_work,
    in_mirror,
    work_store,
)
from packcli.write import TokenSource, file_ranges, write_config_file

log = logging.getLogger(__name__)

REJECTED = "rejected.jsonl"


@dataclass
class RunResult:
    report: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    reused_tokens: bool = False
    # Busy seconds inside the tokenize stage (read, encode, assemble, write, wait).
    tokenize_times: dict[str, float] = field(default_factory=dict)


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return {}
    return data if isinstance(data, dict) else {}


def _bar(quiet: bool, **kwargs: Any) -> tqdm:
    """A progress bar on stderr; off with --quiet, and by itself when stderr is not a
    terminal (batch jobs' logs stay free of carriage-return noise)."""
    return tqdm(disable=True if quiet else None, file=sys.stderr, dynamic_ncols=True, **kwargs)


WORK_MARKER = "packcli-work.json"


def _is_work_folder(work: Path, out: Path | None) -> bool:
    """Whether ``work`` holds packcli's marker (naming ``out``, when given: a work folder
    elsewhere claims only the output it was made for). A work folder of a packcli without
    markers is recognised by its tokenize stage record."""
    marker = _read_json(work / WORK_MARKER)
    if marker.get("packcli_work") == 1:
        return out is None or marker.get("out") == str(out.resolve())
    stage = _read_json(work / "tokens" / "stage.json")
    return out is None and "settings" in stage and "units" in stage


def _is_output(out: Path) -> bool:
    """Whether ``out`` holds a packcli.json that packcli wrote (not merely a file of that name)."""
    run = _read_json(out / MARKER).get("run")
    return isinstance(run, dict) and "packcli_version" in run


def _only_starting(out: Path) -> bool:
    """True when ``out`` holds nothing but what a run starting this instant makes before its
    marker is in place (the lock file, an empty work folder or its marker's temp file), so
    concurrent tokenize tasks on a new folder do not refuse each other."""
    for entry in out.iterdir():
        if entry.name == OUT_LOCK:
            continue
        if (
            entry.name == ".packcli"
            and entry.is_dir()
            and all(f.name.startswith(f".{WORK_MARKER}.tmp-") for f in entry.iterdir())
        ):
            continue
        return False
    return True


def check_output_folder(out: Path, overwrite: bool, work: Path | None = None) -> None:
    """Refuse to write into a non-empty folder that is not a packcli output.

    Ours means packcli's own marks: a packcli.json it wrote, or a work folder marker (inside
    ``out``, or the ``--work-dir`` one naming ``out``). A folder that merely has a ``data/``
    subfolder is not ours: packcli would replace its README.md and delete its Parquet files.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if not out.exists() or overwrite or _only_starting(out):
        return
    if _is_output(out) or _is_work_folder(out / ".packcli", None):
        return
    if work is not None and _is_work_folder(work, out):
        return
    raise ConfigError(
        f"output folder {out} is not empty and is not a packcli output (no packcli.json or "
        "work folder marker of packcli); choose another --out or pass --overwrite"
    )


def check_output(cfg: RunConfig, overwrite: bool = False) -> None:
    """``check_output_folder`` for ``cfg``'s output: the local folder, and for a remote
    ``--out`` also the prefix on the store (foreign files there are refused alike)."""
    check_output_folder(cfg.out_path, overwrite, cfg.work_path)
    if cfg.remote_out:
        check_remote_output(cfg.remote_out, overwrite)
    if cfg.remote_work:
        check_remote_work(cfg.remote_work, _work_marker(cfg), WORK_MARKER, overwrite)


def claim_output(cfg: RunConfig) -> None:
    """Create the output and work folders and mark the work folder as packcli's, naming its
    output (idempotent: every task of a stage writes the same bytes)."""
    out = _require_out(cfg)
    out.mkdir(parents=True, exist_ok=True)
    work = cfg.work_path
    work.mkdir(parents=True, exist_ok=True)
    marker = _work_marker(cfg)
    if _read_json(work / WORK_MARKER) != marker:
        atomic_write_json(work / WORK_MARKER, marker)
    store = work_store(cfg)
    if isinstance(store, WorkStore):
        store.claim(marker, WORK_MARKER)


def _work_marker(cfg: RunConfig) -> dict[str, Any]:
    """The work folder's marker: it names the output it was made for (a URL work folder's,
    the output's redacted URL)."""
    out = redact(cfg.out) if cfg.remote_work else str(cfg.out_path.resolve())
    return {"packcli_work": 1, "out": out}


def _uncomplete(cfg: RunConfig) -> None:
    """Remove the completion marker just before this run changes something it vouches for
    (tokenized shards, the shard index, a Parquet file): a run that fails validation, or that
    reuses everything, leaves a finished output finished. Write tasks on a URL work folder
    put Parquet files straight under the remote output, so its marker goes too."""
    (cfg.out_path / MARKER).unlink(missing_ok=True)
    work_store(cfg).uncomplete()


def _require_out(cfg: RunConfig) -> Path:
    if not cfg.out:
        raise ConfigError("no output folder given: pass --out OUT")
    return cfg.out_path


# --------------------------------------------------------------------------- tokenize


def _file_key(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class _Tokenizing:
    """What the tokenize stage's result depends on, resolved once per task."""

    loaded: LoadedTokenizer
    eos: int | None
    bos: int | None
    settings: dict[str, Any]  # fingerprinted
    chat: Any = None  # ChatEncoder, or PreferenceEncoder for --format preference

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


def _resolve_tokenizing(cfg: RunConfig) -> _Tokenizing:
    loaded = load_tokenizer(cfg.tokenize.tokenizer)
    if not cfg.chat.is_chat:  # a chat template's markers must stay special tokens
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
    }
    if not cfg.chat.is_chat:
        settings["special_in_text"] = cfg.tokenize.special_in_text
    chat = None
    if cfg.chat.is_preference:
        chat = _preference_encoder(cfg, loaded, bos, eos, settings)
    elif cfg.chat.is_chat:
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
    return _Tokenizing(loaded, eos, bos, settings, chat)


def _preference_encoder(
    cfg: RunConfig, loaded: LoadedTokenizer, bos: int | None, eos: int | None, settings: dict
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

    paths: list[Path | str]  # a URL is a string (packcli/fs.py)
    tok: _Tokenizing
    early: Any = None  # a fast backend already loading (backends.preload)


def prepare_tokenize(cfg: RunConfig) -> Prepared:
    """Resolve everything a user can get wrong (input paths, the tokenizer, EOS/BOS, the
    chat template) before any file is touched: a failed rerun must not un-complete or
    delete a finished output."""
    _require_out(cfg)
    if cfg.tokenize.num_proc:
        # The tokenizers' Rust thread pools read these when they first start in the process
        # (HF and gigatoken: rayon's global pool; fastokens: its own BPE pool).
        os.environ["RAYON_NUM_THREADS"] = str(cfg.tokenize.num_proc)
        os.environ["FASTOKENS_BPE_THREADS"] = str(cfg.tokenize.num_proc)
    # Never read back what packcli writes (rejected.jsonl, work files) as input.
    fences: tuple[Path | str, ...] = (cfg.out_path, cfg.work_path)
    if cfg.remote_out:
        fences += (cfg.remote_out,)
    paths = resolve_inputs(cfg.read.inputs, exclude=fences, input_format=cfg.read.input_format)
    formats = [file_format(p, cfg.read.input_format) or "jsonl" for p in paths]
    if any(f != "jsonl" for f in formats):  # a column missing from a file: refused up front
        from packcli.read.columnar import check_columns

        check_columns(paths, formats, *input_column(cfg))
    early = None
    if not (cfg.work_path / "tokens" / SUCCESS).is_file():
        # A fresh (or interrupted) tokenize stage: the fast backend will be wanted, so it
        # builds its tables while HF loads (a finished stage is reused and needs neither).
        early = preload(
            cfg.tokenize.backend,
            local_tokenizer_file(cfg.tokenize.tokenizer),
            sum(input_size(p) for p in paths),
        )
    return Prepared(paths, _resolve_tokenizing(cfg), early)


def _indexed_units(folder: Path, store: LocalWork) -> set[str]:
    """Keys of the units whose shards the stage's index lists (all units when it is damaged:
    then assume a finished output depends on every one)."""
    try:
        return {m["file"].split("/")[1] for m in _read_json(folder / SUCCESS).get("shards", [])}
    except (KeyError, TypeError, AttributeError, IndexError):
        return store.unit_keys()


@in_mirror
def tokenize_task(
    cfg: RunConfig,
    *,
    task_index: int = 0,
    num_tasks: int = 1,
    quiet: bool = False,
    prepared: Prepared | None = None,
) -> bool:
    """Tokenize this task's share of the input files; returns True if all were reused.

    Every task writes the same ``stage.json`` (same inputs and settings give the same bytes),
    so tasks need no coordination; the plan stage checks that every file is complete.
    ``prepared``: the stage already resolved in this process (``pack`` validates first).
    """
    _require_out(cfg)
    prepared = prepared or prepare_tokenize(cfg)
    tok = prepared.tok
    stage_fp = _fingerprint(tok.settings)
    files, units = _input_units(
        prepared.paths, cfg.read.split_bytes, stage_fp, cfg.read.input_format
    )
    claim_output(cfg)
    store = work_store(cfg)
    folder = cfg.work_path / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        folder / "stage.json",
        {
            "fingerprint": _fingerprint({"stage": stage_fp, "units": units}),
            "settings": tok.settings,
            "tokenizer": tok.record,
            "config": {
                "read": _recorded_read(cfg.read),
                "tokenize": cfg.to_dict()["tokenize"],
                "chat": dataclasses.asdict(cfg.chat),
            },
            "files": files,
            "units": units,
        },
    )
    store.push("tokens/stage.json")
    store.pull(f"tokens/{SUCCESS}", "tokens/backend.json")
    task_of = assign_by_size([u["size"] for u in units], num_tasks)
    mine = [k for k in range(len(units)) if task_of[k] == task_index]
    done = store.done_units(units[k] for k in mine)
    pending = {k for k in mine if units[k]["key"] not in done}
    stale: list[str] = []
    if num_tasks == 1:  # the only task: shards of units no longer in the input go at the end
        stale = sorted(store.unit_keys() - {u["key"] for u in units})
    # A finished output stays finished unless this run changes the shards it was checked
    # against (those the index lists): a new unit's shards go to a folder of their own.
    indexed = _indexed_units(folder, store)
    if any(units[k]["key"] in indexed for k in pending):
        _uncomplete(cfg)
        (folder / SUCCESS).unlink(missing_ok=True)  # collect_tokens rebuilds it
        store.remove(f"tokens/{SUCCESS}")
    encoder: Any = tok.chat
    if pending or not (folder / "backend.json").is_file():
        # Building and checking the fast path costs seconds; skip it when nothing is left.
        encoder, backend = _choose_backend(cfg, tok, units, prepared.early)
        atomic_write_json(folder / "backend.json", backend)
        store.push("tokens/backend.json")
    total = sum(units[k]["size"] for k in mine)
    renderers = _render_pool(cfg, encoder, sum(units[k]["size"] for k in pending))
    with (
        renderers or contextlib.nullcontext(),
        _bar(quiet, total=total, unit="B", unit_scale=True, desc="tokenize") as bar,
    ):
        progress = _TokenizeProgress(bar)
        for k in mine:
            if k in pending:
                _tokenize_unit(cfg, units[k], encoder, tok, progress, renderers)
                store.unit_finished(units[k]["key"])
                release_free_memory()
            else:
                progress.update(units[k]["size"], 0)
    if any(name in indexed for name in stale):
        _uncomplete(cfg)
    for gone in stale:  # only now that this run's shards are all there
        store.drop_unit(gone)
    if not pending:
        log.info("reusing tokenized shards for all %d input unit(s) of this task", len(mine))
    return not pending


def _render_pool(cfg: RunConfig, encoder: Any, pending_bytes: int) -> Any:
    """Worker processes for chat templates, when there is enough chat to render to repay
    starting them (packcli/render_pool.py) and more than one core to render on."""
    from packcli.chat.render_pool import MIN_POOL_BYTES

    if not isinstance(encoder, ChatEncoder):  # text, or preference pairs
        return None
    if pending_bytes < MIN_POOL_BYTES or cfg.tokenize.threads < 2:
        return None
    return encoder.render_pool(cfg.tokenize.threads)


@functools.cache
def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


def release_free_memory() -> None:
    """Hand memory freed by a finished unit or shard back to the OS (glibc's ``malloc_trim``).

    Each unit's reader and tokenizer threads allocate from their own glibc arenas, which keep
    freed memory; without this, peak RSS crept up by ~35 MB per unit (measured: 310 MB
    tokenized as 1 unit peaked at 481 MB, as 3 units at 589 MB)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# Files smaller than this share a unit of tokenize work with their neighbours: a unit has a
# fixed cost (a folder, a shard, three records with an fsync each, two threads), which made
# 2,000 one-line files take 30 s. Groups end where a file's path says so (below), so adding
# or removing a file regroups only its own neighbourhood, and at GROUP_CAP bytes.
GROUP_BYTES = 8 << 20
GROUP_CAP = 4 * GROUP_BYTES


def _starts_group(path: str, size: int) -> bool:
    """Whether a small file begins a new group: with probability size / GROUP_BYTES (so
    groups average about GROUP_BYTES), decided by the file alone, as content-defined
    chunking does, so one file more or less moves no boundary elsewhere."""
    draw = int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big")
    return draw * GROUP_BYTES < size * 2**64


def _group_unit(members: list[tuple[int, dict[str, Any]]], stage_fp: str) -> dict[str, Any]:
    """One unit of several whole small files (``paths``); its documents carry each file's
    own index and line numbers, so the output is the same as one unit per file."""
    paths = [entry["path"] for _, entry in members]
    unit: dict[str, Any] = {
        "file_index": members[0][0],
        "path": paths[0],
        "paths": paths,
        "span": None,
        "size": sum(entry["size"] for _, entry in members),
        "key": _file_key("\n".join(paths)),
    }
    files = [entry for _, entry in members]
    if "format" in files[0]:  # every member has the same format
        unit["format"] = files[0]["format"]
    unit["fingerprint"] = _fingerprint({"stage": stage_fp, "files": files, "key": unit["key"]})
    return unit


def _unit_paths(unit: dict[str, Any]) -> list[str]:
    return unit.get("paths") or [unit["path"]]


def _input_units(
    paths: list[Path | str], split_bytes: int, stage_fp: str, input_format: str = "auto"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input files, and the units of tokenize work: each file, each byte span of an
    uncompressed file larger than ``split_bytes`` (so one huge file still spreads over
    tasks), each range of row groups of such a Parquet/Arrow file, or a group of
    consecutive small files of one format. Units are in input order; document ids and line
    numbers are assigned from their counts later, so how files are split or grouped never
    changes the output. A jsonl file's records are as they always were (so its shards are
    reused across versions); others add their ``format``."""
    files: list[dict[str, Any]] = []
    units: list[dict[str, Any]] = []
    group: list[tuple[int, dict[str, Any]]] = []
    group_bytes = 0

    def close_group() -> None:
        nonlocal group_bytes
        if len(group) > 1:
            units.append(_group_unit(group, stage_fp))
        elif group:
            units.extend(_file_units(*group[0], None, stage_fp))
        group.clear()
        group_bytes = 0

    for index, p in enumerate(paths):
        fmt = file_format(p, input_format) or "jsonl"
        path = str(_identity(p))
        # Local: size + mtime_ns; a URL: size + the store's version fields (packcli/fs.py).
        entry: dict[str, Any] = {"path": path, **input_entry(p)}
        size = entry["size"]
        if fmt != "jsonl":
            entry["format"] = fmt
        files.append(entry)
        if fmt == "jsonl":
            spans = split_spans(size, split_bytes) if splittable(p) else None
        else:
            from packcli.read.columnar import split_groups

            spans = split_groups(p, fmt, size, split_bytes)  # type: ignore[arg-type]
        if spans is None and size < GROUP_BYTES:
            if group and (
                _starts_group(path, size)
                or group_bytes + size > GROUP_CAP
                or group[0][1].get("format") != entry.get("format")
            ):
                close_group()
            group.append((index, entry))
            group_bytes += size
            continue
        close_group()
        units.extend(_file_units(index, entry, spans, stage_fp))
    close_group()
    return files, units


def _identity(p: Path | str) -> Path | str:
    """The path recorded for an input: resolved (one file, one identity), unless resolving
    loses what its name says it is: a content-addressed store (the Hugging Face cache's
    ``blobs/<sha256>``, which a Hub dataset's files link to) keeps the link's name. A URL
    is recorded as listed (no credentials: they live in the filesystem instance)."""
    if isinstance(p, str):
        return p
    resolved = p.resolve()
    return resolved if suffix_format(resolved) == suffix_format(p) else Path(os.path.abspath(p))


def _file_units(
    index: int, entry: dict[str, Any], spans: list[Any] | None, stage_fp: str
) -> list[dict[str, Any]]:
    """The units of one file: the whole file, each of its byte spans (jsonl) or each of
    its row-group ranges (Parquet/Arrow: ``((start, stop), bytes)``)."""
    units = []
    path = entry["path"]
    if "format" in entry:
        for groups, nbytes in spans or [(None, entry["size"])]:
            unit: dict[str, Any] = {
                "file_index": index,
                "path": path,
                "span": None,
                "format": entry["format"],
                "row_groups": list(groups) if groups else None,
                "size": nbytes,
                "key": _file_key(path if groups is None else f"{path}#rg{groups[0]}-{groups[1]}"),
            }
            keyed = {k: v for k, v in unit.items() if k != "file_index"}
            unit["fingerprint"] = _fingerprint({"stage": stage_fp, **entry, **keyed})
            units.append(unit)
        return units
    for span in spans or [None]:
        unit = {
            "file_index": index,
            "path": path,
            "span": list(span) if span else None,
            "size": span[1] - span[0] if span else entry["size"],
            "key": _file_key(path if span is None else f"{path}#{span[0]}-{span[1]}"),
        }
        # Not the file's index: adding a file to the input must not redo the others.
        keyed = {k: v for k, v in unit.items() if k != "file_index"}
        unit["fingerprint"] = _fingerprint({"stage": stage_fp, **entry, **keyed})
        units.append(unit)
    return units


SAMPLE_DOCS = 256


def _choose_backend(
    cfg: RunConfig, tok: _Tokenizing, units: list[dict[str, Any]], early: Any = None
) -> tuple[Any, dict[str, Any]]:
    """HF, or a fast backend after it reproduced HF's ids on a sample (packcli/backends.py).

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
    return _chat_offsets(cfg, tok, FastOffsets(encoder, table), sample(), record)


def _chat_offsets(
    cfg: RunConfig,
    tok: _Tokenizing,
    fast: FastOffsets,
    sample: list[str],
    record: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """The chat encoder on ``fast`` once its offsets equal HF's on the sample and the
    adversarial texts, else on HF (``auto``) or a ``ConfigError`` (a named backend)."""
    assert tok.chat is not None
    check = check_offsets(fast, tok.loaded.tokenizer, [*bounded_sample(sample), *ADVERSARIAL])
    record["chat_offsets"] = check
    if check["mismatch"] is None:
        return tok.chat.using(fast), record
    if cfg.tokenize.backend != "auto":
        raise ConfigError(
            f"tokenizer backend {fast.name}: {check['mismatch']}; use backend auto or hf"
        )
    log.warning("chat on HF tokenizers, not %s: %s", fast.name, check["mismatch"])
    record.update(backend="hf", fallback_reason=f"{fast.name}: {check['mismatch']}")
    return tok.chat, record


class _TokenizeProgress:
    """Bytes on the bar, tokens and tokens/s in its postfix, across the task's files."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar
        self.tokens = 0
        self.new_shards = 0

    def update(self, nbytes: int, tokens: int) -> None:
        self.bar.update(nbytes)
        self.tokens += tokens
        elapsed = max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.set_postfix_str(
            f"{self.tokens:,} tokens, {self.tokens / elapsed:,.0f} tok/s", refresh=False
        )


def _span(unit: dict[str, Any]) -> tuple[int, int] | None:
    return tuple(unit["span"]) if unit["span"] else None  # type: ignore[return-value]


def input_column(cfg: RunConfig) -> tuple[str, str]:
    """The field (Parquet/Arrow: column) documents are read from, and its option."""
    if cfg.chat.is_chat:
        return cfg.chat.messages_field, "--messages-field"
    return cfg.read.text_field, "--text-field"


def read_unit(
    cfg: RunConfig,
    unit: dict[str, Any],
    batch_size: int,
    stats: ReadStats,
    rejects: RejectSink | None = None,
    *,
    sample: bool = False,
) -> Iterator[DocBatch]:
    """The documents of one unit of tokenize work, by its format. ``sample``: a quick look
    at the first documents (a compressed jsonl stream is not verified first)."""
    paths = [as_input(p) for p in _unit_paths(unit)]
    fmt = unit.get("format", "jsonl")
    if fmt == "jsonl":
        return iter_batches(
            paths,
            cfg.read.text_field,
            batch_size,
            stats,
            on_bad_line=cfg.read.on_bad_line,
            rejects=rejects,
            validate=record_validator(cfg),  # chat: the sample is rendered dialogues
            span=_span(unit),
            batch_bytes=0 if sample else cfg.read.batch_bytes,
            verify_streams=not sample,
        )
    from packcli.read.columnar import iter_columnar

    column, option = input_column(cfg)
    groups = unit.get("row_groups")
    return iter_columnar(
        paths,
        fmt,
        column,
        batch_size,
        stats,
        on_bad_line=cfg.read.on_bad_line,
        rejects=rejects,
        validate=record_validator(cfg),
        groups=tuple(groups) if groups else None,
        batch_bytes=0 if sample else cfg.read.batch_bytes,
        option=option,
    )


def record_validator(cfg: RunConfig) -> Any:
    """What ``iter_batches`` checks each line with: the text field (None) or, for chat, the
    messages (the chat module loads only then)."""
    if cfg.chat.is_preference:
        from packcli.chat.validate import validate_pair

        return validate_pair
    if not cfg.chat.is_chat:
        return None
    from packcli.chat import validate_messages

    return functools.partial(validate_messages, field=cfg.chat.messages_field)


def _tokenize_unit(
    cfg: RunConfig,
    unit: dict[str, Any],
    encoder: Any,
    tok: _Tokenizing,
    progress: _TokenizeProgress,
    renderers: Any = None,
) -> None:
    """Tokenize one input unit (a file or a byte span of one) that is not complete yet,
    resuming after its finished shards. ``renderers``: chat rendering workers, or None."""
    folder = cfg.work_path / "tokens" / "files" / unit["key"]
    success = folder / SUCCESS
    done_shards = _resumable_shards(folder, unit["fingerprint"])
    resume_doc = done_shards[-1]["last_doc_index"] + 1 if done_shards else 0
    if done_shards:
        log.info(
            "resuming tokenization of %s after %d completed shard(s)",
            unit["path"],
            len(done_shards),
        )
    stats = ReadStats()
    chat_stats = ChatStats()
    preference = encoder if cfg.chat.is_preference else None  # with its backend
    pref_stats: Any = None
    if preference is not None:
        from packcli.chat.preference import PreferenceStats, tokenize_preference_batches

        pref_stats = PreferenceStats()
    times = StageTimes()
    specials: Counter[str] = Counter()
    done_bytes = 0
    path = unit["path"]
    skip = cfg.read.on_bad_line == "skip"
    schema = CHAT_SHARD_SCHEMA if isinstance(encoder, ChatEncoder) else SHARD_SCHEMA
    if preference is not None:
        schema = PREFERENCE_SHARD_SCHEMA
    with (
        RejectSink(folder / REJECTED) as sink,
        ShardWriter(folder, cfg.tokenize.shard_tokens, done_shards, schema) as writer,
    ):
        source = read_unit(cfg, unit, cfg.read.batch_size, stats, sink)
        batches = prefetch(_skip_documents(source, resume_doc, unit["file_index"]), times=times)

        def template_failed(batch: DocBatch, index: int, reason: str) -> None:
            line = int(batch.line[index])
            doc_path = _unit_paths(unit)[int(batch.file_index[index]) - unit["file_index"]]
            if not skip:
                if "format" in unit:  # a row of a Parquet/Arrow file (range)
                    row = line + stats.rows_before
                    raise InputError(f"{doc_path}: row {row}: {reason}")
                line += count_newlines(doc_path, stats.first_line_byte)  # a file line
                raise InputError(f"{doc_path}:{line}: {reason}")
            stats.rejected["template_error"] = stats.rejected.get("template_error", 0) + 1
            record = batch.texts[index]
            if preference is None:
                record = {cfg.chat.messages_field: record}
            sink.add(doc_path, line, "template_error", orjson.dumps(record), reason)

        if preference is not None:
            tokenized = tokenize_preference_batches(
                batches, preference, pref_stats, template_failed, times
            )
        elif isinstance(encoder, ChatEncoder):
            tokenized = tokenize_chat_batches(
                batches, encoder, chat_stats, template_failed, times, renderers
            )
        else:
            tokenized = tokenize_batches(
                batches,
                encoder,
                bos=tok.bos,
                eos=tok.eos,
                times=times,
                count_specials=(SpecialStringCounter.of(tok.loaded.tokenizer), specials),
            )
        for batch, record_batch in tokenized:
            shards_before = len(writer.manifests)
            writer.add(record_batch)
            if len(writer.manifests) > shards_before:
                release_free_memory()  # the shard's combined columns were just freed
                progress.new_shards += 1
                crash_point(f"tokenize:{progress.new_shards}")
            tokens = int(to_numpy(record_batch.column("length")).sum())
            progress.update(batch.progress_bytes - done_bytes, tokens)
            done_bytes = batch.progress_bytes
    times.write += writer.flush_seconds
    progress.update(unit["size"] - done_bytes, 0)
    log.info(
        "tokenized %s%s: busy seconds %s",
        path,
        f" bytes {unit['span']}" if unit["span"] else "",
        ", ".join(f"{k} {v:.2f}" for k, v in dataclasses.asdict(times).items()),
    )
    atomic_write_json(
        success,
        {
            "fingerprint": unit["fingerprint"],
            "path": path,
            "span": unit["span"],
            # The shards' file_index column is this plus the file's place in the unit.
            "file_index": unit["file_index"],
            "num_docs": sum(m["num_docs"] for m in writer.manifests),
            "num_tokens": sum(m["num_tokens"] for m in writer.manifests),
            "shards": writer.manifests,
            "read_stats": {
                "documents": stats.documents,
                "blank_lines": stats.blank_lines,
                "bytes_read": stats.bytes_read,
                "lines": stats.lines,
                "rejected": dict(sorted(stats.rejected.items())),
                "corrupt_streams": stats.corrupt_streams,
            },
            "chat": dataclasses.asdict(chat_stats) if isinstance(encoder, ChatEncoder) else None,
            **({"preference": dataclasses.asdict(pref_stats)} if pref_stats is not None else {}),
            "special_strings": dict(sorted(specials.items())),
            "times": {k: round(v, 3) for k, v in dataclasses.asdict(times).items()},
        },
    )


def _resumable_shards(folder: Path, fingerprint: str) -> list[dict[str, Any]]:
    """Completed shards of an interrupted run with the same fingerprint; clears the rest.

    A shard counts as complete when its manifest exists: the shard is renamed into place
    first, its manifest second, both atomically. Anything else (temp files, a shard without a
    manifest, shards of another fingerprint, a damaged shard and all after it) is removed.
    """
    stamp = folder / "fingerprint.json"
    if _read_json(stamp).get("fingerprint") != fingerprint:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        atomic_write_json(stamp, {"fingerprint": fingerprint})
        return []
    manifests = []
    while (m := _read_json(folder / manifest_name(len(manifests)))) and shard_intact(folder, m):
        manifests.append(m)
    keep = {stamp.name} | {m["file"] for m in manifests}
    keep |= {manifest_name(i) for i in range(len(manifests))}
    for f in folder.iterdir():
        if f.name not in keep:
            f.unlink()
    return manifests


def _skip_documents(batches: Iterator[DocBatch], start: int, file_index: int) -> Iterator[DocBatch]:
    """Drop documents before ``start`` (already tokenized by an interrupted run) and stamp
    the global file index (the unit's first file's, plus the file's place in a group of small
    files). Re-reading is ~100x cheaper than tokenizing and keeps stats exact."""
    for batch in batches:
        n = len(batch.texts)
        if batch.doc_id_start + n <= start:
            continue
        cut = max(0, start - batch.doc_id_start)
        yield DocBatch(
            texts=batch.texts[cut:],
            doc_id_start=batch.doc_id_start + cut,
            file_index=(batch.file_index[cut:] + file_index).astype(np.int32),
            line=batch.line[cut:],
            progress_bytes=batch.progress_bytes,
        )


def collect_tokens(cfg: RunConfig) -> TokenShards:
    """Check that every input file is tokenized and write the global shard index."""
    folder = cfg.work_path / "tokens"
    store = work_store(cfg)
    store.pull_records("tokens")
    stage = _read_json(folder / "stage.json")
    if not stage:
        where = redact(f"{cfg.remote_work}/tokens") if cfg.remote_work else folder
        raise PackcliError(f"no tokenize stage in {where}: run `packcli tokenize` first")
    index_path = folder / SUCCESS
    if _read_json(index_path).get("fingerprint") == stage["fingerprint"]:
        return TokenShards(folder, store)
    shards: list[dict[str, Any]] = []
    missing = []
    totals = {"documents": 0, "blank_lines": 0, "bytes_read": 0}
    rejected: dict[str, int] = {}
    corrupt_streams: list[dict[str, Any]] = []
    chat: dict[str, int] | None = None
    preference: dict[str, int] | None = None
    specials: Counter[str] = Counter()
    next_doc = 0
    lines_before = [0] * len(stage["files"])  # per file: lines of its units read so far
    times = StageTimes()
    units = []
    for unit in stage["units"]:
        done = _read_json(folder / "files" / unit["key"] / SUCCESS)
        if done.get("fingerprint") != unit["fingerprint"]:
            more = len(_unit_paths(unit)) - 1
            where = f" bytes {unit['span']}" if unit["span"] else ""
            if unit.get("row_groups"):
                where = f" row groups {unit['row_groups']}"
            missing.append(unit["path"] + where + (f" and {more} more file(s)" if more else ""))
            continue
        first_line = lines_before[unit["file_index"]]
        lines_before[unit["file_index"]] += done["read_stats"]["lines"]
        units.append({"key": unit["key"], "first_line": first_line})
        for m in done["shards"]:
            shards.append(
                {
                    **m,
                    "file": f"files/{unit['key']}/{m['file']}",
                    "first_doc_id": next_doc + m["first_doc_index"],
                    "first_line": first_line,  # the shard's line column counts from its unit
                    "file_index": unit["file_index"],  # in this run's input list
                    # The unit's first file index when tokenized (the column's base).
                    "tokenized_file_index": done.get("file_index"),
                }
            )
        next_doc += done["num_docs"]
        for key in totals:
            totals[key] += done["read_stats"][key]
        for reason, n in done["read_stats"].get("rejected", {}).items():
            rejected[reason] = rejected.get(reason, 0) + n
        corrupt_streams += done["read_stats"].get("corrupt_streams", [])
        if done.get("chat") is not None:
            chat = {k: (chat or {}).get(k, 0) + v for k, v in done["chat"].items()}
        if done.get("preference") is not None:
            preference = {
                k: (preference or {}).get(k, 0) + v for k, v in done["preference"].items()
            }
        specials.update(done.get("special_strings", {}))
        times.add(done.get("times", {}))
    if missing:
        raise PackcliError(
            f"tokenize task(s) not finished: {len(missing)} of {len(stage['units'])} input "
            f"unit(s) have no complete shards, e.g. {missing[0]}"
        )
    _uncomplete(cfg)  # the index a finished output was checked against changes
    atomic_write_json(
        index_path,
        {
            "fingerprint": stage["fingerprint"],
            "files": stage["files"],
            "shards": shards,
            "read_stats": {
                "files": len(stage["files"]),
                **totals,
                "rejected": dict(sorted(rejected.items())),
                "corrupt_streams": corrupt_streams,
            },
            "chat": chat,
            # Only for preference outputs, so other indexes (and reports) stay as they were.
            **({"preference": preference} if preference is not None else {}),
            "special_strings": dict(sorted(specials.items())),
            "units": units,
            # Busy seconds of the tokenize stage's parts, summed over units (when they ran).
            "times": {k: round(v, 3) for k, v in dataclasses.asdict(times).items()},
            "tokens": sum(m["num_tokens"] for m in shards),
            "tokenizer": stage["tokenizer"],
            "backend": _read_json(folder / "backend.json"),
        },
    )
    store.push(f"tokens/{SUCCESS}")
    return TokenShards(folder, store)


# --------------------------------------------------------------------------- plan


def _plan_fingerprint(plan_cfg: PlanConfig, tokens_fingerprint: str) -> str:
    return _fingerprint(
        {"tokens": tokens_fingerprint, "plan": dataclasses.asdict(plan_cfg), "v": __version__}
    )


@in_mirror
def plan_stage(cfg: RunConfig, *, quiet: bool = False) -> tuple[Plan, TokenShards]:
    """Global plan over the lengths of all tokenized documents; saved for the write tasks.

    The finished output (if any) stays complete: its Parquet files do not change here."""
    _require_out(cfg)
    shards = collect_tokens(cfg)
    lengths = shards.column("length").astype(np.int64)
    if lengths.size == 0:
        raise InputError(
            f"no documents in {len(shards.success['files'])} input file(s) "
            f"({shards.success['read_stats']['blank_lines']} blank lines); nothing to pack"
        )
    with _bar(quiet, total=1, desc="plan") as bar:
        plan = plan_two_tier(lengths, cfg.plan)
        bar.update(1)
    _save_plan(cfg, plan, shards.success["fingerprint"])
    work_store(cfg).push("plan.npz", "plan.json")
    crash_point("plan")
    return plan, shards


def _save_plan(cfg: RunConfig, plan: Plan, tokens_fingerprint: str) -> None:
    path = cfg.work_path / "plan.npz"
    tmp = path.with_name(".plan.tmp.npz")
    arrays = {"piece_doc": plan.piece_doc, "piece_start": plan.piece_start}
    arrays["piece_len"] = plan.piece_len
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        arrays[f"{name}_row_offsets"] = layout.row_offsets
        arrays[f"{name}_row_pieces"] = layout.row_pieces
        arrays[f"{name}_row_tokens"] = layout.row_tokens
    np.savez(tmp, **arrays)
    tmp.replace(path)
    # What the Parquet files depend on is the plan itself, not only the settings that made it
    # (another packcli build may plan the same settings differently): write records carry
    # this digest of the arrays (the npz bytes hold zip timestamps, so not the file's hash).
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arrays[name]).view(np.uint8).data)
    atomic_write_json(
        cfg.work_path / "plan.json",
        {
            "content_sha256": digest.hexdigest(),
            "fingerprint": _plan_fingerprint(cfg.plan, tokens_fingerprint),
            "tokens_fingerprint": tokens_fingerprint,
            "stats": plan.stats,
            "plan": dataclasses.asdict(cfg.plan),
        },
    )


def load_plan(work: Path, shards: TokenShards) -> tuple[Plan, PlanConfig]:
    """The saved plan and the settings it was made with (write tasks need no plan flags)."""
    meta = _read_json(work / "plan.json")
    if not meta or meta.get("tokens_fingerprint") != shards.success["fingerprint"]:
        raise PackcliError(
            f"no plan for the current tokenized shards in {work}: run `packcli plan` first"
        )
    try:
        plan_cfg = PlanConfig(**meta["plan"])
        with np.load(work / "plan.npz") as z:
            layouts = {
                name: RowLayout(
                    plan_cfg.short_len if name == "short" else plan_cfg.long_len,
                    z[f"{name}_row_offsets"],
                    z[f"{name}_row_pieces"],
                    z[f"{name}_row_tokens"],
                )
                for name in CONFIG_NAMES
            }
            plan = Plan(
                z["piece_doc"], z["piece_start"], z["piece_len"], stats=meta["stats"], **layouts
            )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{work / 'plan.npz'}: damaged or missing plan ({exc}); run `packcli plan` again"
        ) from exc
    return plan, plan_cfg


def stored_config(cfg: RunConfig) -> RunConfig:
    """The run config as the stages recorded it: tokenize settings from the tokenize stage,
    plan settings from the plan stage, write settings from the write tasks. ``finalize``
    reports this, so the output says how it was made whichever commands made it."""
    work = cfg.work_path
    stage = _read_json(work / "tokens" / "stage.json")
    plan = _read_json(work / "plan.json")
    write = _read_json(work / "write" / "config.json")
    values = {
        "read": stage.get("config", {}).get("read", dataclasses.asdict(cfg.read)),
        "tokenize": stage.get("config", {}).get("tokenize", dataclasses.asdict(cfg.tokenize)),
        "chat": stage.get("config", {}).get("chat", dataclasses.asdict(cfg.chat)),
        "plan": plan.get("plan", dataclasses.asdict(cfg.plan)),
        "write": write.get("write", dataclasses.asdict(cfg.write)),
    }
    return dataclasses.replace(
        cfg,
        read=ReadConfig(**values["read"]),
        tokenize=TokenizeConfig(**values["tokenize"]),
        plan=PlanConfig(**values["plan"]),
        write=WriteConfig(**values["write"]),
        chat=ChatConfig(**values["chat"]),
    )


# --------------------------------------------------------------------------- write


def _write_fingerprint(cfg: RunConfig, shards: TokenShards) -> str:
    return _fingerprint(
        {
            "plan": _plan_fingerprint(cfg.plan, shards.success["fingerprint"]),
            "plan_content": _read_json(cfg.work_path / "plan.json").get("content_sha256"),
            "write": dataclasses.asdict(cfg.write),
        }
    )


def _output_files(cfg: RunConfig, plan: Plan) -> list[tuple[str, int, int, int, int]]:
    """Every output file as (config, index, count, first row, end row), in a fixed order."""
    jobs = []
    for name in CONFIG_NAMES:
        ranges = file_ranges(getattr(plan, name), cfg.write.shard_tokens)
        jobs += [(name, i, len(ranges), r0, r1) for i, (r0, r1) in enumerate(ranges)]
    return jobs


@in_mirror
def write_task(
    cfg: RunConfig,
    plan: Plan,
    shards: TokenShards,
    *,
    task_index: int = 0,
    num_tasks: int = 1,
    quiet: bool = False,
) -> None:
    """Write this task's share of the output files (round robin over all files)."""
    out = _require_out(cfg)
    store = work_store(cfg)
    store.pull("plan.json")
    store.pull_records("write")
    fingerprint = _write_fingerprint(cfg, shards)
    records = cfg.work_path / "write"
    records.mkdir(parents=True, exist_ok=True)
    atomic_write_json(records / "config.json", {"write": dataclasses.asdict(cfg.write)})
    store.push("write/config.json")
    jobs = _output_files(cfg, plan)[task_index::num_tasks]
    # Where the Parquet files are: this disk, or (URL work folder) the remote output.
    placed = store.out_listing("data") if isinstance(store, WorkStore) else None

    def written(job: tuple[str, int, int, int, int]) -> bool:
        name, i, count = job[:3]
        final = out / "data" / name / f"train-{i:05d}-of-{count:05d}.parquet"
        record = _read_json(records / f"{name}-{i:05d}.json")
        if record.get("fingerprint") != fingerprint:
            return False
        if placed is not None:
            return placed.get(f"data/{name}/{final.name}") == record.get("bytes")
        return final.is_file()

    if not all(written(job) for job in jobs):
        _uncomplete(cfg)  # a Parquet file the finished output lists is about to change
    total = sum(int(getattr(plan, j[0]).row_tokens[j[3] : j[4]].sum()) for j in jobs)
    source = TokenSource.of(shards)
    with _bar(quiet, total=total, unit="tok", unit_scale=True, desc="write") as bar:

        def write_one(job: tuple[str, int, int, int, int]) -> None:
            name, i, count, r0, r1 = job
            layout = getattr(plan, name)
            final = out / "data" / name / f"train-{i:05d}-of-{count:05d}.parquet"
            record_path = records / f"{name}-{i:05d}.json"
            if written(job):
                bar.update(int(layout.row_tokens[r0:r1].sum()))
                return
            record_path.unlink(missing_ok=True)
            write_config_file(plan, layout, source, final, cfg.write, r0, r1, bar.update)
            record = {
                "fingerprint": fingerprint,
                "file": final.name,
                "rows": r1 - r0,
                "tokens": int(layout.row_tokens[r0:r1].sum()),
                "bytes": final.stat().st_size,
                "sha256": sha256_file(final),
            }
            if isinstance(store, WorkStore):  # straight to the remote output, then the record
                store.put_output(final, f"data/{name}/{final.name}")
            atomic_write_json(record_path, record)
            store.push(f"write/{record_path.name}")
            crash_point(f"write:{name}:{i}")

        # Files are independent and Parquet encoding/compression runs without the GIL, so
        # files are written side by side on the process's threads (each file's bytes do not
        # depend on which thread wrote it, or when).
        workers = max(1, min(len(jobs), cfg.tokenize.threads))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packcli-write") as pool:
            for _ in pool.map(write_one, jobs):
                pass


@in_mirror
def write_stage(
    cfg: RunConfig, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = False
) -> None:
    """``packcli write``: one write task over the saved plan, with the plan's own settings."""
    shards = collect_tokens(cfg)
    work_store(cfg).pull("plan.json", "plan.npz")
    plan, plan_cfg = load_plan(cfg.work_path, shards)
    cfg = dataclasses.replace(cfg, plan=plan_cfg)
    write_task(cfg, plan, shards, task_index=task_index, num_tasks=num_tasks, quiet=quiet)


# --------------------------------------------------------------------------- finalize


@in_mirror
def finalize_stage(
    cfg: RunConfig,
    *,
    command: str = "",
    plan: Plan | None = None,
    tokens_per_step: int = TOKENS_PER_STEP,
) -> dict:
    """Check every output file is written, remove strays, write the card and the marker.
    ``tokens_per_step``: the report's step-plan target (not a setting of the data)."""
    out = _require_out(cfg)
    store = work_store(cfg)
    store.pull_records()  # the stages' records, the plan and the quarantined lines
    shards = collect_tokens(cfg)
    if plan is None:
        plan, _ = load_plan(cfg.work_path, shards)
    cfg = stored_config(cfg)
    fingerprint = _write_fingerprint(cfg, shards)
    files: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIG_NAMES}
    missing = []
    for name, i, _, _, _ in _output_files(cfg, plan):
        record = _read_json(cfg.work_path / "write" / f"{name}-{i:05d}.json")
        if record.get("fingerprint") != fingerprint:
            missing.append(f"{name}-{i:05d}")
            continue
        files[name].append({k: v for k, v in record.items() if k != "fingerprint"})
    if missing:
        raise PackcliError(
            f"write task(s) not finished: {len(missing)} output file(s) missing, "
            f"e.g. {missing[0]}; run `packcli write` for every task first"
        )
    for name in CONFIG_NAMES:  # files of an earlier, different plan; temp files of crashes
        keep = {f["file"] for f in files[name]}
        for f in (out / "data" / name).glob("*"):
            if f.name not in keep and (f.suffix == ".parquet" or ".tmp-" in f.name):
                f.unlink()
    # Records a killed task was writing (every write task is done now, so none is live).
    for f in (cfg.work_path / "write").glob(".*.tmp-*"):
        f.unlink()
    _gather_rejects(cfg, out, shards)
    lengths = shards.column("length").astype(np.int64)
    largest = int(lengths.argmax())
    report = build_report(
        plan,
        lengths,
        short_len=cfg.plan.short_len,
        long_len=cfg.plan.long_len,
        input_stats={
            "files": len(shards.success["files"]),
            "blank_lines": shards.success["read_stats"]["blank_lines"],
            "bytes": sum(f["size"] for f in shards.success["files"]),
            "rejected_lines": sum(shards.success["read_stats"].get("rejected", {}).values()),
            "rejected": shards.success["read_stats"].get("rejected", {}),
            # Only when a file failed, so other reports (and their bytes) stay as they were.
            **(
                {"corrupt_streams": corrupt}
                if (corrupt := shards.success["read_stats"].get("corrupt_streams"))
                else {}
            ),
        },
        chat=shards.success.get("chat"),
        tokenizer=tokenizer_report(shards.success),
        largest_provenance={
            "file": (entry := shards.success["files"][shards.value("file_index", largest)])["path"],
            # A row (0-based) of a Parquet/Arrow file, a line (1-based) of a jsonl file.
            ("row" if "format" in entry else "line"): shards.value("line", largest),
        },
        preference=shards.success.get("preference"),
        tokens_per_step=tokens_per_step,
    )
    if "preference" in shards.success:
        _count_pair_segments(report, plan, shards)
    run_info = {
        "packcli_version": __version__,
        "command": command,
        "tokenizer": shards.success["tokenizer"],
        "tokenizer_backend": shards.success.get("backend", {}),
        "format": cfg.chat.format,
        "inputs": shards.success["files"],
        "tokens_fingerprint": shards.success["fingerprint"],
        # Inputs + tokenizer + every setting the Parquet bytes depend on.
        "fingerprint": fingerprint,
        "work_dir": redact(cfg.remote_work)
        if cfg.remote_work
        else _relative_to_out(cfg.work_path, out),
    }
    for stale in (out / STATS_DIR).glob("*.png"):  # plots of an earlier run; `stats` remakes them
        stale.unlink()
    crash_point("finalize")
    card = render_card(report, run_info, files, out)
    atomic_write_bytes(out / "README.md", card.encode("utf-8"))
    atomic_write_json(
        out / MARKER,
        {"config": _recorded_config(cfg), "run": run_info, "report": report, "files": files},
    )
    if cfg.remote_out:  # every file is final here: put them, packcli.json last
        placed = {
            f"data/{name}/{f['file']}": int(f["bytes"])
            for name in CONFIG_NAMES
            for f in files[name]
            if isinstance(store, WorkStore)  # the write tasks put them there
        }
        upload_output(
            out, cfg.work_path, cfg.remote_out, threads=cfg.tokenize.threads, placed=placed
        )
    return report


def _recorded_read(read: ReadConfig) -> dict[str, Any]:
    """The read settings as recorded: input URLs without any secret they carry."""
    return {**dataclasses.asdict(read), "inputs": [redact(str(s)) for s in read.inputs]}


def _recorded_config(cfg: RunConfig) -> dict[str, Any]:
    """``cfg`` as ``packcli.json`` records it (URLs redacted)."""
    data = cfg.to_dict()
    data["out"] = redact(data["out"])
    data["read"] = _recorded_read(cfg.read)
    return data


def _count_pair_segments(report: dict[str, Any], plan: Plan, shards: TokenShards) -> None:
    """The plan places a pair as one piece; the output holds it as two segments, which is
    what ``tiers.*.segments`` counts (and ``preference.kept_pairs``, the pairs written)."""
    is_pair = shards.column("chosen_len") > 0
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        pairs = int(is_pair[plan.piece_doc[layout.row_pieces]].sum())
        report["tiers"][name]["segments"] += pairs
        if name == "long":
            report["preference"]["kept_pairs"] = pairs


def tokenizer_report(index: dict[str, Any]) -> dict[str, Any]:
    """What the tokenizer did that the user should know: settings of the tokenizer file that
    were turned off, and special-token strings met inside documents (by token, most first)."""
    info = index.get("tokenizer", {})
    found = index.get("special_strings") or {}
    return {
        "disabled_settings": info.get("disabled", []),
        "special_in_text": info.get("special_in_text"),
        "special_strings": {
            "occurrences": sum(found.values()),
            "by_token": dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))[:20]),
        },
    }


def _gather_rejects(cfg: RunConfig, out: Path, shards: TokenShards) -> None:
    """``OUT/rejected.jsonl``: every quarantined line of every input file, in input order
    (written atomically; removed when nothing was rejected). A unit that is a byte span of a
    file numbered its lines from the span; they become the file's own line numbers here."""
    target = out / REJECTED
    parts = [
        (cfg.work_path / "tokens" / "files" / unit["key"] / REJECTED, unit["first_line"])
        for unit in shards.success.get("units", [])
    ]
    parts = [(p, first_line) for p, first_line in parts if p.is_file()]
    if not parts:
        target.unlink(missing_ok=True)
        return
    tmp = target.with_name(f".{REJECTED}.tmp-{os.getpid()}")
    with open(tmp, "wb") as sink:
        for part, first_line in parts:
            with open(part, "rb") as fh:
                if first_line:
                    shift_reject_lines(fh, sink, first_line)
                else:
                    shutil.copyfileobj(fh, sink)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, target)


def _relative_to_out(path: Path, out: Path) -> str:
    """Record the work folder relative to the output when inside it, so outputs can move."""
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path.resolve())


# --------------------------------------------------------------------------- all stages


@in_mirror
def run_pack(
    cfg: RunConfig,
    *,
    quiet: bool = False,
    overwrite: bool = False,
    command: str = "",
    executor: Executor | None = None,
    num_tasks: int | None = None,
    tokens_per_step: int = TOKENS_PER_STEP,
) -> RunResult:
    """The whole job from one command: tokenize and write as ``num_tasks`` tasks each on the
    executor (one in-process task by default), plan and finalize in this process.

    Everything a user can get wrong is checked before any file is touched, and the output and
    work folders are locked for the whole job (a second run on either fails at once)."""
    out = _require_out(cfg)
    check_output(cfg, overwrite)
    prepared = prepare_tokenize(cfg)
    claim_output(cfg)
    with hold(out, cfg.work_path):
        return _run_locked(
            cfg, prepared, quiet, command, executor or Executor("local"), num_tasks, tokens_per_step
        )


def _run_locked(
    cfg: RunConfig,
    prepared: Prepared,
    quiet: bool,
    command: str,
    executor: Executor,
    num_tasks: int | None,
    tokens_per_step: int = TOKENS_PER_STEP,
) -> RunResult:
    n = num_tasks or executor.default_tasks()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # In this process the tokenizer is already loaded; Ray tasks load their own.
    task = functools.partial(tokenize_task, prepared=prepared)
    reused = all(
        executor.map(task if executor.kind == "local" else tokenize_task, (cfg,), n, quiet=quiet)
    )
    timings["tokenize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan, shards = plan_stage(cfg, quiet=quiet)
    timings["plan"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if executor.kind == "local" and n == 1:
        write_task(cfg, plan, shards, quiet=quiet)  # reuse the plan already in memory
    else:
        executor.map(write_stage, (cfg,), n, quiet=quiet)
    timings["write"] = time.perf_counter() - t0
    report = finalize_stage(cfg, command=command, plan=plan, tokens_per_step=tokens_per_step)
    return RunResult(
        report=report,
        timings=timings,
        reused_tokens=reused,
        tokenize_times=StageTimes.ordered(shards.success.get("times", {})),
    )
