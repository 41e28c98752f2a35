"""Load an HF ``tokenizers`` tokenizer and resolve the separator tokens we add.

We always encode with ``add_special_tokens=False`` and add BOS/EOS ourselves: a tokenizer's
post-processor may or may not add them (Llama adds BOS, GPT-2 adds nothing), and pretraining
packs need one explicit, documented rule. ``auto`` reads ``tokenizer_config.json`` next to the
tokenizer when there is one (what transformers does), else looks for well-known names.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from packcli.errors import ConfigError

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


# Texts in, token ids out, no special tokens added: the one thing the tokenize stage needs
# from a tokenizer backend (HF tokenizers today; faster exact backends can plug in here).
BatchEncoder = Callable[[list[str]], Sequence[Sequence[int]]]


def hf_batch_encoder(tokenizer: Tokenizer) -> BatchEncoder:
    """HF ``encode_batch_fast`` (parallel in Rust, skips character offsets: ~2x faster)."""

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    return encode


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    source: str
    config: dict  # tokenizer_config.json contents, {} when absent
    fingerprint: str  # sha256 of the serialized tokenizer, for reproducibility records

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def _config_beside(tokenizer_file: Path) -> dict:
    folder = tokenizer_file.parent
    stem = tokenizer_file.name.removesuffix(".json")
    for candidate in (folder / "tokenizer_config.json", folder / f"{stem}_config.json"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"cannot read tokenizer config {candidate}: {exc}") from exc
    return {}


def load_tokenizer(spec: str) -> LoadedTokenizer:
    """``spec``: a ``tokenizer.json`` file, a folder holding one, or a Hub repo id."""
    if not spec:
        raise ConfigError("no tokenizer given: pass --tokenizer PATH|REPO_ID")
    path = Path(spec)
    config: dict = {}
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"folder {spec} holds no tokenizer.json")
    if path.is_file():
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ConfigError(f"cannot load tokenizer {path}: {exc}") from exc
        config = _config_beside(path)
        source = str(path.resolve())  # absolute, so `packcli inspect` can reload it anywhere
    elif path.suffix == ".json" or spec.startswith((".", "/")):
        raise ConfigError(f"tokenizer file not found: {spec}")
    else:
        try:
            tok = Tokenizer.from_pretrained(spec)
        except Exception as exc:
            raise ConfigError(f"cannot load tokenizer {spec!r} from the Hub: {exc}") from exc
        config = _hub_config(spec)
        source = spec
    fingerprint = hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()
    return LoadedTokenizer(tokenizer=tok, source=source, config=config, fingerprint=fingerprint)


def _hub_config(repo_id: str) -> dict:
    try:
        from huggingface_hub import hf_hub_download

        file = hf_hub_download(repo_id, "tokenizer_config.json")
        return json.loads(Path(file).read_text(encoding="utf-8"))
    except Exception as exc:  # the config is optional; detection falls back to known names
        log.info(
            "no tokenizer_config.json for %s (%s); detecting special tokens by name", repo_id, exc
        )
        return {}


def _config_token(config: dict, key: str) -> str | None:
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
        candidates = ((named,) if named else ()) + (
            _EOS_CANDIDATES if kind == "eos" else _BOS_CANDIDATES
        )
        for name in candidates:
            tid = tok.token_to_id(name)
            if tid is not None:
                return tid
        raise ConfigError(
            f"could not detect the tokenizer's {kind.upper()} token; pass --{kind} TOKEN "
            f"(a token string or id) or --{kind} none"
        )
    tid = tok.token_to_id(value)
    if tid is None:
        raise ConfigError(f"--{kind} {value!r} is not a token of this tokenizer")
    return tid
