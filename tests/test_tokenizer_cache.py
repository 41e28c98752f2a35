"""The cached copy of a tokenizer file: the same tokenizer, made once, never used when damaged."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from packcli.tokenize import tokenizer_cache
from packcli.tokenize.tokenizer import load_tokenizer

DEMO = Path(__file__).resolve().parent.parent / "packcli" / "assets" / "demo_tokenizer.json"


def pair_merges_file(folder: Path, *, space_in: bool = False) -> Path:
    """The demo tokenizer with its merges as pairs (what recent tokenizers save), optionally
    with one merge whose token holds a space (a form the string rewrite cannot express)."""
    data = json.loads(DEMO.read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    data["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in merges]
    if space_in:
        data["added_tokens"] = data.get("added_tokens", [])
        data["model"]["vocab"]["a b"] = len(data["model"]["vocab"])
        data["model"]["vocab"]["a bc"] = len(data["model"]["vocab"])
        data["model"]["merges"].append(["a b", "c"])
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(folder))
    monkeypatch.setattr(tokenizer_cache, "MIN_BYTES", 0)  # the demo file is small
    return folder / "tokenizers"


def load(path: Path) -> Tokenizer:
    raw = path.read_bytes()
    return tokenizer_cache.load(raw, hashlib.sha256(raw).hexdigest())


def test_copy_made_once_then_used(tmp_path: Path, cache: Path, monkeypatch) -> None:
    path = pair_merges_file(tmp_path)
    want = Tokenizer.from_file(str(path)).to_str()
    assert load(path).to_str() == want
    copies = list(cache.glob("*.json"))
    assert len(copies) == 1
    assert b'"merges":[["' not in copies[0].read_bytes()  # merges now written as strings
    # The second load reads the copy (its bytes, not decoded first): the original's bytes
    # are not parsed again.
    seen: list[bytes] = []
    real = Tokenizer.from_buffer

    def spy(data: bytes) -> Tokenizer:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(tokenizer_cache.Tokenizer, "from_buffer", staticmethod(spy))
    monkeypatch.setattr(
        tokenizer_cache.Tokenizer, "from_str", lambda text: pytest.fail("parsed a str")
    )
    monkeypatch.setattr(tokenizer_cache, "rewritten", lambda raw: pytest.fail("rewrote again"))
    assert load(path).to_str() == want
    assert seen == [copies[0].read_bytes()]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_copy_removed_and_original_loaded(
    tmp_path: Path, cache: Path, damage: str, caplog
) -> None:
    path = pair_merges_file(tmp_path)
    want = Tokenizer.from_file(str(path)).to_str()
    load(path)
    (copy,) = cache.glob("*.json")
    data = copy.read_bytes()
    bad = {"truncate": data[: len(data) // 2], "flip": data.replace(b"\xc4\xa0", b"x", 1)}
    copy.write_bytes(bad.get(damage, b""))
    with caplog.at_level(logging.WARNING, logger=tokenizer_cache.__name__):
        assert load(path).to_str() == want
    assert "damaged" in caplog.text
    (again,) = cache.glob("*.json")  # remade, sound
    assert again.read_bytes() == data


def test_pairs_holding_a_space_stay_pairs(tmp_path: Path, cache: Path) -> None:
    path = pair_merges_file(tmp_path, space_in=True)
    original = json.loads(path.read_text(encoding="utf-8"))
    want = Tokenizer.from_file(str(path)).to_str()
    copy = tokenizer_cache.rewritten(path.read_bytes())
    assert copy is not None  # the vocabulary still gets sorted
    model = json.loads(copy)["model"]
    assert model["merges"] == original["model"]["merges"]  # pairs, in rank order
    assert list(model["vocab"]) == sorted(original["model"]["vocab"])
    assert model["vocab"] == original["model"]["vocab"]  # the same ids
    assert load(path).to_str() == want
    assert len(list(cache.glob("*.json"))) == 1
    assert load(path).to_str() == want  # from the copy


def test_no_copy_when_nothing_would_change(tmp_path: Path, cache: Path) -> None:
    data = json.loads(DEMO.read_text(encoding="utf-8"))  # merges already strings
    data["model"]["vocab"] = dict(sorted(data["model"]["vocab"].items()))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    want = Tokenizer.from_file(str(path)).to_str()
    assert tokenizer_cache.rewritten(path.read_bytes()) is None
    assert load(path).to_str() == want
    assert list(cache.glob("*.json")) == []
    assert len(list(cache.glob("*.none"))) == 1
    assert load(path).to_str() == want  # the mark is read, the original loaded


def test_string_merges_kept_and_the_vocabulary_sorted(tmp_path: Path, cache: Path) -> None:
    original = json.loads(DEMO.read_text(encoding="utf-8"))
    assert list(original["model"]["vocab"]) != sorted(original["model"]["vocab"])  # by id
    copy = tokenizer_cache.rewritten(DEMO.read_bytes())
    assert copy is not None
    model = json.loads(copy)["model"]
    assert model["merges"] == original["model"]["merges"]
    assert list(model["vocab"]) == sorted(original["model"]["vocab"])
    assert model["vocab"] == original["model"]["vocab"]
    assert load(DEMO).to_str() == Tokenizer.from_file(str(DEMO)).to_str()


def test_unwritable_cache_still_loads(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(blocker))
    monkeypatch.setattr(tokenizer_cache, "MIN_BYTES", 0)
    path = pair_merges_file(tmp_path)
    assert load(path).to_str() == Tokenizer.from_file(str(path)).to_str()


def test_load_tokenizer_fingerprints_the_original(tmp_path: Path, cache: Path) -> None:
    path = pair_merges_file(tmp_path)
    first, second = load_tokenizer(str(path)), load_tokenizer(str(path))  # miss, then copy
    assert list(cache.glob("*.json"))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert first.file_fingerprint == second.file_fingerprint == sha
    # Nothing turned off: the fingerprint is the file's own sha256 (what earlier runs recorded).
    assert first.fingerprint == second.fingerprint == sha
    assert first.tokenizer.to_str() == second.tokenizer.to_str()


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_copy_encodes_like_the_original(text: str) -> None:
    original = Tokenizer.from_file(str(DEMO))
    data = json.loads(original.to_str())  # pair merges
    copy = tokenizer_cache.rewritten(json.dumps(data).encode("utf-8"))
    assert copy is not None
    rewritten = Tokenizer.from_str(copy.decode("utf-8"))
    assert rewritten.encode(text).ids == original.encode(text).ids


def test_cached_copy_is_the_sound_copy_or_none(tmp_path: Path, cache: Path) -> None:
    """What a fast backend builds from: the copy ``load`` made, as text; None before there is
    one, for a damaged one (left for ``load`` to remove) and for a file below the size."""
    path = pair_merges_file(tmp_path)
    raw = path.read_bytes()
    assert tokenizer_cache.cached_copy(raw) is None  # nothing made yet, and nothing made here
    assert not cache.exists()
    load(path)
    (copy,) = cache.glob("*.json")
    assert tokenizer_cache.cached_copy(raw) == copy.read_text(encoding="utf-8")
    text = tokenizer_cache.cached_copy(raw) or ""
    assert Tokenizer.from_str(text).to_str() == load(path).to_str()
    assert tokenizer_cache.cached_copy(raw + b" ") is None  # another file: another hash
    data = copy.read_bytes()
    copy.write_bytes(data.replace(b"\xc4\xa0", b"x", 1))
    assert tokenizer_cache.cached_copy(raw) is None
    assert copy.exists()


def test_cached_copy_skips_small_files(tmp_path: Path, cache: Path, monkeypatch) -> None:
    path = pair_merges_file(tmp_path)
    load(path)
    monkeypatch.setattr(tokenizer_cache, "MIN_BYTES", path.stat().st_size + 1)
    assert tokenizer_cache.cached_copy(path.read_bytes()) is None
