"""Load an HF ``tokenizers`` tokenizer and resolve the separator tokens we add.

We always encode with ``add_special_tokens=False`` and add BOS/EOS ourselves: a tokenizer's
post-processor may or may not add them (Llama adds BOS, GPT-2 adds nothing), and pretraining
packs need one explicit, documented rule. ``auto`` reads ``tokenizer_config.json`` next to the
tokenizer when there is one (what transformers does), else looks for well-known names.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from packcli.errors import ConfigError
from packcli.tokenize import tokenizer_cache

log = logging.getLogger(__name__)

# Most common end-of-document markers, in order of preference, for tokenizers without a config.
_EOS_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "[SEP]",
)
_BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


# What a special-token string inside a document becomes (``--special-in-text``).
SPECIAL_IN_TEXT = ("text", "special")


def set_special_in_text(tok: Tokenizer, mode: str) -> None:
    """``text`` (the default): ``<|end_of_text|>`` typed inside a document is encoded as the
    characters it is made of, as ``encode_special_tokens=True`` does; scraped pages and code
    hold such strings, and as real special ids they would end documents or open chat turns in
    the middle of pretraining text. ``special``: HF's default, the string becomes the token.
    Only added tokens marked special are affected (HF's rule); other added tokens always match.
    """
    if mode not in SPECIAL_IN_TEXT:
        raise ConfigError(f"--special-in-text must be text or special, got {mode!r}")
    tok.encode_special_tokens = mode == "text"


class SpecialStringCounter:
    """Counts the special tokens' strings inside documents, for the report.

    A document that contains them is legal, but the user should know: under ``special`` they
    became control tokens, under ``text`` they are plain text a model may still learn to emit.
    Cost: a substring scan per document and distinct two-character prefix (no join: joining
    a batch widens every text to its widest character, which cost more than the scans); only
    where a prefix occurs are the tokens starting with it compared.
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens = sorted({t for t in tokens if t}, key=lambda t: (-len(t), t))
        # Longest first within a prefix, so a token that extends another counts as itself.
        self._by_prefix: dict[str, list[str]] = {}
        for t in self.tokens:
            self._by_prefix.setdefault(t[:2], []).append(t)
        self._finders = {p: re.compile(re.escape(p)) for p in self._by_prefix}

    @classmethod
    def of(cls, tok: Tokenizer) -> SpecialStringCounter:
        return cls([t.content for t in tok.get_added_tokens_decoder().values() if t.special])

    def __call__(self, texts: Sequence[str], into: Counter[str]) -> None:
        for prefix, candidates in self._by_prefix.items():
            for text in texts:
                if prefix not in text:
                    continue
                end = -1
                for m in self._finders[prefix].finditer(text):
                    if m.start() < end:  # inside the token just counted
                        continue
                    for tok in candidates:
                        if text.startswith(tok, m.start()):
                            into[tok] += 1
                            end = m.start() + len(tok)
                            break


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    source: str
    config: dict[str, Any]  # tokenizer_config.json contents, {} when absent
    # For reproducibility records: sha256 of the tokenizer file (of its serialization when
    # it came from the Hub), plus what packcli turned off in it, if anything.
    fingerprint: str
    file_fingerprint: str = ""  # the file's own sha256 (before anything was turned off)
    # Settings of the tokenizer file that would change every document and that we turned off,
    # e.g. ``truncation (max_length 128)``; the report lists them.
    disabled: tuple[str, ...] = ()

    @functools.cached_property
    def serialized(self) -> str:
        """``tokenizer.to_str()`` as used (0.2 s for a 128k vocabulary, so made only when a
        fast backend loads from it, and once)."""
        return self.tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def config_candidates(tokenizer_file: Path) -> list[Path]:
    """Where the config of ``tokenizer_file`` may lie, in the order looked at (the first that
    exists is it): ``tokenizer_config.json`` beside it, then ``<stem>_config.json``. Special
    tokens (here) and chat templates (``packcli.chat.templates``) both come from it."""
    folder = tokenizer_file.parent
    stem = tokenizer_file.name.removesuffix(".json")
    return [folder / n for n in dict.fromkeys(("tokenizer_config.json", f"{stem}_config.json"))]


def _config_beside(tokenizer_file: Path) -> dict[str, Any]:
    for candidate in config_candidates(tokenizer_file):
        if candidate.is_file():
            try:
                config: dict[str, Any] = json.loads(candidate.read_text(encoding="utf-8"))
                return config
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"cannot read tokenizer config {candidate}: {exc}") from exc
    return {}


