"""The write stage's per-file records (packcli.stages.write_records): read back as written,
a damaged one refused naming file and field, and one of an older packcli (no ``version``)
not taken for a finished file: the file is written again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_pack
from corpora import pack_inputs
from hypothesis import given
from hypothesis import strategies as st

from packcli.records import OldRecordError, RecordError
from packcli.stages.write_records import FileClaim, FileRecord, TailShard, WriteSettings

file_records = st.builds(
    FileRecord,
    fingerprint=st.text("0123456789abcdef", min_size=64, max_size=64),
    file=st.text(min_size=1, max_size=30),
    rows=st.integers(0, 2**40),
    tokens=st.integers(0, 2**50),
    bytes=st.integers(0, 2**50),
    sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
    store_version=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=9)),
)


@given(file_records)
def test_a_file_record_reads_back_as_written(record: FileRecord) -> None:
    data = json.loads(json.dumps(record.to_json()))
    assert FileRecord.from_json(data, "write/long-00000.json") == record
    assert ("store_version" in data) == (record.store_version is not None)


@given(file_records)
def test_the_listing_is_the_record_without_its_bookkeeping(record: FileRecord) -> None:
    """What packcli.json lists of a file: not the version, fingerprint or store version."""
    data = record.to_json()
    expected = {k: data[k] for k in ("file", "rows", "tokens", "bytes", "sha256")}
    assert record.listing().to_json() == expected


@pytest.mark.parametrize("name", ["fingerprint", "file", "rows", "tokens", "bytes", "sha256"])
@given(record=file_records)
def test_a_missing_or_wrong_field_is_named_with_the_file(record: FileRecord, name: str) -> None:
    raw = record.to_json()
    del raw[name]
    with pytest.raises(RecordError, match=rf"^write/short-00003.json: field {name!r} missing"):
        FileRecord.from_json(raw, "write/short-00003.json")
    raw[name] = [1]
    with pytest.raises(RecordError, match=rf"^write/short-00003.json: field {name!r} is list"):
        FileRecord.from_json(raw, "write/short-00003.json")


@given(record=file_records)
def test_a_claim_or_an_old_record_is_not_a_finished_file(record: FileRecord) -> None:
    raw = record.to_json()
    del raw["version"]
    with pytest.raises(OldRecordError):
        FileRecord.from_json(raw, "write/long-00000.json")
    claim = FileClaim(file=record.file).to_json()
    with pytest.raises(RecordError, match="'fingerprint' missing"):
        FileRecord.from_json(claim, "write/long-00000.json")
    # Either still names the file packcli wrote (its own to replace).
    expected = record.file if "/" not in record.file else None
    assert FileClaim.named(raw) == FileClaim.named(claim) == expected


hexes = st.text("0123456789abcdef", min_size=64, max_size=64)
tail_shards = st.builds(
    TailShard,
    fingerprint=hexes,
    file=st.text(min_size=1, max_size=30),
    pieces=st.integers(0, 2**40),
    bytes=st.integers(0, 2**50),
    sha256=hexes,
)


@given(tail_shards)
def test_a_tail_shard_record_reads_back_and_an_older_one_is_refused(record: TailShard) -> None:
    data = json.loads(json.dumps(record.to_json()))
    assert TailShard.from_json(data, "write/tail-group-00001.json") == record
    del data["pieces"]
    with pytest.raises(RecordError, match=r"^write/tail-group-00001.json: field 'pieces'"):
        TailShard.from_json(data, "write/tail-group-00001.json")
    data.pop("version")
    with pytest.raises(OldRecordError):
        TailShard.from_json(data, "write/tail-group-00001.json")


def test_the_write_settings_read_back_and_need_an_object() -> None:
    settings = WriteSettings({"shard_tokens": 8192, "min_files": None})
    data = json.loads(json.dumps(settings.to_json()))
    assert data == {"version": 1, "write": {"shard_tokens": 8192, "min_files": None}}
    assert WriteSettings.from_json(data, "write/config.json") == settings
    with pytest.raises(RecordError, match=r"^write/config.json: field 'write' is list"):
        WriteSettings.from_json({**data, "write": [1]}, "write/config.json")


CONFIG = """
tokenize:
  shard_tokens: 4096
plan:
  short_len: 64
  long_len: 1024
write:
  shard_tokens: 8192
"""


def test_older_write_records_are_written_again(tmp_path: Path, toy_tokenizer_path: Path) -> None:
    """Write records without ``version`` whose sizes would fail the output if read: the rerun
    writes every file again (fresh records) and the output is the first run's."""
    corpus, cfg = pack_inputs(tmp_path, 300, 4, CONFIG)
    out = tmp_path / "out"
    first = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert first.returncode == 0, first.stderr
    expected = {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")}
    marker = (out / "packcli.json").read_bytes()
    records = sorted((out / ".packcli" / "write").glob("*-0*.json"))
    assert len(records) >= 2
    truth = {}
    for path in records:
        raw = json.loads(path.read_text())
        truth[path] = FileRecord.from_json(raw, path)
        del raw["version"]
        raw["rows"] += 5
        path.write_text(json.dumps(raw))
    (out / "packcli.json").unlink()  # the output is remade from the records
    again = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert again.returncode == 0, again.stderr
    for path, record in truth.items():
        assert FileRecord.from_json(json.loads(path.read_text()), path) == record
    assert {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")} == expected
    assert (out / "packcli.json").read_bytes() == marker
