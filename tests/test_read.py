"""Tests for the streaming jsonl reader (packcli.read)."""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard

from packcli.errors import InputError
from packcli.read import DocBatch, ReadStats, iter_batches, resolve_inputs


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
    paths: Sequence[Path], batch_size: int = 1024, stats: ReadStats | None = None, **kw: str
) -> list[DocBatch]:
    return list(iter_batches(paths, batch_size=batch_size, stats=stats, **kw))


def _docs(batches: list[DocBatch]) -> list[tuple[int, int, int, str]]:
    """(doc id, file index, line, text) for every document."""
    out = []
    for b in batches:
        assert b.file_index.dtype == np.int32
        assert b.line.dtype == np.int64
        assert len(b.file_index) == len(b.line) == len(b.texts)
        for i, text in enumerate(b.texts):
            out.append((b.doc_id_start + i, int(b.file_index[i]), int(b.line[i]), text))
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
        (b'{"text": "\xff"}', "invalid JSON"),
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
    it = iter_batches([path], batch_size=1)
    assert next(it).texts == ["a"]
    assert next(it).texts == ["b"]
    with pytest.raises(InputError, match=r"a\.jsonl:4: invalid JSON"):
        list(it)


# --------------------------------------------------------------------------- corrupt streams


def _big_payload() -> bytes:
    rng = np.random.default_rng(1)
    return _jsonl([rng.bytes(100).hex() for _ in range(20_000)])


def _assert_last_good_line_plausible(path: Path) -> None:
    """The reported line is the last complete line decoded before the damage (about half)."""
    with pytest.raises(InputError) as info:
        _read_all([path])
    last_good = int(str(info.value).split("after line ")[1].split(":")[0])
    assert 5_000 < last_good < 15_000


def test_truncated_gzip(tmp_path: Path) -> None:
    blob = gzip.compress(_big_payload())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match=r"t\.jsonl\.gz: corrupt compressed stream after line \d+"):
        _read_all([path])
    _assert_last_good_line_plausible(path)


def test_truncated_gzip_trailer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(TEXTS))[:-4])  # all data present, CRC/size cut
    with pytest.raises(InputError, match=rf"corrupt compressed stream after line {len(TEXTS)}"):
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
    with pytest.raises(
        InputError, match=r"t\.jsonl\.zst: corrupt compressed stream after line \d+"
    ):
        _read_all([path])
    _assert_last_good_line_plausible(path)


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
