"""Tests for the streaming jsonl reader (packcli.read)."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard

from packcli.errors import InputError
from packcli.read import (
    BadLineError,
    DocBatch,
    ReadOptions,
    ReadStats,
    RejectSink,
    iter_batches,
    resolve_inputs,
)


def _jsonl(texts: Sequence[str]) -> bytes:
    return b"".join(orjson.dumps({"text": t, "id": i}) + b"\n" for i, t in enumerate(texts))


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _read_all(
    paths: Sequence[Path], batch_size: int = 1024, stats: ReadStats | None = None, **kw: Any
) -> list[DocBatch]:
    """``iter_batches`` with ``ReadOptions``' fields as keywords too."""
    names = {f.name for f in dataclasses.fields(ReadOptions)}
    options = ReadOptions(batch_size, **{k: v for k, v in kw.items() if k in names})
    rest = {k: v for k, v in kw.items() if k not in names}
    return list(iter_batches(paths, options=options, stats=stats, **rest))


def _docs(batches: list[DocBatch]) -> list[tuple[int, int, int, str]]:
    """(doc id, file index, line, text) for every document."""
    out = []
    for b in batches:
        assert b.file_index.dtype == np.int32
        assert b.position.dtype == np.int64
        assert len(b.file_index) == len(b.position) == len(b.texts)
        for i, text in enumerate(b.texts):
            out.append((b.doc_id_start + i, int(b.file_index[i]), int(b.position[i]), text))
    return out


TEXTS = ["hello", "wörld ✓", "line\nbreak inside", '"quoted"', "x" * 1000]


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_compressions_give_identical_documents(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"a{suffix}", _jsonl(TEXTS))
    stats = ReadStats()
    docs = _docs(_read_all([path], stats=stats))
    assert docs == [(i, 0, i + 1, t) for i, t in enumerate(TEXTS)]
    assert stats.files == 1
    assert stats.documents == len(TEXTS)
    assert stats.bytes_read == len(_jsonl(TEXTS))


def test_all_compressions_together(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path / "a.jsonl", _jsonl(TEXTS)),
        _write(tmp_path / "b.jsonl.gz", _jsonl(TEXTS)),
        _write(tmp_path / "c.jsonl.zst", _jsonl(TEXTS)),
    ]
    docs = _docs(_read_all(paths, batch_size=4))
    texts_by_file = [[d[3] for d in docs if d[1] == f] for f in range(3)]
    assert texts_by_file == [TEXTS, TEXTS, TEXTS]


def test_multi_frame_zstd_and_multi_member_gzip(tmp_path: Path) -> None:
    part1, part2 = _jsonl(TEXTS[:2]), _jsonl(TEXTS[2:])
    cctx = zstandard.ZstdCompressor()
    zst = tmp_path / "m.jsonl.zst"
    zst.write_bytes(cctx.compress(part1) + cctx.compress(part2))
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress(part1) + gzip.compress(part2))
    for path in (zst, gz):
        assert [d[3] for d in _docs(_read_all([path]))] == TEXTS


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_doc_ids_contiguous_across_files_and_batches(tmp_path: Path, batch_size: int) -> None:
    counts = [5, 0, 7, 1, 4]
    paths = []
    for f, n in enumerate(counts):
        texts = [f"f{f}d{i}" for i in range(n)]
        paths.append(_write(tmp_path / f"{f}.jsonl{['', '.gz', '.zst'][f % 3]}", _jsonl(texts)))
    batches = _read_all(paths, batch_size=batch_size)
    assert all(len(b.texts) == batch_size for b in batches[:-1])
    assert 1 <= len(batches[-1].texts) <= batch_size
    docs = _docs(batches)
    assert [d[0] for d in docs] == list(range(sum(counts)))
    expected = [(f, i + 1, f"f{f}d{i}") for f, n in enumerate(counts) for i in range(n)]
    assert [d[1:] for d in docs] == expected
    starts = [b.doc_id_start for b in batches]
    assert starts == list(range(0, sum(counts), batch_size))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_batch_bytes_ends_batches_early(tmp_path: Path, suffix: str) -> None:
    """A run of huge documents makes small batches; every document still comes once, in
    order, with contiguous ids; 0 means no byte limit."""
    texts = [("x" * 5000 if i % 10 == 3 else f"d{i}") for i in range(200)]
    path = _write(tmp_path / f"c{suffix}", _jsonl(texts))
    stats = ReadStats()
    batches = _read_all([path], batch_size=50, stats=stats, batch_bytes=12000)
    assert [t for b in batches for t in b.texts] == texts
    assert [b.doc_id_start for b in batches] == list(
        np.cumsum([0] + [len(b.texts) for b in batches[:-1]])
    )
    sizes = [sum(len(_jsonl([t])) for t in b.texts) for b in batches]
    assert max(sizes) < 12000 + 5100  # ends at the first line at or past the limit
    assert min(len(b.texts) for b in batches[:-1]) < 50 and stats.documents == 200
    assert [len(b.texts) for b in _read_all([path], batch_size=50, batch_bytes=0)] == [50] * 4