def local_tokenizer_file(spec: str) -> Path | None:
    """The ``tokenizer.json`` a spec names on disk (a file, or a folder holding one)."""
    path = Path(spec) if spec else None
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    return path if path is not None and path.is_file() else None


def load_tokenizer(spec: str) -> LoadedTokenizer:
    """``spec``: a ``tokenizer.json`` file, a folder holding one, or a Hub repo id."""
    if not spec:
        raise ConfigError("no tokenizer given: pass --tokenizer PATH|REPO_ID")
    config: dict[str, Any] = {}
    path = local_tokenizer_file(spec)
    if path is None and Path(spec).is_dir():
        raise ConfigError(f"folder {spec} holds no tokenizer.json")
    raw: bytes | None = None
    if path is not None:
        try:
            raw = path.read_bytes()
            file_sha = hashlib.sha256(raw).hexdigest()
            tok = tokenizer_cache.load(raw, file_sha)
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ConfigError(f"cannot load tokenizer {path}: {exc}") from exc
        config = _config_beside(path)
        source = str(path.resolve())  # absolute, so `packcli inspect` can reload it anywhere
    elif not _looks_like_repo_id(spec):
        raise ConfigError(f"tokenizer not found: no such file or folder {spec}")
    elif (local := Path(spec.split("/")[0])).is_dir() and "/" in spec:
        # ``models/llama3`` with a local ``models/`` folder: a typo, not a Hub repo (asking
        # the Hub would retry for half a minute before failing).
        raise ConfigError(
            f"tokenizer not found: no such file or folder {spec} (the folder {local} exists; "
            "a Hub repo id would be read only if it did not)"
        )
    else:
        try:
            tok = Tokenizer.from_pretrained(spec)
        except Exception as exc:
            raise ConfigError(_hub_failure(spec, exc)) from exc
        config = _hub_config(spec)
        source = spec
    # The file's bytes when there is a file (hashing them costs ms; serializing a 128k
    # tokenizer to hash it cost 0.2 s of every run).
    content = raw if raw is not None else tok.to_str().encode("utf-8")
    if raw is None:
        file_sha = hashlib.sha256(content).hexdigest()
    disabled = disable_length_settings(tok)
    return LoadedTokenizer(
        tokenizer=tok,
        source=source,
        config=config,
        fingerprint=_fingerprint(content, disabled, file_sha),
        file_fingerprint=file_sha,
        disabled=disabled,
    )


def _fingerprint(content: bytes, disabled: tuple[str, ...], content_sha: str) -> str:
    """What the tokenized shards depend on: the file, and which of its length settings packcli
    turned off (the same file with other settings turned off tokenizes differently).
    ``content_sha``: ``content``'s sha256, already taken (hashing Llama-3's 9 MB again cost
    6 ms of every run), which is the fingerprint when nothing was turned off."""
    if not disabled:
        return content_sha
    note = "\n# turned off: {}".format(", ".join(disabled)).encode("utf-8")
    return hashlib.sha256(content + note).hexdigest()


