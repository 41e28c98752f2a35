"""Byte spans of one big file as units of tokenize work: every line read exactly once, file
line numbers kept, and the output identical to reading the file whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import data_hashes
from clirun import invoke_ok as invoke
from corpora import mixed_lengths, random_text
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from packcli.cli import app
from packcli.read import (
    BadLineError,
    ReadOptions,
    ReadStats,
    RejectSink,
    count_newlines,
    iter_batches,
    split_spans,
)
from packcli.read.spans import line_spans

runner = CliRunner()
CFG = "plan:\n  short_len: 64\n  long_len: 1024\nwrite:\n  shard_tokens: 6000\n"


def untidy_corpus(path: Path, n: int, seed: int) -> list[str]:
    """Documents with blank lines, CRLF endings, bad lines and a few very long lines (so
    spans start mid-line, on a line start and inside a blank run); returns the good texts."""
    import random

    rng = random.Random(seed)
    texts = []
    with open(path, "wb") as fh:
        fh.write(b"\xef\xbb\xbf")  # a BOM, which only the first span may strip
        for i, words in enumerate(mixed_lengths(n, seed=seed)):
            text = random_text(rng, words)
            end = b"\r\n" if i % 7 == 0 else b"\n"
            fh.write(json.dumps({"text": text}, ensure_ascii=False).encode() + end)
            texts.append(text)
            if i % 11 == 3:
                fh.write(b"\n  \n")
            if i % 13 == 5:
                fh.write(b'{"text": 5}\n{"oops"\n')
    return texts


def read_in_spans(path: Path, split: int, policy: str, sink: RejectSink | None = None):
    """Texts, file line numbers and summed stats of reading ``path`` span by span, lines
    shifted by the lines of the spans before (what the plan stage does)."""
    spans = split_spans(path.stat().st_size, split) or [(0, path.stat().st_size)]
    texts: list[str] = []
    lines: list[int] = []
    total = ReadStats()
    for span in spans:
        stats = ReadStats()
        for batch in iter_batches(
            [path],
            options=ReadOptions(5, on_bad_line=policy, rejects=sink),
            stats=stats,
            span=span,
        ):
            texts += batch.texts
            lines += (batch.position + total.lines).tolist()
        for name in ("documents", "blank_lines", "bytes_read", "lines"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        for reason, count in stats.rejected.items():
            total.rejected[reason] = total.rejected.get(reason, 0) + count
        before = path.read_bytes()[: stats.first_line_byte]
        assert count_newlines(path, stats.first_line_byte) == before.count(b"\n")
    return texts, lines, total


@pytest.fixture(scope="module")
def untidy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("spans") / "big.jsonl"
    return path, untidy_corpus(path, 120, seed=3)


def test_split_spans_cover_the_file() -> None:
    assert split_spans(100, 0) is None and split_spans(100, 100) is None
    assert split_spans(100, 40) == [(0, 40), (40, 80), (80, 100)]


@settings(max_examples=40, deadline=None)
@given(split=st.integers(min_value=1, max_value=4000))
def test_spans_read_every_line_once(untidy: tuple[Path, list[str]], split: int) -> None:
    path, expected = untidy
    whole = read_in_spans(path, 0, "skip")
    texts, lines, stats = read_in_spans(path, split, "skip")
    assert texts == whole[0] == expected
    assert lines == whole[1]
    assert stats == whole[2]
    assert stats.bytes_read == path.stat().st_size
    assert stats.lines == len(path.read_bytes().splitlines())


def read_spans(path: Path, spans: list[tuple[int, int]]) -> tuple[list[str], list[int], ReadStats]:
    """Texts, lines (from the first span's first line) and summed counts of reading
    ``spans`` of ``path`` one after another."""
    texts: list[str] = []
    lines: list[int] = []
    total = ReadStats()
    for span in spans:
        stats = ReadStats()
        options = ReadOptions(5, on_bad_line="skip")
        for batch in iter_batches([path], options=options, stats=stats, span=span):
            texts += batch.texts
            lines += (batch.position + total.lines).tolist()
        total.documents += stats.documents
        total.count(stats.lines, stats.bytes_read, stats.blank_lines)
        for reason, count in stats.rejected.items():
            total.rejected[reason] = total.rejected.get(reason, 0) + count
    return texts, lines, total


@settings(max_examples=60, deadline=None)
@given(
    step=st.integers(min_value=1, max_value=3000),
    start=st.floats(min_value=0, max_value=1),
    length=st.floats(min_value=0, max_value=1),
)
def test_line_spans_read_what_their_span_reads(
    untidy: tuple[Path, list[str]], step: int, start: float, length: float
) -> None:
    """The rendering workers' pieces of a unit (packcli.chat.render_pool): consecutive,
    each after the first on a line start, and read one after another they give the
    documents, lines and counts of reading the unit's span at once."""
    path, _ = untidy
    data = path.read_bytes()
    lo = int(start * len(data))
    hi = min(len(data), lo + int(length * len(data)))
    pieces = line_spans(path, lo, hi, step)
    if lo == hi:
        assert pieces == []
        return
    assert [a for a, _ in pieces] == [lo, *(b for _, b in pieces[:-1])] and pieces[-1][1] == hi
    assert all(a < b for a, b in pieces)
    assert all(data[a - 1 : a] == b"\n" for a, _ in pieces[1:])
    assert all(b - a <= step or data[b - 1 : b] == b"\n" or b == hi for a, b in pieces)
    assert read_spans(path, pieces) == read_spans(path, [(lo, hi)])


@pytest.mark.parametrize("split", [1, 97, 1024])
def test_error_in_a_later_span_names_the_file_line(tmp_path: Path, split: int) -> None:
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": f"document {i} " * (i % 9 + 1)}) for i in range(300)]
    lines[241] = '{"text": "cut'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadLineError) as whole:
        list(iter_batches([path]))
    assert whole.value.line == 242
    caught = []
    for span in split_spans(path.stat().st_size, split) or []:
        try:
            list(iter_batches([path], span=span))
        except BadLineError as exc:
            caught.append((exc.line, str(exc)))
    assert caught == [(242, str(whole.value))]


