"""Parquet and Arrow inputs the reader must not trust: a page failing its CRC, a page that
does not decode, a cut or extended file, offsets pointing outside their buffer, and text
that is not UTF-8. Nothing a failed check covers becomes a document: ``error`` names the
file and the rows, ``skip`` leaves exactly those rows out and says so (a ``corrupt_stream``
reject and ``input.corrupt_streams``, or ``invalid_utf8`` per row)."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import data_hashes, invoke
from test_read_columnar import _chat_tokenizer, tiny_units  # noqa: F401

from packcli.errors import InputError
from packcli.read import BadLineError, ReadOptions, ReadStats, RejectSink, iter_columnar

SMALL = ["--short-len", "64", "--long-len", "1024", "--quiet"]


def _texts(n: int) -> list[str]:
    return [f"row {i:04d} " + " ".join(["the words of a document"] * (1 + i % 5)) for i in range(n)]


def _read(
    path: Path, fmt: str, *, skip: bool = False, rejects: RejectSink | None = None, **kw: Any
) -> tuple[list[str], list[int], ReadStats]:
    stats = ReadStats()
    options = ReadOptions(batch_size=8, on_bad_line="skip" if skip else "error", rejects=rejects)
    texts: list[str] = []
    rows: list[int] = []
    for batch in iter_columnar([path], fmt, kw.pop("column", "text"), options, stats, **kw):
        texts += batch.texts
        rows += batch.position.tolist()
    return texts, rows, stats


def _crc_parquet(path: Path, texts: list[str], **kw: Any) -> None:
    """Page CRCs, no compression or dictionary: a row's text is in the file as it is."""
    table = pa.table({"text": texts, "id": list(range(len(texts)))})
    pq.write_table(
        table,
        path,
        row_group_size=100,
        compression=kw.pop("compression", "none"),
        use_dictionary=False,
        write_page_checksum=True,
        data_page_size=512,
        **kw,
    )


def _flip_in(path: Path, marker: bytes, offset: int = 2) -> None:
    blob = bytearray(path.read_bytes())
    at = blob.index(marker) + offset
    blob[at] ^= 0x01
    path.write_bytes(bytes(blob))


def _not_utf8(texts: list[str], bad: dict[int, bytes]) -> pa.Array:
    """A string array whose rows in ``bad`` hold those bytes (not UTF-8)."""
    values = [t.encode() for t in texts]
    for i, raw in bad.items():
        values[i] = raw
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return pa.StringArray.from_buffers(
        len(values),
        pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets)),
        pa.py_buffer(b"".join(values)),
    )


def _arrow(path: Path, columns: dict[str, pa.Array], *, stream: bool, per_batch: int) -> None:
    table = pa.table(columns)
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=per_batch):
            writer.write_batch(batch)


