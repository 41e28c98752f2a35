"""A faster-loading copy of a ``tokenizer.json``, kept in packcli's cache by the file's sha256.

HF's loader spends about a third of a 128k tokenizer's load (0.2 of 0.6 s for Llama-3)
parsing merges written as pairs (``[["Ġ", "t"], ...]``, what recent ``tokenizers`` save);
the same merges written as ``"Ġ t"`` strings, a form HF also reads, load that much faster.
It then spends a sixth of the rest putting the vocabulary into an ordered map (its JSON
detour, ``serde_json::Map``) in the file's order, by id, which for the map is random order:
cache misses on every key compared. The same entries in sorted key order (JSON leaves the
order free: each entry names its id) load in 0.52 s instead of 0.61 (medians of 7 fresh
processes, CPU, Llama-3's copy with string merges). A small pack, and every cluster task,
pays this load once per run, so the copy is made once: it is kept only when HF builds the
very same tokenizer from it (equal ``to_str()``), and it is named by its own hash as well as
the original's, so a truncated, edited or half-written copy is never used (it is removed and
the original loaded). Files with nothing to rewrite (another model type, merges already
strings or holding a space and the vocabulary already sorted) get an empty ``.none`` mark so
later runs do not parse them twice to find out again.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import orjson
from tokenizers import Tokenizer

from packcli.atomic import atomic_write_bytes
from packcli.fs.urls import cache_root

log = logging.getLogger(__name__)

# In the copy's name: a new rule for rewriting gets new names instead of reusing old copies
# (1: merges as strings; 2: and the vocabulary sorted).
RULE = "merges-as-strings-sorted-vocab-2"
# Smaller files load in a few tens of ms: no copy (the Llama-3 file is 9 MB, GPT-2's 1.4 MB).
MIN_BYTES = 1 << 20


def cache_folder() -> Path:
    return cache_root() / "tokenizers"


def load(raw: bytes, sha256: str) -> Tokenizer:
    """The tokenizer of file bytes ``raw`` (whose sha256 is ``sha256``), from the cached copy
    when there is a sound one; else from ``raw``, making the copy for the next run (which
    costs about 1.4 s once for Llama-3's file: rewriting, loading the copy and comparing)."""
    if len(raw) < MIN_BYTES:
        return Tokenizer.from_str(raw.decode("utf-8"))
    folder = cache_folder()
    for copy in _copies(folder, sha256):
        data = _read(copy)
        tok = None if data is None else _sound(data, copy.stem.rsplit(".", 1)[-1])
        if tok is not None:
            return tok
        log.warning("tokenizer cache: %s is damaged; removed, loading the original", copy)
        copy.unlink(missing_ok=True)
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    if not (folder / f"{sha256}.{RULE}.none").exists():
        try:
            _make_copy(raw, sha256, tok, folder)
        except OSError as exc:  # a read-only or full cache: the run goes on without a copy
            log.debug("tokenizer cache: no copy made in %s: %s", folder, exc)
    return tok


def _sound(data: bytes, digest: str) -> Tokenizer | None:
    """The tokenizer of copy ``data`` when its sha256 is ``digest``, else None. HF reads the
    bytes as they are (``from_buffer``): decoding 6 MB to a str first cost ~15 ms."""
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    return Tokenizer.from_buffer(data)


def cached_copy(raw: bytes) -> str | None:
    """The text of a sound copy of tokenizer file bytes ``raw`` already in the cache (its
    name's hash is its content's), else None; nothing is made or removed here (``load``
    does that). What a fast backend builds from: fastokens built Llama-3's tables from the
    copy in 0.97-1.19 s against 1.69 s from the original, and the self-check against HF
    still decides whether it is used."""
    if len(raw) < MIN_BYTES:
        return None
    for copy in _copies(cache_folder(), hashlib.sha256(raw).hexdigest()):
        data = _read(copy)
        if data is not None and hashlib.sha256(data).hexdigest() == copy.stem.rsplit(".", 1)[-1]:
            return data.decode("utf-8")
    return None


def _copies(folder: Path, sha256: str) -> list[Path]:
    try:
        return sorted(folder.glob(f"{sha256}.{RULE}.*.json"))
    except OSError:
        return []


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _make_copy(raw: bytes, sha256: str, tok: Tokenizer, folder: Path) -> None:
    copy = rewritten(raw)
    if copy is not None and Tokenizer.from_str(copy.decode("utf-8")).to_str() != tok.to_str():
        copy = None  # HF reads the copy otherwise than the original: never use it
    folder.mkdir(parents=True, exist_ok=True)
    if copy is None:
        atomic_write_bytes(folder / f"{sha256}.{RULE}.none", b"")
        return
    name = f"{sha256}.{RULE}.{hashlib.sha256(copy).hexdigest()}.json"
    atomic_write_bytes(folder / name, copy)  # concurrent tasks write the same bytes


def rewritten(raw: bytes) -> bytes | None:
    """``raw`` in the form HF reads fastest: a BPE model's pair merges written as ``"a b"``
    strings, and its vocabulary's entries in sorted order (the same ids); None when that is
    not the same tokenizer or nothing would change. Merges stay pairs where a token holds a
    space (HF splits a string merge at its space, so such a merge cannot be written so);
    their order is never touched (it is their rank)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    if not (isinstance(model, dict) and model.get("type") == "BPE"):
        return None
    merges, vocab = model.get("merges"), model.get("vocab")
    if not (isinstance(merges, list) and merges and isinstance(vocab, dict)):
        return None
    changed = False
    if all(isinstance(m, list) and len(m) == 2 and all(map(_plain, m)) for m in merges):
        model["merges"] = [f"{a} {b}" for a, b in merges]
        changed = True
    keys = sorted(vocab)  # code point order, which is UTF-8 byte order (Rust's)
    if keys != list(vocab):
        model["vocab"] = {k: vocab[k] for k in keys}
        changed = True
    return orjson.dumps(data) if changed else None


def _plain(token: object) -> bool:
    """A merge token a ``"a b"`` string can hold: a non-empty string without a space."""
    return isinstance(token, str) and bool(token) and " " not in token