def test_span_needs_one_uncompressed_file(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="uncompressed"):
        list(iter_batches([path], span=(0, 1)))


@pytest.fixture
def tiny_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of a few hundred bytes, so small test files split (refused for real runs)."""
    monkeypatch.setattr("packcli.config.MIN_SPLIT_BYTES", 1)


@pytest.mark.usefixtures("tiny_spans")
def test_pack_in_spans_matches_whole_file(
    untidy: tuple[Path, list[str]], toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    path, _ = untidy
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG)
    args = [path, "-t", toy_tokenizer_path, "-c", cfg, "-q", "--on-bad-line", "skip"]
    whole, spans, tasks = tmp_path / "whole", tmp_path / "spans", tmp_path / "tasks"
    invoke("pack", *args, "-o", whole, "--split-bytes", 0)
    invoke("pack", *args, "-o", spans, "--split-bytes", 777)
    units = json.loads((spans / ".packcli/tokens/stage.json").read_text())["units"]
    assert len(units) == -(-path.stat().st_size // 777)
    invoke("pack", *args, "-o", tasks, "--split-bytes", 2000, "--num-tasks", 3)

    ref = json.loads((whole / "packcli.json").read_text())["report"]
    assert ref["input"]["rejected_lines"] > 10 and ref["input"]["blank_lines"] > 10
    for out in (spans, tasks):
        assert data_hashes(out) == data_hashes(whole)
        # Same counts, same largest-document provenance (a file line), same quarantine.
        assert json.loads((out / "packcli.json").read_text())["report"] == ref
        assert (out / "rejected.jsonl").read_bytes() == (whole / "rejected.jsonl").read_bytes()
        assert "all invariants hold" in invoke("verify", out)
    largest = ref["largest_document"]
    raw = path.read_bytes().splitlines()[largest["line"] - 1]
    assert len(json.loads(raw)["text"]) == max(len(t) for t in untidy[1])


def test_small_batches_change_nothing(
    untidy: tuple[Path, list[str]], toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Batches cut by bytes (and tiny tokenized shards) give the same dataset."""
    path, _ = untidy
    small = tmp_path / "small.yaml"
    small.write_text(CFG + "read:\n  batch_bytes: 3000\ntokenize:\n  shard_tokens: 1024\n")
    plain = tmp_path / "cfg.yaml"
    plain.write_text(CFG)
    args = [path, "-t", toy_tokenizer_path, "-q", "--on-bad-line", "skip"]
    invoke("pack", *args, "-o", tmp_path / "a", "-c", plain)
    invoke("pack", *args, "-o", tmp_path / "b", "-c", small)
    shards = list((tmp_path / "b/.packcli/tokens/files").glob("*/shard-*.arrow"))
    assert len(shards) > 5
    assert data_hashes(tmp_path / "b") == data_hashes(tmp_path / "a")


@pytest.mark.usefixtures("tiny_spans")
def test_error_policy_names_file_line_through_the_cli(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(400)]
    lines[333] = "[1, 2]"
    path.write_text("\n".join(lines) + "\n")
    args = ["pack", path, "-t", toy_tokenizer_path, "-o", tmp_path / "o", "--split-bytes", 1000]
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 1
    assert f"{path}:334:" in result.output


def test_freed_memory_goes_back_to_the_os_on_glibc() -> None:
    """Each unit's threads get their own glibc arenas; the pipeline trims them after every
    unit and shard (peak RSS measured in scripts/bench_pipeline.py --memory)."""
    import platform

    from packcli.stages import tokenize

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert tokenize._malloc_trim() is not None
    tokenize.release_free_memory()