def _rejected(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- Parquet pages


@pytest.mark.parametrize("kind", ["plain", "dictionary", "snappy"])
def test_a_page_failing_its_crc_is_an_error_naming_file_and_rows(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c.parquet"
    texts = _texts(300)
    if kind == "plain":
        _crc_parquet(path, texts)
        _flip_in(path, b"row 0150 ")
    else:  # the flip in the middle of row group 1's text chunk (its dictionary: all of it)
        options = {"compression": "snappy"} if kind == "snappy" else {"use_dictionary": True}
        table = pa.table({"text": texts})
        pq.write_table(table, path, row_group_size=100, write_page_checksum=True, **options)
        chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        blob = bytearray(path.read_bytes())
        blob[start + chunk.total_compressed_size // 2] ^= 0x10
        path.write_bytes(bytes(blob))
    with pytest.raises(BadLineError) as err:
        _read(path, "parquet")
    assert err.value.reason == "corrupt_stream"
    message = str(err.value)
    assert message.startswith(f"{path}: rows ") and "(row group 1)" in message
    assert "CRC checksum verification failed" in message and "\n" not in message


def test_skip_leaves_out_the_rest_of_the_damaged_row_group(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    texts = _texts(300)
    _crc_parquet(path, texts)
    _flip_in(path, b"row 0150 ")
    sink = RejectSink(tmp_path / "rejected.jsonl")
    with sink:
        got, rows, stats = _read(path, "parquet", skip=True, rejects=sink)
    (entry,) = stats.corrupt_streams
    first, end = entry["rows"]
    assert 100 <= first <= 150 and end == 200  # verified pages before the bad one are kept
    assert entry["discarded_lines"] == end - first and entry["file"] == str(path)
    assert "row group 1" in entry["reason"]
    kept = [i for i in range(300) if not first <= i < end]
    assert rows == kept and got == [texts[i] for i in kept]  # never the altered text
    assert stats.rejected == {"corrupt_stream": 1}
    assert stats.documents == len(kept) and stats.lines == 300  # every row accounted for
    (record,) = [json.loads(x) for x in sink.path.read_text().splitlines()]
    assert (record["line"], record["reason"], record["raw_b64"]) == (first, "corrupt_stream", "")


def test_a_compressed_page_that_does_not_decode_is_damage(tmp_path: Path) -> None:
    """No CRC: a zstd page whose frame is damaged fails to decode, and says so cleanly."""
    path = tmp_path / "z.parquet"
    texts = _texts(300)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=100, compression="zstd")
    meta = pq.ParquetFile(path).metadata.row_group(2).column(0)
    blob = bytearray(path.read_bytes())
    frame = blob.index(b"\x28\xb5\x2f\xfd", meta.data_page_offset)  # the page's zstd frame
    blob[frame : frame + 4] = b"\0\0\0\0"
    path.write_bytes(bytes(blob))
    with pytest.raises(BadLineError, match=r"rows 200-299 \(row group 2\) fail the file's own"):
        _read(path, "parquet")
    got, rows, stats = _read(path, "parquet", skip=True)
    assert got == texts[:200] and rows == list(range(200))
    assert stats.corrupt_streams[0]["rows"] == [200, 300]


def test_a_row_group_unit_names_the_files_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    texts = _texts(300)
    _crc_parquet(path, texts)
    _flip_in(path, b"row 0250 ")
    assert _read(path, "parquet", groups=(0, 2))[0] == texts[:200]  # the damage is not in it
    got, rows, stats = _read(path, "parquet", skip=True, groups=(2, 3))
    first, end = stats.corrupt_streams[0]["rows"]
    assert 200 <= first <= 250 and end == 300
    assert rows == list(range(first - 200)) and got == texts[200:first]  # rows from the range


@pytest.mark.parametrize("cut", ["footer", "truncated", "magic"])
def test_a_damaged_footer_or_a_cut_file_is_one_clean_line(tmp_path: Path, cut: str) -> None:
    path = tmp_path / "c.parquet"
    _crc_parquet(path, _texts(300))
    blob = path.read_bytes()
    footer = int.from_bytes(blob[-8:-4], "little")
    if cut == "footer":  # thrift garbage where the file's metadata is
        blob = blob[: -8 - footer] + bytes([0xFF] * footer) + blob[-8:]
    elif cut == "truncated":
        blob = blob[: len(blob) // 2]
    else:
        blob = blob[:-4] + b"PAR0"
    path.write_bytes(blob)
    with pytest.raises(InputError, match=rf"^{path}: not a readable Parquet file: ") as err:
        _read(path, "parquet", skip=True)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- Arrow IPC


def _offset_damaged(path: Path, texts: list[str], *, stream: bool) -> None:
    """Four record batches of 25 rows; batch 1's offset for its row 3 points far outside."""
    _arrow(path, {"text": pa.array(texts)}, stream=stream, per_batch=25)
    batch = pa.array(texts[25:50])
    offsets = batch.buffers()[1].to_pybytes()
    blob = bytearray(path.read_bytes())
    at = blob.index(offsets, blob.index(offsets) + 1) + 4 * 3  # batch 0's are the same
    blob[at : at + 4] = struct.pack("<i", 1 << 28)
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("stream", [False, True])
def test_a_damaged_offset_is_damage_not_a_crash(tmp_path: Path, stream: bool) -> None:
    """Run in a child: without validation this reads outside the mapped file (SIGSEGV)."""
    path = tmp_path / "o.arrow"
    texts = _texts(100)
    _offset_damaged(path, texts, stream=stream)
    code = f"""
import sys
from pathlib import Path
from packcli.read import BadLineError, ReadOptions, ReadStats, iter_columnar
path = Path({str(path)!r})
try:
    list(iter_columnar([path], "arrow", "text"))
except BadLineError as exc:
    print("ERROR", exc)
stats = ReadStats()
got = [t for b in iter_columnar([path], "arrow", "text", ReadOptions(on_bad_line="skip"), stats)
       for t in b.texts]
print("ROWS", len(got), stats.corrupt_streams[0]["rows"])
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"ERROR {path}: rows 25-49 (record batch 1) fail the file's own")
    assert "Offset invariant failure" in lines[0]
    assert lines[1] == "ROWS 75 [25, 50]"  # the other batches are whole and sound


def test_a_stream_cut_at_a_batch_or_mid_batch_is_said_so(tmp_path: Path) -> None:
    texts = _texts(100)
    path = tmp_path / "s.arrow"
    _arrow(path, {"text": pa.array(texts)}, stream=True, per_batch=25)
    whole = path.read_bytes()
    assert whole.endswith(b"\xff\xff\xff\xff\0\0\0\0")
    path.write_bytes(whole[:-8])  # no end-of-stream marker: reads as a valid, shorter stream
    with pytest.raises(BadLineError, match=r"rows from 100 on \(the end of the stream\)"):
        _read(path, "arrow")
    got, _, stats = _read(path, "arrow", skip=True)
    assert got == texts and stats.corrupt_streams[0]["rows"] == [100, None]

    path.write_bytes(whole[: len(whole) * 3 // 4])  # mid-batch
    with pytest.raises(BadLineError, match=r"rows from (50|75) on \(record batch [23]\)"):
        _read(path, "arrow")
    got, _, stats = _read(path, "arrow", skip=True)
    assert got == texts[: len(got)] and len(got) in (50, 75)
    assert stats.corrupt_streams[0]["discarded_lines"] is None  # how many: unknown

    path.write_bytes(whole + whole)  # a second stream after the first one's marker
    with pytest.raises(BadLineError, match=r"follow the end-of-stream marker"):
        _read(path, "arrow")


def test_a_cut_arrow_file_is_one_clean_line(tmp_path: Path) -> None:
    path = tmp_path / "f.arrow"
    _arrow(path, {"text": pa.array(_texts(100))}, stream=False, per_batch=25)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(InputError, match=rf"^{path}: not a readable Arrow IPC file: "):
        _read(path, "arrow", skip=True)


def test_a_save_to_disk_shard_cut_short_is_not_read_as_complete(tmp_path: Path) -> None:
    import datasets

    texts = _texts(60)
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    (shard,) = (tmp_path / "ds").glob("*.arrow")
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(BadLineError, match="end-of-stream marker"):
        _read(shard, "arrow")


# --------------------------------------------------------------------------- not UTF-8


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_text_that_is_not_utf8_is_rejected_row_by_row(tmp_path: Path, fmt: str) -> None:
    texts = _texts(40)
    bad = {3: b"caf\xe9 latin-1", 17: b"cut \xe2\x82", 30: b"\xff\xfe"}
    column = _not_utf8(texts, bad)
    path = tmp_path / f"u.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": column}), path, row_group_size=16)
    else:
        _arrow(path, {"text": column}, stream=False, per_batch=16)
    with pytest.raises(BadLineError) as err:
        _read(path, fmt)
    assert str(err.value) == (
        f"{path}: row 3: field 'text' holds invalid UTF-8 at byte 4: invalid continuation byte (e9)"
    )
    assert err.value.reason == "invalid_utf8"
    sink = RejectSink(tmp_path / "rejected.jsonl")
    with sink:
        got, rows, stats = _read(path, fmt, skip=True, rejects=sink)
    assert rows == [i for i in range(40) if i not in bad]
    assert got == [texts[i] for i in rows]
    assert stats.rejected == {"invalid_utf8": 3} and stats.lines == 40
    records = [json.loads(x) for x in sink.path.read_text().splitlines()]
    assert [r["line"] for r in records] == [3, 17, 30]
    for record, raw in zip(records, bad.values(), strict=True):
        value = json.loads(base64.b64decode(record["raw_b64"]))["text"]
        assert value.encode("utf-8", "surrogateescape") == raw  # the bytes survive


def test_a_binary_text_column_is_read_as_utf8(tmp_path: Path) -> None:
    """Parquet written without the UTF8 annotation: the bytes are the text."""
    texts = _texts(20)
    values = [t.encode() for t in texts]
    values[5] = b"\xc3\x28 not utf-8"
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": pa.array(values, pa.binary())}), path)
    with pytest.raises(BadLineError, match=r"row 5: field 'text' holds invalid UTF-8 at byte 1"):
        _read(path, "parquet")
    got, rows, _ = _read(path, "parquet", skip=True)
    assert got == texts[:5] + texts[6:] and 5 not in rows


# --------------------------------------------------------------------------- the whole run


def _pack(inputs: Path, out: Path, tok: Path, *extra: Any) -> tuple[int, str]:
    return invoke("pack", inputs, "-t", tok, "-o", out, *SMALL, *extra)


def test_pack_refuses_a_crc_failure_and_skip_leaves_exactly_it_out(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    texts = _texts(300)
    path = tmp_path / "in" / "c.parquet"
    path.parent.mkdir()
    _crc_parquet(path, texts)
    _flip_in(path, b"row 0150 ")
    code, output = _pack(path, tmp_path / "err", toy_tokenizer_path)
    assert code == 1, output
    assert f"{path}: rows " in output and "CRC checksum verification failed" in output

    out = tmp_path / "out"
    code, output = _pack(path, out, toy_tokenizer_path, "--on-bad-line", "skip")
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]["input"]
    (entry,) = report["corrupt_streams"]
    first, end = entry["rows"]
    assert entry["file"] == str(path) and end == 200 and 100 <= first <= 150
    assert report["rejected"] == {"corrupt_stream": 1}
    assert report["documents"] == 300 - (end - first)
    assert [r["reason"] for r in _rejected(out)] == ["corrupt_stream"]
    # What was kept is exactly the undamaged rows: the same bytes as those rows as jsonl.
    ref_in = tmp_path / "ref.jsonl"
    kept = [t for i, t in enumerate(texts) if not first <= i < end]
    ref_in.write_text("".join(json.dumps({"text": t}) + "\n" for t in kept))
    code, output = _pack(ref_in, tmp_path / "ref", toy_tokenizer_path)
    assert code == 0, output
    assert data_hashes(out) == data_hashes(tmp_path / "ref")
    code, verified = invoke("verify", out)
    assert code == 0, verified


def test_pack_rejects_rows_that_are_not_utf8(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    texts = _texts(40)
    path = tmp_path / "in" / "u.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": _not_utf8(texts, {7: b"\xff bad"})}), path)
    code, output = _pack(path, tmp_path / "err", toy_tokenizer_path)
    assert code == 1
    assert f"{path}: row 7: field 'text' holds invalid UTF-8 at byte 1" in output
    assert "Traceback" not in output
    out = tmp_path / "out"
    code, output = _pack(path, out, toy_tokenizer_path, "--on-bad-line", "skip")
    assert code == 0, output
    assert [(r["line"], r["reason"]) for r in _rejected(out)] == [(7, "invalid_utf8")]
    report = json.loads((out / "packcli.json").read_text())["report"]["input"]
    assert report["documents"] == 39 and report["rejected"] == {"invalid_utf8": 1}


def test_pack_of_an_arrow_file_with_a_damaged_offset_exits_cleanly(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "in" / "o.arrow"
    path.parent.mkdir()
    _offset_damaged(path, _texts(100), stream=False)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    base = [sys.executable, "-m", "packcli", "pack", str(path), "-t", str(toy_tokenizer_path)]
    base += [str(a) for a in SMALL]
    done = subprocess.run(
        [*base, "-o", str(tmp_path / "err")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"{path}: rows 25-49 (record batch 1)" in done.stderr + done.stdout
    out = tmp_path / "out"
    done = subprocess.run(
        [*base, "-o", str(out), "--on-bad-line", "skip"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "packcli.json").read_text())["report"]["input"]
    assert report["documents"] == 75 and report["corrupt_streams"][0]["rows"] == [25, 50]


def _dialogues(n: int) -> list[list[dict[str, str]]]:
    return [
        [
            {"role": "user", "content": f"question {i} the answer"},
            {"role": "assistant", "content": f"the answer is {i}"},
        ]
        for i in range(n)
    ]


def _messages_with_bad_content(rows: list[list[dict[str, str]]], bad_row: int) -> pa.Array:
    """The dialogues as list<struct<role, content>>, one content of ``bad_row`` not UTF-8."""
    contents = [m["content"] for row in rows for m in row]
    bad_at = sum(len(row) for row in rows[:bad_row]) + 1
    content = _not_utf8(contents, {bad_at: b"the answer \xed\xa0\x80"})
    roles = pa.array([m["role"] for row in rows for m in row])
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    structs = pa.StructArray.from_arrays([roles, content], names=["role", "content"])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), structs)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_chat_messages_that_are_not_utf8_are_rejected_row_by_row(tmp_path: Path, fmt: str) -> None:
    tok = _chat_tokenizer(tmp_path / "tok")
    rows = _dialogues(30)
    path = tmp_path / "in" / f"c.{fmt}"
    path.parent.mkdir()
    messages = _messages_with_bad_content(rows, 12)
    if fmt == "parquet":
        pq.write_table(pa.table({"messages": messages}), path, row_group_size=8)
    else:
        _arrow(path, {"messages": messages}, stream=True, per_batch=8)
    args = ["pack", path, "-t", tok, "--format", "chat", "--chat-template", "chatml", "-q"]
    args += ["--short-len", "64", "--long-len", "256"]
    code, output = invoke(*args, "-o", tmp_path / "e")
    assert code == 1, output
    assert f"{path}: row 12: field 'messages' holds invalid UTF-8 at byte 12 of one of" in output
    out = tmp_path / "s"
    code, output = invoke(*args, "-o", out, "--on-bad-line", "skip")
    assert code == 0, output
    (record,) = _rejected(out)
    assert (record["line"], record["reason"]) == (12, "invalid_utf8")
    value = json.loads(base64.b64decode(record["raw_b64"]))["messages"]
    assert value[1]["content"].encode("utf-8", "surrogateescape") == b"the answer \xed\xa0\x80"
    report = json.loads((out / "packcli.json").read_text())["report"]["input"]
    assert report["documents"] == 29


def test_a_failing_remote_read_is_a_read_error_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store's plain ``OSError`` mid-file says nothing about the data: never skipped."""
    path = tmp_path / "c.parquet"
    _crc_parquet(path, _texts(300))
    blob = path.read_bytes()

    class Flaky(io.BytesIO):
        reads = 0

        def read(self, *args: Any) -> bytes:
            Flaky.reads += 1
            if Flaky.reads > 3:
                raise OSError("connection reset by peer")  # no errno, as s3fs raises them
            return super().read(*args)

    monkeypatch.setattr("packcli.fs.reading.open_binary", lambda *_: Flaky(blob))
    with pytest.raises(InputError, match=r"read error after row \d+: OSError: connection reset"):
        _read("s3://bucket/c.parquet", "parquet", skip=True)  # type: ignore[arg-type]


@pytest.mark.usefixtures("tiny_units")
def test_row_group_units_after_a_damaged_one_keep_the_files_row_numbers(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """A unit that left rows out still counts them, so the next unit's rows (its rejects,
    the largest document's row) are the file's own."""
    texts = _texts(400)
    path = tmp_path / "in" / "c.parquet"
    path.parent.mkdir()
    column = _not_utf8(texts, {333: b"\xff in a later unit"})
    table = pa.table({"text": column})
    pq.write_table(
        table,
        path,
        row_group_size=100,
        compression="none",
        use_dictionary=False,
        write_page_checksum=True,
        data_page_size=512,
    )
    _flip_in(path, b"row 0120 ")
    out = tmp_path / "out"
    code, output = _pack(
        path, out, toy_tokenizer_path, "--on-bad-line", "skip", "--split-bytes", 20000
    )
    assert code == 0, output
    meta = json.loads((out / "packcli.json").read_text())
    stage = json.loads((out / ".packcli" / "tokens" / "stage.json").read_text())
    assert [u["row_groups"] for u in stage["units"]] == [[0, 2], [2, 4]]
    records = _rejected(out)
    (entry,) = meta["report"]["input"]["corrupt_streams"]
    first, end = entry["rows"]
    assert end == 200 and 100 <= first <= 120
    assert [(r["line"], r["reason"]) for r in records] == [
        (first, "corrupt_stream"),
        (333, "invalid_utf8"),
    ]


# --------------------------------------------------------------------------- the checks alone


def test_rows_finds_the_rows_that_are_not_utf8_and_refuses_broken_offsets() -> None:
    from packcli.read.columnar_integrity import Broken, rows

    array = _not_utf8(["a", "b", "c"], {1: b"\xc3"})
    values, bad = rows(array)
    assert values == ["a", "\udcc3", "c"] and list(bad) == [1]
    assert bad[1].startswith("invalid UTF-8 at byte 1: unexpected end of data (c3)")
    assert rows(pa.array(["x", None])) == (["x", None], {})
    # A large_string and a binary_view-free nested column go the same way.
    values, bad = rows(
        _not_utf8(["a", "b"], {0: b"\xff"}).cast(pa.large_binary()).view(pa.large_string())
    )
    assert list(bad) == [0]
    nested = _messages_with_bad_content(_dialogues(3), 2)
    values, bad = rows(nested)
    assert list(bad) == [2] and "of one of its strings" in bad[2]
    assert values[0] == _dialogues(3)[0]
    offsets = struct.pack("<3i", 0, 1 << 20, 2)
    broken = pa.StringArray.from_buffers(2, pa.py_buffer(offsets), pa.py_buffer(b"ab"))
    with pytest.raises(Broken, match="offset"):
        rows(broken)


def test_damage_is_told_from_read_errors() -> None:
    from packcli.fs import ReadFailed
    from packcli.read.columnar_integrity import is_damage

    assert is_damage(OSError("CRC checksum verification failed"))  # pyarrow's, no errno
    assert is_damage(pa.ArrowInvalid("Offset invariant failure"))
    assert not is_damage(OSError(5, "Input/output error"))  # a failed system call
    assert not is_damage(ConnectionResetError("reset"))
    assert not is_damage(ReadFailed("OSError: connection reset"))
