"""Input the reader must not trust: damaged compressed streams, and packcli's own output.

Damaged streams: nothing a failed integrity check covers becomes a document. A gzip member is
trusted once its CRC32/size trailer verifies, a zstd frame once its content checksum does;
the reader keeps the whole members before the first one that fails (cut at their last
newline) and nothing from there on. Own output: an ``--out`` inside the input folder must not
feed its ``rejected.jsonl`` (or work files) to the next run.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard
from clirun import invoke

from packcli.read import BadLineError, ReadOptions, ReadStats, RejectSink, iter_batches
from packcli.tokenize.shards import sha256_file

SMALL = ["--short-len", "64", "--long-len", "1024", "--quiet"]


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(100).hex() for _ in range(n)]


def _jsonl(texts: list[str]) -> bytes:
    return b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts)


def _flip(blob: bytes, pos: int) -> bytes:
    b = bytearray(blob)
    b[pos] ^= 0x01
    return bytes(b)


def _read(
    paths: list[Path], on_bad_line: str = "skip", rejects: RejectSink | None = None
) -> tuple[list[tuple[int, int, str]], ReadStats]:
    """(file index, line, text) of every document, and the stats."""
    stats = ReadStats()
    docs = [
        (int(b.file_index[i]), int(b.position[i]), t)
        for b in iter_batches(
            paths, options=ReadOptions(on_bad_line=on_bad_line, rejects=rejects), stats=stats
        )
        for i, t in enumerate(b.texts)
    ]
    return docs, stats


def _checksum_only_flip(frame: bytes) -> bytes:
    """``frame`` with one byte flipped past its middle such that it still decodes and only its
    content checksum fails (found by trying, so it holds whatever the zstd version)."""
    for pos in range(len(frame) // 2, len(frame) - 4):
        damaged = _flip(frame, pos)
        try:
            zstandard.ZstdDecompressor().decompressobj().decompress(damaged)
        except zstandard.ZstdError as exc:
            if "checksum" in str(exc):
                return damaged
    raise AssertionError("no flip fails only the checksum")


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_flipped_byte_in_gzip_keeps_no_garbled_document(tmp_path: Path, where: float) -> None:
    # One member of ~2 MB: a flipped bit decodes to a few wrong lines without any error until
    # the CRC at the very end; none of the member can be trusted before that.
    texts = _texts(20_000, seed=1)
    blob = gzip.compress(_jsonl(texts))
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(_flip(blob, int(len(blob) * where)))
    good = tmp_path / "good.jsonl"
    good.write_bytes(_jsonl(["after"]))
    docs, stats = _read([bad, good])
    assert all(text in set(texts) for f, _, text in docs if f == 0)
    assert docs == [(1, 1, "after")]  # the only member failed; the next file is read
    assert stats.rejected == {"corrupt_stream": 1}
    (entry,) = stats.corrupt_streams
    assert entry["file"] == str(bad)
    assert (entry["kept_lines"], entry["byte"]) == (0, 0)
    assert "gzip member 1" in entry["reason"] and "incorrect data check" in entry["reason"]
    assert entry["discarded_lines"] > 0


def test_zstd_frame_failing_its_checksum_contributes_nothing(tmp_path: Path) -> None:
    parts = [_texts(10_000, seed=s) for s in (1, 2, 3)]
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    frames = [cctx.compress(_jsonl(p)) for p in parts]
    path = tmp_path / "z.jsonl.zst"
    path.write_bytes(frames[0] + _checksum_only_flip(frames[1]) + frames[2])
    docs, stats = _read([path])
    # Frame 1 whole; frame 2 failed, so nothing from it on (frame 3 is after the damage).
    assert [text for _, _, text in docs] == parts[0]
    (entry,) = stats.corrupt_streams
    assert (entry["kept_lines"], entry["byte"]) == (10_000, len(frames[0]))
    assert "zstd frame 2" in entry["reason"] and "checksum" in entry["reason"]


@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_junk_after_a_complete_frame_keeps_its_lines(tmp_path: Path, kind: str) -> None:
    texts = _texts(5, seed=4)
    if kind == "zstd":
        stream = zstandard.ZstdCompressor().compress(_jsonl(texts))
        path = tmp_path / "j.jsonl.zst"
    else:
        stream = gzip.compress(_jsonl(texts))
        path = tmp_path / "j.jsonl.gz"
    path.write_bytes(stream + b"junk" * 10)
    docs, stats = _read([path])
    assert [text for _, _, text in docs] == texts
    (entry,) = stats.corrupt_streams
    assert (entry["kept_lines"], entry["byte"]) == (5, len(stream))
    assert f"{'zstd frame' if kind == 'zstd' else 'gzip member'} 2" in entry["reason"]


def test_zero_padding_after_a_gzip_member_is_not_damage(tmp_path: Path) -> None:
    # As `gzip -d` and Python's gzip module: padding, not a corrupt stream.
    texts = _texts(5, seed=4)
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(texts)) + bytes(100))
    docs, stats = _read([path], on_bad_line="error")
    assert [text for _, _, text in docs] == texts
    assert stats.corrupt_streams == [] and stats.rejected == {}


def _two_members_second_damaged(tmp_path: Path) -> tuple[Path, list[str], bytes]:
    first, second = _texts(3_000, seed=5), _texts(20_000, seed=6)
    m1 = gzip.compress(_jsonl(first))
    m2 = gzip.compress(_jsonl(second))
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(m1 + _flip(m2, len(m2) // 2))
    return path, first, m1


def test_multi_member_gzip_with_a_damaged_second_member_keeps_the_first(
    tmp_path: Path,
) -> None:
    path, first, m1 = _two_members_second_damaged(tmp_path)
    sink = RejectSink(tmp_path / "rejected.jsonl")
    with sink:
        docs, stats = _read([path], rejects=sink)
    assert docs == [(0, i + 1, t) for i, t in enumerate(first)]
    (entry,) = stats.corrupt_streams
    assert (entry["kept_lines"], entry["byte"]) == (3_000, len(m1))
    (rec,) = [json.loads(x) for x in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert (rec["file"], rec["line"], rec["reason"]) == (str(path), 3_001, "corrupt_stream")
    assert base64.b64decode(rec["raw_b64"]) == b""
    assert f"gzip member 2 (from compressed byte {len(m1)})" in rec["detail"]


def test_error_names_file_line_and_compressed_byte(tmp_path: Path) -> None:
    path, _, m1 = _two_members_second_damaged(tmp_path)
    with pytest.raises(BadLineError) as info:
        _read([path], on_bad_line="error")
    err = info.value
    assert (err.file, err.line, err.reason) == (str(path), 3_001, "corrupt_stream")
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"{path}: corrupt compressed stream after line 3000 ")
    assert f"uncompressed byte {len(_jsonl(_texts(3_000, seed=5)))}" in message
    assert f"gzip member 2 (from compressed byte {len(m1)})" in message
    assert "--on-bad-line skip" in message


def test_a_line_running_into_a_damaged_member_is_not_kept(tmp_path: Path) -> None:
    texts = _texts(50, seed=7)
    payload = _jsonl(texts)
    cut = len(_jsonl(texts[:20])) + 30  # member 1 ends 30 bytes into line 21
    m1 = gzip.compress(payload[:cut])
    m2 = gzip.compress(payload[cut:])
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(m1 + m2[: len(m2) // 2])  # member 2 cut short
    docs, stats = _read([path])
    assert [text for _, _, text in docs] == texts[:20]  # no truncated_line for line 21 either
    assert stats.rejected == {"corrupt_stream": 1}
    assert stats.corrupt_streams[0]["kept_lines"] == 20
    assert stats.lines == 20


def test_zstd_frames_without_checksum_are_said_to_be_unverifiable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "n.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=False).compress(_jsonl(["a"])))
    with caplog.at_level(logging.INFO, logger="packcli.read"):
        docs, _ = _read([path])
    assert [text for _, _, text in docs] == ["a"]
    assert "1 zstd frame(s) carry no content checksum" in caplog.text


# --------------------------------------------------------------------------- the whole run


def _pack(inputs: Path, out: Path, toy_tokenizer_path: Path, *extra: Any) -> tuple[int, str]:
    return invoke("pack", inputs, "-t", toy_tokenizer_path, "-o", out, *SMALL, *extra)


def test_pack_reports_damaged_files_and_reruns_identically(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = " ".join(["the row of tokens"] * 3)
    first = [f"{i} {words}" for i in range(200)]
    second = [f"{i} {words} again" for i in range(200)]
    m1 = gzip.compress(_jsonl(first))
    m2 = gzip.compress(_jsonl(second))
    bad = corpus / "a.jsonl.gz"
    bad.write_bytes(m1 + _flip(m2, len(m2) // 2))
    (corpus / "b.jsonl").write_bytes(_jsonl(["the last file"]))

    code, output = _pack(corpus, tmp_path / "err", toy_tokenizer_path)
    assert code == 1
    assert f"{bad}: corrupt compressed stream after line 200 " in output
    assert f"gzip member 2 (from compressed byte {len(m1)})" in output

    out = tmp_path / "out"
    code, output = _pack(corpus, out, toy_tokenizer_path, "--on-bad-line", "skip")
    assert code == 0, output
    meta = json.loads((out / "packcli.json").read_text())
    report = meta["report"]["input"]
    assert report["documents"] == 201
    assert report["rejected"] == {"corrupt_stream": 1}
    (entry,) = report["corrupt_streams"]
    assert entry["file"] == str(bad.resolve())
    assert (entry["kept_lines"], entry["byte"]) == (200, len(m1))
    assert (out / "rejected.jsonl").is_file()
    code, verified = invoke("verify", out)
    assert code == 0, verified
    # Its garbled tail must not be compared with the output: encoding it again is skipped.
    assert "had a damaged compressed stream" in verified

    # The same command again (reusing shards), and from scratch elsewhere: the same bytes.
    files = {p.relative_to(out): sha256_file(p) for p in (out / "data").rglob("*.parquet")}
    code, output = _pack(corpus, out, toy_tokenizer_path, "--on-bad-line", "skip")
    assert code == 0, output
    assert json.loads((out / "packcli.json").read_text()) == meta
    fresh = tmp_path / "fresh"
    code, output = _pack(corpus, fresh, toy_tokenizer_path, "--on-bad-line", "skip")
    assert code == 0, output
    again = {p.relative_to(fresh): sha256_file(p) for p in (fresh / "data").rglob("*.parquet")}
    assert again == files


def test_a_clean_run_reports_no_corrupt_streams(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    # The field appears only when a file failed, so other reports keep their exact bytes.
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(["a clean file", "of two documents"])))
    code, output = _pack(path, tmp_path / "out", toy_tokenizer_path)
    assert code == 0, output
    report = json.loads((tmp_path / "out" / "packcli.json").read_text())["report"]["input"]
    assert "corrupt_streams" not in report


# --------------------------------------------------------------------------- --out in the input


def test_out_inside_the_input_folder_is_not_read_back(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(_jsonl(["one document", "and another"]) + b"{broken\n")
    out = corpus / "out"  # its rejected.jsonl (and work files) now lie inside the input folder
    args = ("--on-bad-line", "skip")
    code, output = _pack(corpus, out, toy_tokenizer_path, *args)
    assert code == 0, output
    first = json.loads((out / "packcli.json").read_text())
    assert (out / "rejected.jsonl").is_file()
    files = {p.relative_to(out): sha256_file(p) for p in (out / "data").rglob("*.parquet")}

    code, output = _pack(corpus, out, toy_tokenizer_path, *args)
    assert code == 0, output
    second = json.loads((out / "packcli.json").read_text())
    assert [f["path"] for f in second["run"]["inputs"]] == [str((corpus / "a.jsonl").resolve())]
    assert second["report"] == first["report"]
    assert second["report"]["input"]["rejected"] == {"invalid_json": 1}
    assert {p.relative_to(out): sha256_file(p) for p in (out / "data").rglob("*.parquet")} == files

    # Naming a file inside the output folder is refused, in one line.
    code, output = _pack(out / "rejected.jsonl", out, toy_tokenizer_path, *args)
    assert code == 1
    assert "rejected.jsonl' is inside" in output and "where packcli writes its output" in output