def test_line_numbers_with_blank_lines(tmp_path: Path) -> None:
    data = b'\n{"text": "a"}\n   \n\t\r\n{"text": "b"}\n\n{"text": "c"}'  # no final newline
    path = _write(tmp_path / "x.jsonl", data)
    stats = ReadStats()
    docs = _docs(_read_all([path], batch_size=2, stats=stats))
    assert docs == [(0, 0, 2, "a"), (1, 0, 5, "b"), (2, 0, 7, "c")]
    assert stats.blank_lines == 4
    assert stats.documents == 3
    assert stats.bytes_read == len(data)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_bom_and_crlf(tmp_path: Path, suffix: str) -> None:
    data = b'\xef\xbb\xbf{"text": "a"}\r\n\r\n{"text": "b\\r\\n"}\r\n'
    path = _write(tmp_path / f"x{suffix}", data)
    assert _docs(_read_all([path])) == [(0, 0, 1, "a"), (1, 0, 3, "b\r\n")]


def test_bom_only_stripped_at_file_start(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", b'{"text": "a"}\n\xef\xbb\xbf{"text": "b"}\n')
    with pytest.raises(InputError, match=r"x\.jsonl:2: invalid JSON"):
        _read_all([path])


def test_custom_text_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", b'{"content": "a", "text": 1}\n')
    assert _docs(_read_all([path], text_field="content")) == [(0, 0, 1, "a")]


def test_large_single_line(tmp_path: Path) -> None:
    big = "ab€" * 2_000_000  # > 5 MB of UTF-8
    data = _jsonl(["small", big, "after"])
    assert len(data) > 5_000_000
    for suffix in (".jsonl", ".jsonl.gz", ".jsonl.zst"):
        path = _write(tmp_path / f"big{suffix}", data)
        assert [d[3] for d in _docs(_read_all([path], batch_size=2))] == ["small", big, "after"]


def test_progress_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for f, suffix in enumerate([".jsonl.zst", ".jsonl", ".jsonl.gz", ".jsonl.zst"]):
        # random hex so compressed files are large enough to span several reads
        texts = [rng.bytes(200).hex() for _ in range(3000 + 500 * f)]
        paths.append(_write(tmp_path / f"{f}{suffix}", _jsonl(texts)))
    sizes = [p.stat().st_size for p in paths]
    for batch_size in (1, 500, 3000, 100_000):
        batches = _read_all(paths, batch_size=batch_size)
        progress = [b.progress_bytes for b in batches]
        assert progress == sorted(progress)
        assert progress[-1] == sum(sizes)
        assert all(0 <= p <= sum(sizes) for p in progress)
        # a batch that ends exactly at the end of a file reports exactly the bytes done so far
        ends = np.cumsum([3000 + 500 * f for f in range(4)])
        for b in batches:
            end = b.doc_id_start + len(b.texts)
            if end in ends:
                f = int(np.searchsorted(ends, end))
                assert b.progress_bytes == sum(sizes[: f + 1])


# --------------------------------------------------------------------------- parse errors


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"text": "a"', "invalid JSON"),
        (b'{"text": "a"} trailing', "invalid JSON"),
        (b'{"text": "\xff"}', "invalid UTF-8"),
        (b'["text"]', "line is not a JSON object"),
        (b'"text"', "line is not a JSON object"),
        (b"42", "line is not a JSON object"),
        (b"null", "line is not a JSON object"),
        (b'{"txt": "a"}', "missing field 'text'"),
        (b'{"text": 1}', "field 'text' is not a string (got int)"),
        (b'{"text": null}', "field 'text' is not a string (got null)"),
        (b'{"text": ["a"]}', "field 'text' is not a string (got array)"),
        (b'{"text": ""}', "field 'text' is empty"),
    ],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_parse_errors_name_file_and_line(
    tmp_path: Path, line: bytes, reason: str, suffix: str
) -> None:
    data = b'{"text": "ok"}\n\n' + line + b'\n{"text": "later"}\n'
    path = _write(tmp_path / f"bad{suffix}", data)
    with pytest.raises(InputError) as info:
        _read_all([path])
    message = str(info.value)
    assert f"{path}:3: " in message
    assert reason in message


def test_error_line_in_second_file(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", _jsonl(["x", "y"]))
    b = _write(tmp_path / "b.jsonl.gz", b'{"text": "z"}\n{"text": 5}\n')
    with pytest.raises(InputError, match=rf"{b}:2: field 'text' is not a string \(got int\)"):
        _read_all([a, b], batch_size=1)


def test_earlier_batches_are_yielded_before_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", _jsonl(["a", "b", "c"]) + b"oops\n")
    it = iter_batches([path], options=ReadOptions(batch_size=1))
    assert next(it).texts == ["a"]
    assert next(it).texts == ["b"]
    with pytest.raises(InputError, match=r"a\.jsonl:4: invalid JSON"):
        list(it)


# --------------------------------------------------------------------------- corrupt streams


def _big_payload() -> bytes:
    rng = np.random.default_rng(1)
    return _jsonl([rng.bytes(100).hex() for _ in range(20_000)])


def _members(payload: bytes, compress: Any, parts: int = 4) -> list[bytes]:
    """``payload`` as ``parts`` gzip members / zstd frames of whole lines."""
    lines = payload.splitlines(keepends=True)
    step = -(-len(lines) // parts)
    return [compress(b"".join(lines[i : i + step])) for i in range(0, len(lines), step)]


def _cut_in_third_member(compress: Any) -> bytes:
    """Four members of 5,000 lines each, the file cut in the middle of the third."""
    m = _members(_big_payload(), compress)
    return m[0] + m[1] + m[2][: len(m[2]) // 2]


def test_truncated_gzip(tmp_path: Path) -> None:
    # One member cut short cannot be verified (its CRC is gone): no line of it is trusted.
    blob = gzip.compress(_big_payload())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match=r"t\.jsonl\.gz: corrupt compressed stream after line 0 "):
        _read_all([path])
    # With several members, the complete ones before the cut are: the last good line is exact.
    path.write_bytes(_cut_in_third_member(gzip.compress))
    with pytest.raises(InputError, match=r"after line 10000 .*gzip member 3 .*cut short"):
        _read_all([path])


def test_truncated_gzip_trailer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(TEXTS))[:-4])  # all data present, CRC/size cut
    with pytest.raises(InputError, match=r"corrupt compressed stream after line 0 .*cut short"):
        _read_all([path])