def disable_length_settings(tok: Tokenizer) -> tuple[str, ...]:
    """Turn off the truncation and padding a ``tokenizer.json`` may carry; say what was on.

    Tokenizers saved from pipelines (most BERT-family files) keep e.g. ``max_length: 128``
    and pad-to-length: applied here they would cut every document to 128 tokens and pad the
    short ones with ``[PAD]``, silently. packcli applies its own length policy (``--overlong``)
    and never pads, so both are always off, on every backend and for chat.
    """
    disabled = []
    if (trunc := tok.truncation) is not None:
        disabled.append(f"truncation (max_length {trunc.get('max_length')})")
        tok.no_truncation()
    if (pad := tok.padding) is not None:
        length = pad.get("length")
        disabled.append(f"padding ({'to ' + str(length) if length else 'to the longest'})")
        tok.no_padding()
    for what in disabled:
        log.warning("the tokenizer file enables %s: turned off (packcli never cuts or pads)", what)
    return tuple(disabled)


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _looks_like_repo_id(spec: str) -> bool:
    """``name`` or ``owner/name`` as the Hub allows them; anything else is a local path."""
    return (
        _REPO_ID.fullmatch(spec) is not None
        and ".." not in spec
        and not spec.endswith((".json", ".jsonl"))
    )


def hub_file(repo_id: str, name: str) -> Path | None:
    """``name`` of Hub repo ``repo_id`` (huggingface_hub's cache), or None when the repo has
    no such file or the Hub cannot be reached: the tokenizer's config and chat template are
    optional, and their callers fall back or say where they looked."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id, name))
    except Exception as exc:  # absent file, no network, offline mode
        log.info("no %s in Hub repo %s: %s", name, repo_id, exc)
        return None


def _hub_failure(repo_id: str, exc: Exception) -> str:
    """Why a Hub tokenizer could not be loaded, in one line. In offline mode the Hub's own
    words ("check your connection") hide the cause: say that HF_HUB_OFFLINE is set and the
    repo's tokenizer.json is not in the cache."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    if constants.HF_HUB_OFFLINE and isinstance(exc, LocalEntryNotFoundError):
        return (
            f"cannot load tokenizer {repo_id!r}: HF_HUB_OFFLINE is set and the Hub cache "
            f"({constants.HF_HUB_CACHE}) has no tokenizer.json of {repo_id}; unset "
            "HF_HUB_OFFLINE to download it, or pass a local tokenizer.json"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot load tokenizer {repo_id!r} from the Hub: {first}"


def _hub_config(repo_id: str) -> dict[str, Any]:
    """The Hub repo's ``tokenizer_config.json``, or {} (special tokens are then detected by
    their usual names)."""
    file = hub_file(repo_id, "tokenizer_config.json")
    try:
        return {} if file is None else json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.info("unreadable tokenizer_config.json of %s (%s)", repo_id, exc)
        return {}


def _config_token(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):  # AddedToken serialisation {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def resolve_special(loaded: LoadedTokenizer, value: str | int, kind: str) -> int | None:
    """Turn ``--eos``/``--bos`` into a token id (``None`` = add nothing)."""
    tok = loaded.tokenizer
    vocab = loaded.vocab_size
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        tid = int(value)
        if tid >= vocab:
            raise ConfigError(f"--{kind} id {tid} is outside the vocabulary (size {vocab})")
        return tid
    if value == "none":
        return None
    if value == "auto":
        named = _config_token(loaded.config, f"{kind}_token")
        if named is not None and tok.token_to_id(named) is None:
            raise ConfigError(
                f"--{kind} auto: tokenizer_config.json names {kind}_token {named!r}, which is "
                f"not a token of this tokenizer; pass --{kind} TOKEN (a token string or id) "
                f"or --{kind} none"
            )
        candidates = ((named,) if named else ()) + (
            _EOS_CANDIDATES if kind == "eos" else _BOS_CANDIDATES
        )
        for name in candidates:
            found = tok.token_to_id(name)
            if found is not None:
                return found
        raise ConfigError(
            f"could not detect the tokenizer's {kind.upper()} token; pass --{kind} TOKEN "
            f"(a token string or id) or --{kind} none"
        )
    named_id = tok.token_to_id(value)
    if named_id is None:
        raise ConfigError(f"--{kind} {value!r} is not a token of this tokenizer")
    return named_id