def test_garbled_gzip(tmp_path: Path) -> None:
    blob = bytearray(gzip.compress(_big_payload()))
    blob[len(blob) // 2 : len(blob) // 2 + 64] = bytes(64)
    path = tmp_path / "g.jsonl.gz"
    path.write_bytes(bytes(blob))
    with pytest.raises(InputError, match=r"g\.jsonl\.gz"):
        _read_all([path])


def test_not_gzip_at_all(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl.gz"
    path.write_bytes(_jsonl(TEXTS))
    with pytest.raises(InputError, match=r"n\.jsonl\.gz: corrupt compressed stream after line 0"):
        _read_all([path])


def test_truncated_zstd(tmp_path: Path) -> None:
    blob = zstandard.ZstdCompressor().compress(_big_payload())
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match=r"t\.jsonl\.zst: corrupt compressed stream after line 0 "):
        _read_all([path])
    path.write_bytes(_cut_in_third_member(zstandard.ZstdCompressor().compress))
    with pytest.raises(InputError, match=r"after line 10000 .*zstd frame 3 .*cut short"):
        _read_all([path])


def test_truncated_zstd_at_line_boundary(tmp_path: Path) -> None:
    # The frame is cut but every decoded line is complete: must not pass silently.
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(TEXTS))[:-3])
    with pytest.raises(InputError, match=r"t\.jsonl\.zst: corrupt compressed stream"):
        _read_all([path])


def test_garbled_zstd(tmp_path: Path) -> None:
    blob = zstandard.ZstdCompressor(write_checksum=True).compress(_big_payload())
    path = tmp_path / "g.jsonl.zst"
    path.write_bytes(blob[:4] + b"\xff" * 16 + blob[20:])
    with pytest.raises(InputError, match=r"g\.jsonl\.zst: corrupt compressed stream after line 0"):
        _read_all([path])


def test_empty_files(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path / "a.jsonl", b""),
        _write(tmp_path / "b.jsonl.gz", b""),
        _write(tmp_path / "c.jsonl.zst", b""),
        tmp_path / "d.jsonl.gz",
    ]
    paths[3].write_bytes(b"")  # zero-byte file
    stats = ReadStats()
    assert _read_all(paths, stats=stats) == []
    assert stats.files == 4
    assert stats.documents == 0


def test_missing_file_while_reading(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"gone\.jsonl: cannot open"):
        _read_all([tmp_path / "gone.jsonl"])


def test_bad_batch_size(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", _jsonl(TEXTS))
    with pytest.raises(ValueError):
        _read_all([path], batch_size=0)


# --------------------------------------------------------------------------- bad input policy

DEEP = b"[" * 100_000


def _nest(depth: int) -> bytes:
    """A line whose "x" field nests ``depth - 1`` arrays inside the line's object."""
    return b'{"text": "a", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


BIG_INT = b"9" * 5000  # beyond a double (orjson refuses it) and CPython's 4300-digit int limit

# (case id, bad line without terminator, reason key, fragment of the message)
BAD_LINES: list[tuple[str, bytes, str, str]] = [
    ("unclosed_object", b'{"text": "a"', "invalid_json", "invalid JSON"),
    ("trailing_content", b'{"text": "a"} x', "invalid_json", "invalid JSON"),
    ("single_quotes", b"{'text': 'a'}", "invalid_json", "invalid JSON"),
    ("raw_control_char", b'{"text": "a\x01b"}', "invalid_json", "control character"),
    ("bad_escape", b'{"text": "a\\x41"}', "invalid_json", "invalid JSON"),
    ("leading_zero", b'{"text": "a", "n": 01}', "invalid_json", "leading zero"),
    ("bom_not_at_file_start", b'\xef\xbb\xbf{"text": "a"}', "invalid_json", "BOM"),
    ("array", b'["text"]', "not_object", "line is not a JSON object (got array)"),
    ("string", b'"text"', "not_object", "line is not a JSON object (got string)"),
    ("number", b"42", "not_object", "line is not a JSON object (got int)"),
    ("null", b"null", "not_object", "line is not a JSON object (got null)"),
    ("missing_field", b'{"txt": "a"}', "missing_field", "missing field 'text'"),
    ("nested_field_only", b'{"meta": {"text": "a"}}', "missing_field", "missing field 'text'"),
    ("int_text", b'{"text": 1}', "not_string", "field 'text' is not a string (got int)"),
    ("null_text", b'{"text": null}', "not_string", "field 'text' is not a string (got null)"),
    ("array_text", b'{"text": ["a"]}', "not_string", "not a string (got array)"),
    ("object_text", b'{"text": {"a": 1}}', "not_string", "not a string (got object)"),
    ("big_int_text", b'{"text": ' + BIG_INT + b"}", "not_string", "not a string (got int)"),
    ("empty_text", b'{"text": ""}', "empty_text", "field 'text' is empty"),
    ("utf8_truncated_seq", b'{"text": "a\xe2\x82"}', "invalid_utf8", "invalid UTF-8 at byte 12"),
    ("utf8_overlong_2", b'{"text": "a\xc0\xaf"}', "invalid_utf8", "invalid UTF-8 at byte 12"),
    ("utf8_overlong_3", b'{"text": "\xe0\x80\xaf"}', "invalid_utf8", "invalid UTF-8 at byte 11"),
    ("utf8_surrogate", b'{"text": "a\xed\xa0\x80"}', "invalid_utf8", "invalid UTF-8 at byte 12"),
    ("utf8_stray_cont", b'{"text": "a\x80"}', "invalid_utf8", "invalid UTF-8 at byte 12"),
    ("utf8_ff", b'{"text": "a\xff"}', "invalid_utf8", "(ff)"),
    ("utf8_fe_in_key", b'{"te\xfext": "a"}', "invalid_utf8", "invalid UTF-8 at byte 5"),
    ("utf8_other_field", b'{"text": "a", "m": "\xc3"}', "invalid_utf8", "invalid UTF-8"),
    ("lone_high", b'{"text": "a\\ud800b"}', "lone_surrogate", "lone surrogate escape \\ud800"),
    ("lone_low", b'{"text": "a\\udc00"}', "lone_surrogate", "lone surrogate escape \\udc00"),
    ("high_then_bmp", b'{"text": "\\ud800\\u0041"}', "lone_surrogate", "lone surrogate"),
    ("lone_in_key", b'{"\\udfff": 1, "text": "a"}', "lone_surrogate", "lone surrogate"),
    ("lone_other_field", b'{"text": "a", "m": "\\uDBFF"}', "lone_surrogate", "lone surrogate"),
    ("nan", b'{"text": "a", "x": NaN}', "nan_infinity", "non-standard JSON (NaN/Infinity)"),
    ("infinity", b'{"text": "a", "x": Infinity}', "nan_infinity", "(NaN/Infinity)"),
    ("minus_infinity", b'{"text": "a", "x": [-Infinity]}', "nan_infinity", "(NaN/Infinity)"),
    ("nan_text", b'{"text": NaN}', "nan_infinity", "(NaN/Infinity)"),
    ("deep_bare", DEEP, "too_deep", "nesting too deep"),
    ("deep_in_field", b'{"text": "a", "x": ' + DEEP, "too_deep", "nesting too deep"),
    ("depth_1025", _nest(1025), "too_deep", "nesting too deep"),
    # A big number sends the line to the standard-library fallback, which must still hold it
    # to orjson's other rules.
    ("big_then_nan", b'{"text": "a", "n": ' + BIG_INT + b', "x": NaN}', "nan_infinity", "NaN"),
    ("big_then_lone", b'{"text": "a", "n": 1e999, "x": "\\ud800"}', "lone_surrogate", "lone"),
    ("big_then_deep", b'{"text": "a", "n": 1e999, "x": ' + DEEP + b"}", "too_deep", "too deep"),
    ("big_then_1025", _nest(1025)[:-1] + b', "n": 1e999}', "too_deep", "too deep"),
    ("big_then_syntax", b'{"text": "a", "n": 1e999, "x": }', "invalid_json", "invalid JSON"),
    ("big_then_no_text", b'{"n": 1e999}', "missing_field", "missing field 'text'"),
]

# Lines that are *not* errors: (case id, line without terminator, expected text)
GOOD_LINES: list[tuple[str, bytes, str]] = [
    ("duplicate_keys_last_wins", b'{"text": "first", "text": "second"}', "second"),
    ("big_int_other_field", b'{"text": "a", "id": ' + BIG_INT + b"}", "a"),
    ("big_negative_int", b'{"text": "a", "id": -' + BIG_INT + b"}", "a"),
    ("big_float", b'{"text": "a", "x": [1e400, -1.5e999]}', "a"),
    ("u64_overflow", b'{"text": "a", "id": 18446744073709551616}', "a"),
    ("big_in_nested", b'{"m": {"h": ' + BIG_INT + b'}, "text": "b"}', "b"),
    ("surrogate_pair", b'{"text": "\\ud83d\\ude00"}', "\U0001f600"),
    ("nan_in_string", b'{"text": "NaN Infinity \\\\ud800"}', "NaN Infinity \\ud800"),
    ("depth_1024", _nest(1024), "a"),
    ("big_then_depth_900", _nest(900)[:-1] + b', "n": 1e999}', "a"),
    ("nul_escape", b'{"text": "a\\u0000b"}', "a\x00b"),
    ("whitespace_around", b' \t{"text" : "a"}\t ', "a"),
]

BAD_CASES = [pytest.param(*case, id=case[0]) for case in BAD_LINES]
GOOD_CASES = [pytest.param(*case, id=case[0]) for case in GOOD_LINES]

GOOD = b'{"text": "first"}\n'
AFTER = b'{"text": "after"}\n'


def _read_skip(
    paths: Sequence[Path], sink_path: Path, batch_size: int = 1024
) -> tuple[list[tuple[int, int, int, str]], ReadStats, list[dict[str, Any]]]:
    """Documents, stats and quarantine records of a ``skip`` run."""
    stats = ReadStats()
    with RejectSink(sink_path) as sink:
        batches = _read_all(
            paths, batch_size=batch_size, stats=stats, on_bad_line="skip", rejects=sink
        )
    records = []
    if sink_path.exists():
        records = [json.loads(line) for line in sink_path.read_bytes().splitlines()]
    return _docs(batches), stats, records


def _expected_reason(case: str, reason: str, last: bool) -> str:
    """A line that is cut short reads as a truncated file when it is the last line."""
    return "truncated_line" if last and case == "unclosed_object" else reason


def _sandwich(bad: bytes, last: bool) -> bytes:
    """A good line, a blank line, then ``bad`` at line 3: last in the file without a newline, or
    followed by a good line."""
    return GOOD + b"\n" + (bad if last else bad + b"\n" + AFTER)


@pytest.mark.parametrize("last", [False, True], ids=["mid", "last"])
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
@pytest.mark.parametrize(("case", "bad", "reason", "fragment"), BAD_CASES)
def test_bad_line_error_policy(
    tmp_path: Path, case: str, bad: bytes, reason: str, fragment: str, suffix: str, last: bool
) -> None:
    path = _write(tmp_path / f"bad{suffix}", _sandwich(bad, last))
    with pytest.raises(BadLineError) as info:
        _read_all([path])
    err = info.value
    assert isinstance(err, InputError)
    assert (err.file, err.line, err.reason) == (str(path), 3, _expected_reason(case, reason, last))
    assert str(err).startswith(f"{path}:3: ")
    assert (fragment if err.reason == reason else "file truncated?") in str(err)


@pytest.mark.parametrize("last", [False, True], ids=["mid", "last"])
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize(("case", "bad", "reason", "fragment"), BAD_CASES)
def test_bad_line_skip_policy(
    tmp_path: Path, case: str, bad: bytes, reason: str, fragment: str, suffix: str, last: bool
) -> None:
    path = _write(tmp_path / f"bad{suffix}", _sandwich(bad, last))
    docs, stats, records = _read_skip([path], tmp_path / "out" / "rejected.jsonl")
    assert docs == ([(0, 0, 1, "first")] if last else [(0, 0, 1, "first"), (1, 0, 4, "after")])
    assert stats.blank_lines == 1
    assert sum(stats.rejected.values()) == 1
    assert len(records) == 1
    rec = records[0]
    expected = _expected_reason(case, reason, last)
    assert stats.rejected == {expected: 1}
    assert (rec["file"], rec["line"], rec["reason"]) == (str(path), 3, expected)
    assert (fragment if expected == reason else "file truncated?") in rec["detail"]
    assert base64.b64decode(rec["raw_b64"]) == (bad if last else bad + b"\n")
    assert stats.documents + stats.blank_lines + sum(stats.rejected.values()) == (3 if last else 4)


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize(("case", "line", "text"), GOOD_CASES)
def test_lines_that_are_not_errors(
    tmp_path: Path, case: str, line: bytes, text: str, policy: str
) -> None:
    path = _write(tmp_path / "ok.jsonl", GOOD + line + b"\n" + line)  # mid-file and last
    stats = ReadStats()
    docs = _docs(_read_all([path], stats=stats, on_bad_line=policy))
    assert docs == [(0, 0, 1, "first"), (1, 0, 2, text), (2, 0, 3, text)], case
    assert stats.rejected == {}


def test_truncated_last_line(tmp_path: Path) -> None:
    """A file cut while being written: its last line is reported as truncated, not just bad."""
    for cut in (b'{"text": "abc', b'{"text": "abc", "n": [1, 2', b'{"te', b'{"text": "\xe2\x82'):
        path = _write(tmp_path / "cut.jsonl", GOOD + cut)
        with pytest.raises(BadLineError, match=r"cut\.jsonl:2: .*truncated") as info:
            _read_all([path])
        assert info.value.reason == "truncated_line"
        docs, stats, records = _read_skip([path], tmp_path / "rejected.jsonl")
        assert docs == [(0, 0, 1, "first")]
        assert stats.rejected == {"truncated_line": 1}
        assert base64.b64decode(records[0]["raw_b64"]) == cut
    # the same bytes with a newline after them are an ordinary invalid line
    path = _write(tmp_path / "nl.jsonl", GOOD + b'{"text": "abc", "n": [1, 2\n')
    with pytest.raises(BadLineError, match=r"nl\.jsonl:2: invalid JSON") as info:
        _read_all([path])
    assert info.value.reason == "invalid_json"


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_bom_crlf_and_blank_lines_are_not_errors(tmp_path: Path, suffix: str, policy: str) -> None:
    data = b'\xef\xbb\xbf{"text": "a"}\r\n\r\n  \t\r\n{"text": "b"}\r\n\n{"text": "c\\r\\n"}'
    path = _write(tmp_path / f"x{suffix}", data)
    stats = ReadStats()
    docs = _docs(_read_all([path], stats=stats, on_bad_line=policy))
    assert docs == [(0, 0, 1, "a"), (1, 0, 4, "b"), (2, 0, 6, "c\r\n")]
    assert stats.blank_lines == 3
    assert stats.rejected == {}
    assert stats.bytes_read == len(data)


def test_rejected_first_line_keeps_its_bom(tmp_path: Path) -> None:
    """The quarantine holds the line's bytes exactly as in the file, BOM included."""
    data = b'\xef\xbb\xbf{"text": 1}\r\n{"text": "b"}\r\n'
    path = _write(tmp_path / "x.jsonl", data)
    docs, _, records = _read_skip([path], tmp_path / "rejected.jsonl")
    assert docs == [(0, 0, 2, "b")]
    assert base64.b64decode(records[0]["raw_b64"]) == b'\xef\xbb\xbf{"text": 1}\r\n'


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_huge_lines(tmp_path: Path, suffix: str) -> None:
    """A single line of tens of MB: accepted whole when good, quarantined byte-exact when bad."""
    big = "x€" * 5_000_000  # 20 MB of UTF-8
    good = orjson.dumps({"text": big})
    bad = orjson.dumps({"text": big, "n": float("nan")}).replace(b"null", b"NaN")
    path = _write(tmp_path / f"huge{suffix}", GOOD + good + b"\n" + bad + b"\n" + AFTER)
    with pytest.raises(BadLineError, match=r"huge\.jsonl(\.zst)?:3: non-standard JSON"):
        _read_all([path])
    docs, stats, records = _read_skip([path], tmp_path / "rejected.jsonl")
    assert [d[:3] for d in docs] == [(0, 0, 1), (1, 0, 2), (2, 0, 4)]
    assert docs[1][3] == big
    assert stats.rejected == {"nan_infinity": 1}
    assert base64.b64decode(records[0]["raw_b64"]) == bad + b"\n"


def test_skip_keeps_every_good_line_with_contiguous_ids(tmp_path: Path) -> None:
    """Many bad lines of every kind among good ones, over files and batches: exactly the bad
    lines are quarantined, every good line is kept, ids stay contiguous."""
    bad_lines = [bad for _, bad, _, _ in BAD_LINES]
    paths, expected, expected_rejects = [], [], []
    for f, suffix in enumerate([".jsonl", ".jsonl.gz", ".jsonl.zst"]):
        data = b""
        for i, bad in enumerate(bad_lines):
            lineno = 2 * i + 1
            text = f"f{f}l{lineno}"
            data += orjson.dumps({"text": text}) + b"\n" + bad + b"\n"
            expected.append((f, lineno, text))
            expected_rejects.append((f, lineno + 1, bad + b"\n"))
        paths.append(_write(tmp_path / f"{f}{suffix}", data))
    for batch_size in (1, 7, 10_000):
        docs, stats, records = _read_skip(paths, tmp_path / f"r{batch_size}.jsonl", batch_size)
        assert [d[0] for d in docs] == list(range(len(expected)))
        assert [d[1:] for d in docs] == expected
        got = [
            (paths.index(Path(r["file"])), r["line"], base64.b64decode(r["raw_b64"]))
            for r in records
        ]
        assert got == expected_rejects
        by_reason: dict[str, int] = {}
        for _, _, reason, _ in BAD_LINES:
            by_reason[reason] = by_reason.get(reason, 0) + 3
        assert stats.rejected == by_reason
        assert [r["reason"] for r in records] == [r for _, _, r, _ in BAD_LINES] * 3


# --------------------------------------------------------------------------- corrupt streams, skip


def _truncated_gz(payload: bytes) -> bytes:
    return _cut_in_third_member(gzip.compress)


def _truncated_zst(payload: bytes) -> bytes:
    return _cut_in_third_member(zstandard.ZstdCompressor().compress)


def _garbled_zst(payload: bytes) -> bytes:
    blob = zstandard.ZstdCompressor(write_checksum=True).compress(payload)
    return blob[:4] + b"\xff" * 16 + blob[20:]


@pytest.mark.parametrize(
    ("name", "corrupt"),
    [
        ("t.jsonl.gz", _truncated_gz),
        ("t.jsonl.zst", _truncated_zst),
        ("g.jsonl.zst", _garbled_zst),
        ("n.jsonl.gz", lambda payload: payload),  # not gzip at all
        ("c.jsonl.gz", lambda payload: gzip.compress(payload)[:-4]),  # trailer cut
    ],
)
def test_corrupt_stream_skip(tmp_path: Path, name: str, corrupt: Any) -> None:
    payload = _big_payload()
    first = _write(tmp_path / "a.jsonl", _jsonl(["a0", "a1"]))
    bad = tmp_path / name
    bad.write_bytes(corrupt(payload))
    last = _write(tmp_path / "z.jsonl.zst", _jsonl(["z0"]))
    with pytest.raises(BadLineError) as info:
        _read_all([first, bad, last])
    err = info.value
    assert err.reason == "corrupt_stream"
    assert err.file == str(bad)
    assert str(err).startswith(f"{bad}: corrupt compressed stream after line {err.line - 1} ")
    assert "uncompressed byte" in str(err)

    docs, stats, records = _read_skip([first, bad, last], tmp_path / "rejected.jsonl", 100)
    kept = [d for d in docs if d[1] == 1]
    assert [d[2] for d in kept] == list(range(1, len(kept) + 1))  # everything before the damage
    assert [d[3] for d in docs] == ["a0", "a1"] + [d[3] for d in kept] + ["z0"]
    assert [d[0] for d in docs] == list(range(len(docs)))
    assert stats.rejected == {"corrupt_stream": 1}
    assert stats.files == 3
    assert len(records) == 1
    rec = records[0]
    assert (rec["file"], rec["line"], rec["reason"]) == (str(bad), len(kept) + 1, "corrupt_stream")
    assert rec["line"] == err.line
    assert base64.b64decode(rec["raw_b64"]) == b""
    if "t.jsonl" in name:  # the two complete members before the cut
        assert len(kept) == 10_000


# --------------------------------------------------------------------------- RejectSink


def test_reject_sink_only_created_when_something_was_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", _jsonl(TEXTS))
    docs, stats, records = _read_skip([path], tmp_path / "out" / "rejected.jsonl")
    assert len(docs) == len(TEXTS)
    assert records == []
    assert stats.rejected == {}
    assert not (tmp_path / "out").exists()


def test_reject_sink_is_atomic(tmp_path: Path) -> None:
    final = tmp_path / "rejected.jsonl"
    with RejectSink(final) as sink:
        sink.add("f.jsonl", 3, "invalid_json", b"\x00\xff raw\r\n", "detail")
        assert not final.exists()  # only a temp file while open
        assert sink.count == 1
    assert [p.name for p in tmp_path.iterdir()] == ["rejected.jsonl"]
    (rec,) = [json.loads(line) for line in final.read_text().splitlines()]
    assert rec == {
        "file": "f.jsonl",
        "line": 3,
        "reason": "invalid_json",
        "detail": "detail",
        "raw_b64": base64.b64encode(b"\x00\xff raw\r\n").decode(),
    }
    with pytest.raises(ValueError, match="closed"):
        sink.add("f.jsonl", 4, "invalid_json", b"")


def test_reject_sink_discarded_on_error(tmp_path: Path) -> None:
    final = tmp_path / "rejected.jsonl"
    final.write_bytes(b"previous run\n")
    with pytest.raises(RuntimeError), RejectSink(final) as sink:
        sink.add("f.jsonl", 1, "invalid_json", b"x")
        raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["rejected.jsonl"]  # no temp file left
    assert final.read_bytes() == b"previous run\n"  # untouched


def test_error_policy_never_writes_rejects(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", GOOD + b"oops\n")
    sink_path = tmp_path / "rejected.jsonl"
    with pytest.raises(BadLineError), RejectSink(sink_path) as sink:
        _read_all([path], rejects=sink)
    assert not sink_path.exists()


def test_unknown_policy(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", GOOD)
    with pytest.raises(ValueError, match="on_bad_line"):
        _read_all([path], on_bad_line="ignore")


def test_skip_without_sink_still_counts(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", GOOD + b"oops\n" + b"[]\n" + b"oops\n" + AFTER)
    stats = ReadStats()
    docs = _docs(_read_all([path], stats=stats, on_bad_line="skip"))
    assert docs == [(0, 0, 1, "first"), (1, 0, 5, "after")]
    assert stats.rejected == {"invalid_json": 2, "not_object": 1}


# --------------------------------------------------------------------------- resolve_inputs


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel in [
        "d/b.jsonl",
        "d/a.jsonl.gz",
        "d/sub/c.jsonl.zst",
        "d/sub/deeper/e.jsonl",
        "d/notes.txt",
        "d/x.json",
        "d/y.jsonl.bz2",
        "top.jsonl",
    ]:
        _write(tmp_path / rel, _jsonl(["t"]))
    return tmp_path


def _rel(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


def test_resolve_directory_recursive(tree: Path) -> None:
    got = resolve_inputs([str(tree / "d")])
    assert _rel(got, tree) == [
        "d/a.jsonl.gz",
        "d/b.jsonl",
        "d/sub/c.jsonl.zst",
        "d/sub/deeper/e.jsonl",
    ]
    assert all(p.is_absolute() for p in got)


def test_resolve_globs(tree: Path) -> None:
    assert _rel(resolve_inputs([str(tree / "d/*.jsonl*")]), tree) == ["d/a.jsonl.gz", "d/b.jsonl"]
    assert _rel(resolve_inputs([str(tree / "**/*.jsonl")]), tree) == [
        "d/b.jsonl",
        "d/sub/deeper/e.jsonl",
        "top.jsonl",
    ]
    # files with unsupported suffixes matched by a glob are ignored; directories are expanded
    assert _rel(resolve_inputs([str(tree / "d/s*")]), tree) == [
        "d/sub/c.jsonl.zst",
        "d/sub/deeper/e.jsonl",
    ]


def test_resolve_dedup_and_sorted(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    specs = ["top.jsonl", "d/sub", str(tree / "d/b.jsonl"), "d/**/*.zst", "./d/../top.jsonl"]
    got = resolve_inputs(specs)
    assert _rel(got, tree) == [
        "d/b.jsonl",
        "d/sub/c.jsonl.zst",
        "d/sub/deeper/e.jsonl",
        "top.jsonl",
    ]
    assert [str(p) for p in got] == sorted(str(p) for p in got)
    assert resolve_inputs(list(reversed(specs))) == got


def test_resolve_symlink_dedup(tree: Path) -> None:
    link = tree / "link.jsonl"
    os.symlink(tree / "top.jsonl", link)
    got = resolve_inputs([str(link), str(tree / "top.jsonl")])
    assert len(got) == 1


def test_resolve_missing_spec(tree: Path) -> None:
    with pytest.raises(InputError, match=r"not found: .*nope\.jsonl"):
        resolve_inputs([str(tree / "top.jsonl"), str(tree / "nope.jsonl")])


def test_resolve_glob_matching_nothing(tree: Path) -> None:
    spec = str(tree / "d/*.parquet")
    with pytest.raises(InputError, match=r"glob pattern .*\*\.parquet.* matched no"):
        resolve_inputs([spec])


def test_resolve_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "empty/readme.txt", b"hi")
    with pytest.raises(InputError, match=r"under directory .*empty"):
        resolve_inputs([str(tmp_path / "empty")])


@pytest.mark.parametrize("name", ["notes.txt", "x.json", "y.jsonl.bz2"])
def test_resolve_unsupported_explicit_file(tree: Path, name: str) -> None:
    with pytest.raises(InputError) as info:
        resolve_inputs([str(tree / "d" / name)])
    message = str(info.value)
    assert name in message
    for suffix in (".jsonl", ".jsonl.gz", ".jsonl.zst"):
        assert suffix in message


def test_resolve_skips_and_refuses_the_folders_packcli_writes(tree: Path) -> None:
    # An output folder inside the input folder, and a work folder elsewhere inside it.
    out, work = tree / "d" / "out", tree / "d" / "sub" / "work"
    _write(out / "rejected.jsonl", _jsonl(["quarantine"]))
    _write(out / ".packcli" / "tokens" / "files" / "k" / "rejected.jsonl", _jsonl(["q"]))
    _write(work / "x.jsonl.gz", _jsonl(["w"]))
    fences = (out, work)
    expected = ["d/a.jsonl.gz", "d/b.jsonl", "d/sub/c.jsonl.zst", "d/sub/deeper/e.jsonl"]
    assert _rel(resolve_inputs([str(tree / "d")], exclude=fences), tree) == expected
    assert _rel(resolve_inputs([str(tree / "d/**/*.jsonl*")], exclude=fences), tree) == expected
    for inside in (out / "rejected.jsonl", out, work / "x.jsonl.gz"):
        with pytest.raises(InputError, match=r"is inside .* where packcli writes its output"):
            resolve_inputs([str(inside)], exclude=fences)
    with pytest.raises(InputError, match=r"matched no .*not inputs"):
        resolve_inputs([str(out / "*.jsonl")], exclude=[tree / "d"])
    # Without exclusions (a library call), nothing changes.
    assert "d/out/rejected.jsonl" in _rel(resolve_inputs([str(tree / "d")]), tree)


def test_resolve_no_specs() -> None:
    with pytest.raises(InputError, match="no input files"):
        resolve_inputs([])


def test_resolve_then_read_end_to_end(tree: Path) -> None:
    paths = resolve_inputs([str(tree)])
    docs = _docs(_read_all(paths, batch_size=2))
    assert [d[0] for d in docs] == list(range(5))
    assert [paths[d[1]].name for d in docs] == [
        "a.jsonl.gz",
        "b.jsonl",
        "c.jsonl.zst",
        "e.jsonl",
        "top.jsonl",
    ]


# --------------------------------------------------------------------------- records (chat)
# A validator (chat, preference) replaces the text-field rule; a line that is not JSON at all
# must still be a bad line with the message a text line gets, never a record.

_DIALOGUE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
_RECORDS: dict[str, tuple[dict[str, Any], Any]] = {
    "chat": ({"messages": _DIALOGUE}, "messages"),
    "preference": ({"prompt": "a", "chosen": "b", "rejected": "c"}, "pair"),
}
_NOT_JSON = [
    ("not_json", b"not json", "invalid_json"),
    ("unclosed", b'{"messages": [', "invalid_json"),
    ("nan", b'{"messages": NaN}', "nan_infinity"),
    ("surrogate", b'{"messages": "\\ud800"}', "lone_surrogate"),
]


def _validator(kind: str) -> Any:
    from packcli.chat.validate import validate_messages, validate_pair

    return validate_pair if kind == "preference" else validate_messages


def _text_message(tmp_path: Path, bad: bytes) -> str:
    """What the text reader says about ``bad`` at line 2 of a file of the same name."""
    path = _write(tmp_path / "text" / "x.jsonl", b'{"text": "a"}\n' + bad + b'\n{"text": "b"}\n')
    with pytest.raises(BadLineError) as info:
        _read_all([path])
    return str(info.value).replace(str(path), "FILE")


@pytest.mark.parametrize("kind", sorted(_RECORDS))
@pytest.mark.parametrize(("case", "bad", "reason"), _NOT_JSON, ids=[c[0] for c in _NOT_JSON])
def test_a_record_line_that_is_not_json_is_a_bad_line(
    tmp_path: Path, kind: str, case: str, bad: bytes, reason: str
) -> None:
    good = orjson.dumps(_RECORDS[kind][0])
    path = _write(tmp_path / "x.jsonl", good + b"\n" + bad + b"\n" + good + b"\n")
    validate = _validator(kind)
    with pytest.raises(BadLineError) as info:
        _read_all([path], validate=validate)
    assert (info.value.line, info.value.reason) == (2, reason)
    assert str(info.value).replace(str(path), "FILE") == _text_message(tmp_path, bad)
    stats = ReadStats()
    with RejectSink(tmp_path / "rejected.jsonl") as sink:
        batches = _read_all(
            [path], stats=stats, on_bad_line="skip", rejects=sink, validate=validate
        )
    assert [doc[2] for doc in _docs(batches)] == [1, 3]
    assert [text for b in batches for text in b.texts] == [validate(_RECORDS[kind][0])] * 2
    assert stats.rejected == {reason: 1} and stats.lines == 3 and stats.documents == 2
    (record,) = [json.loads(x) for x in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert (record["line"], record["reason"]) == (2, reason)
    assert base64.b64decode(record["raw_b64"]) == bad + b"\n"


def test_a_record_with_a_number_beyond_a_double_is_not_rescued(tmp_path: Path) -> None:
    # The big-number fallback stands numbers in by 0, harmless when only the text field is
    # used; a validator keeps the whole record (tool calls, arguments), so the line is refused
    # as orjson refused it instead of reaching the template with its numbers changed.
    line = orjson.dumps({"messages": _DIALOGUE})[:-1] + b', "n": 1e999}'
    path = _write(tmp_path / "x.jsonl", line + b"\n")
    with pytest.raises(BadLineError, match=r"x\.jsonl:1: invalid JSON: .*column") as info:
        _read_all([path], validate=_validator("chat"))
    assert info.value.reason == "invalid_json"
    text = _write(tmp_path / "t.jsonl", line.replace(b'"messages"', b'"text": "a", "m"') + b"\n")
    assert [b.texts for b in _read_all([text])] == [["a"]]  # the text reader still takes it
