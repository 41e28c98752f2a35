"""The tokenize stage's records (packcli.tokenize.records): each one read back as written,
a damaged one refused naming its file and field, and a work folder of an older packcli (no
``version``) tokenized again instead of read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from clirun import invoke, run_pack
from corpora import pack_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packcli.config import RunConfig
from packcli.errors import PackcliError
from packcli.records import OldRecordError, RecordError, parse_record, read_record
from packcli.stages.index import index_tokens
from packcli.tokenize.records import (
    BACKEND,
    SUCCESS,
    UNIT_STAMP,
    BackendChoice,
    IndexedShard,
    ShardIndex,
    ShardManifest,
    SourceCount,
    SourceSpec,
    StageRecord,
    UnitRecord,
    UnitStamp,
)

names = st.text("abcdefghij_", min_size=1, max_size=8)
scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8)
objects = st.dictionaries(names, scalars, max_size=4)
object_lists = st.lists(objects, max_size=3)
counts = st.dictionaries(names, st.integers(0, 2**40), max_size=4)
seconds = st.dictionaries(names, st.floats(0, 1e6, allow_nan=False), max_size=4)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
token_ids = st.none() | st.integers(0, 2**31)
specs = st.builds(SourceSpec, name=names, text_field=names, bos=token_ids, eos=token_ids)
source_counts = st.builds(
    SourceCount,
    name=names,
    text_field=names,
    bos=token_ids,
    eos=token_ids,
    first_doc=st.integers(0, 2**40),
    documents=st.integers(0, 2**40),
    tokens=st.integers(0, 2**50),
)

shard_files = st.text("abcdefghij_-./", min_size=1, max_size=20)
manifest_fields = {
    "file": shard_files,
    "num_docs": st.integers(0, 2**40),
    "num_tokens": st.integers(0, 2**40),
    "first_doc_index": st.integers(0, 2**40),
    "last_doc_index": st.integers(0, 2**40),
    "sha256": digests,
    "bytes": st.integers(0, 2**40),
}
manifests = st.builds(ShardManifest, **manifest_fields)
indexed_shards = st.builds(
    IndexedShard,
    **manifest_fields,
    first_doc_id=st.integers(0, 2**40),
    first_line=st.integers(0, 2**40),
    file_index=st.integers(0, 2**31),
    tokenized_file_index=st.integers(0, 2**31),
    source=st.none() | st.integers(0, 100),
)

stage_records = st.builds(
    StageRecord,
    fingerprint=digests,
    settings=objects,
    tokenizer=objects,
    config=objects,
    files=object_lists,
    units=object_lists,
    sources=st.none() | st.lists(specs, max_size=3),
)
unit_records = st.builds(
    UnitRecord,
    fingerprint=digests,
    path=st.text(max_size=20),
    span=st.none() | st.lists(st.integers(0, 2**40), min_size=2, max_size=2),
    file_index=st.integers(0, 2**31),
    num_docs=st.integers(0, 2**40),
    num_tokens=st.integers(0, 2**40),
    shards=st.lists(manifests, max_size=3),
    read_stats=objects,
    chat=st.none() | counts,
    special_strings=counts,
    times=seconds,
    preference=st.none() | counts,
)
shard_indexes = st.builds(
    ShardIndex,
    fingerprint=digests,
    files=object_lists,
    shards=st.lists(indexed_shards, max_size=3),
    read_stats=objects,
    chat=st.none() | counts,
    special_strings=counts,
    units=object_lists,
    times=seconds,
    tokens=st.integers(0, 2**50),
    tokenizer=objects,
    backend=objects,
    preference=st.none() | counts,
    sources=st.none() | st.lists(source_counts, max_size=3),
)
records = stage_records | unit_records | shard_indexes
STRATEGY: dict[type, st.SearchStrategy[Any]] = {
    StageRecord: stage_records,
    UnitRecord: unit_records,
    ShardIndex: shard_indexes,
}


@given(records)
def test_a_record_reads_back_as_written(record: Any) -> None:
    data = json.loads(json.dumps(record.to_json()))
    assert data["version"] == 1
    assert type(record).from_json(data, "tokens/x.json") == record


@given(unit_records | shard_indexes)
def test_preference_and_sources_appear_only_when_set(record: Any) -> None:
    """Text outputs' records keep the keys they had: ``preference`` (and ``sources``) only
    when there are some; ``chat`` always (null for text)."""
    data = record.to_json()
    assert ("preference" in data) == (record.preference is not None)
    assert "chat" in data
    if isinstance(record, ShardIndex):
        assert ("sources" in data) == (record.sources is not None)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _required(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]


@pytest.mark.parametrize("cls", [StageRecord, UnitRecord, ShardIndex])
@given(data=st.data())
def test_a_missing_field_is_named_with_the_file(cls: type, data: st.DataObject) -> None:
    record = data.draw(STRATEGY[cls])
    name = data.draw(st.sampled_from(_required(cls)))
    raw = record.to_json()
    del raw[name]
    with pytest.raises(RecordError) as caught:
        cls.from_json(raw, Path("work/tokens/files/u0/_SUCCESS.json"))
    assert "work/tokens/files/u0/_SUCCESS.json" in str(caught.value)
    assert repr(name) in str(caught.value) and "missing" in str(caught.value)


WRONG: dict[str, object] = {
    "fingerprint": 12,
    "settings": [],
    "tokenizer": "hf",
    "config": None,
    "files": {},
    "units": 3,
    "sources": "all",
    "path": ["a"],
    "span": "0-10",
    "file_index": True,  # a JSON boolean is not a count
    "num_docs": "7",
    "num_tokens": 1.5,
    "shards": None,
    "read_stats": [],
    "chat": [1],
    "special_strings": [],
    "times": 0,
    "preference": "yes",
    "backend": None,
    "tokens": "many",
}


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls in (StageRecord, UnitRecord, ShardIndex) for name in _fields(cls)],
)
@given(data=st.data())
def test_a_field_of_the_wrong_type_is_named_with_the_file(
    cls: type, name: str, data: st.DataObject
) -> None:
    raw = data.draw(STRATEGY[cls]).to_json()
    raw[name] = WRONG[name]
    with pytest.raises(RecordError) as caught:
        cls.from_json(raw, "w/tokens/stage.json")
    message = str(caught.value)
    assert message.startswith("w/tokens/stage.json: ") and f"field {name!r}" in message
    assert type(WRONG[name]).__name__ in message


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
@given(record=records)
def test_a_record_of_another_version_is_refused(record: Any, version: object) -> None:
    raw = record.to_json()
    if version is None:
        del raw["version"]  # written before records had versions
    else:
        raw["version"] = version
    with pytest.raises(OldRecordError, match="record version"):
        type(record).from_json(raw, "tokens/_SUCCESS.json")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=unit_records)
def test_read_record_is_none_for_what_must_be_redone(tmp_path: Path, record: UnitRecord) -> None:
    path = tmp_path / SUCCESS
    path.unlink(missing_ok=True)
    assert read_record(UnitRecord, path) is None  # missing
    path.write_text("{not json")
    assert read_record(UnitRecord, path) is None
    path.write_text(json.dumps({"fingerprint": "f", "shards": []}))  # an older packcli's
    assert read_record(UnitRecord, path) is None
    path.write_text(json.dumps(record.to_json()))
    assert read_record(UnitRecord, path) == record


CONFIG = """
tokenize:
  shard_tokens: 4096
plan:
  short_len: 64
  long_len: 1024
read:
  split_bytes: 40000
"""


def test_an_older_work_folder_is_tokenized_again_not_misread(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    """Every record of the tokenize stage without its ``version`` (as an older packcli wrote
    them) and with counts that would change the output if read: the rerun tokenizes every
    unit again, rewrites the records, and its output is the first run's."""
    corpus, cfg = pack_inputs(tmp_path, 300, 3, CONFIG)
    out = tmp_path / "out"
    first = run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True)
    assert first.returncode == 0, first.stderr
    expected = {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")}
    report = json.loads((out / "packcli.json").read_text())["report"]
    tokens = out / ".packcli" / "tokens"
    unit_files = sorted(tokens.glob(f"files/*/{SUCCESS}"))
    assert len(unit_files) >= 3  # byte spans: several units
    true_docs = {}
    for path in [tokens / "stage.json", tokens / SUCCESS, *unit_files]:
        raw = json.loads(path.read_text())
        del raw["version"]
        if "num_docs" in raw:
            true_docs[path] = raw["num_docs"]
            raw["num_docs"] += 7
        path.write_text(json.dumps(raw))
    again = run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True)
    assert again.returncode == 0, again.stderr
    assert "reusing tokenized shards" not in again.stderr
    for path, docs in true_docs.items():
        record = UnitRecord.from_json(json.loads(path.read_text()), path)
        assert record.num_docs == docs
    ShardIndex.from_json(json.loads((tokens / SUCCESS).read_text()), tokens / SUCCESS)
    assert {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")} == expected
    assert json.loads((out / "packcli.json").read_text())["report"] == report


def test_damaged_records_without_a_version_are_redone_not_misread(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    """``backend.json`` with a field of the wrong type, a unit's ``fingerprint.json`` and
    another's first shard manifest each with one (their completion records gone, as after a
    kill): the rerun chooses the backend again and tokenizes both units from their start, to
    the first run's bytes. The index refuses a damaged ``backend.json``, naming it."""
    corpus, cfg = pack_inputs(tmp_path, 300, 3, CONFIG)
    out = tmp_path / "out"
    assert run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True).returncode == 0
    expected = {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")}
    tokens = out / ".packcli" / "tokens"
    backend = tokens / BACKEND
    chosen = json.loads(backend.read_text())
    backend.write_text(json.dumps({**chosen, "backend": 3}))
    first, second = sorted(p for p in (tokens / "files").iterdir())[:2]
    (first / UNIT_STAMP).write_text(json.dumps({"fingerprint": 5}))
    manifest = json.loads((second / "shard-00000.json").read_text())
    (second / "shard-00000.json").write_text(json.dumps({**manifest, "sha256": None}))
    for unit in (first, second):
        (unit / SUCCESS).unlink()
    (tokens / SUCCESS).unlink()
    again = run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(backend.read_text()) == chosen
    assert UnitStamp.from_json(json.loads((first / UNIT_STAMP).read_text()), first)
    assert json.loads((second / "shard-00000.json").read_text())["sha256"] == manifest["sha256"]
    assert {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")} == expected

    backend.write_text(json.dumps({"requested": "auto"}))
    (tokens / SUCCESS).unlink()
    with pytest.raises(PackcliError, match=f"{backend}: .*'backend' missing"):
        index_tokens(RunConfig(out=str(out)))


@pytest.mark.parametrize("cls", [BackendChoice, UnitStamp, ShardManifest, IndexedShard])
def test_a_record_without_a_version_names_its_file_and_field(cls: type) -> None:
    raw = {f.name: "x" for f in dataclasses.fields(cls)}
    name = dataclasses.fields(cls)[0].name
    raw[name] = 12 if cls is not ShardManifest else None
    with pytest.raises(RecordError, match=f"^w/tokens/x.json: field {name!r} is "):
        cls.from_json(raw, "w/tokens/x.json")


@given(entry=indexed_shards)
def test_an_index_entry_keeps_the_keys_the_index_wrote(entry: IndexedShard) -> None:
    """An index entry is its shard's manifest, then where the shard is in the run, in the
    order the index always wrote them; ``source`` only for a mixture's."""
    data = entry.to_json()
    assert list(data) == [f.name for f in dataclasses.fields(ShardManifest)] + [
        "first_doc_id",
        "first_line",
        "file_index",
        "tokenized_file_index",
        *(["source"] if entry.source is not None else []),
    ]


@pytest.mark.parametrize("cls", [UnitRecord, ShardIndex])
@given(data=st.data())
def test_a_shard_entry_missing_a_field_is_named_and_redone(cls: type, data: st.DataObject) -> None:
    """A shard's manifest in a unit record, or its entry in the index, without one of its
    fields: the record is refused naming the file and the entry's field, so the readers
    that redo work (``read_record``: the unit tokenized again, the index rebuilt) redo it."""
    record = data.draw(STRATEGY[cls].filter(lambda r: r.shards))
    entry = IndexedShard if cls is ShardIndex else ShardManifest
    name = data.draw(st.sampled_from(_required(entry)))
    raw = record.to_json()
    k = data.draw(st.integers(0, len(raw["shards"]) - 1))
    del raw["shards"][k][name]
    path = "w/tokens/_SUCCESS.json"
    with pytest.raises(RecordError) as caught:
        cls.from_json(raw, path)
    assert str(caught.value).startswith(f"{path}: field 'shards[{k}].{name}' missing")
    assert parse_record(cls, raw, path) is None


def test_a_damaged_index_entry_is_rebuilt_and_refused_by_verify(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    """The index (``tokens/_SUCCESS.json``) with a shard entry missing a field (it read as
    an index before its entries were typed, and then failed with a KeyError or skipped the
    shard's sha256 check): ``verify`` refuses it, naming the file and the field, and the
    same pack rebuilds it from the units' records, to the same bytes and output."""
    corpus, cfg = pack_inputs(tmp_path, 300, 3, CONFIG)
    out = tmp_path / "out"
    assert run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True).returncode == 0
    expected = {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")}
    marker = (out / "packcli.json").read_bytes()
    index = out / ".packcli" / "tokens" / SUCCESS
    written = index.read_bytes()
    for name in ("sha256", "first_doc_id"):
        raw = json.loads(written)
        assert len(raw["shards"]) >= 2
        del raw["shards"][1][name]
        index.write_text(json.dumps(raw))
        code, output = invoke("verify", out)
        assert code != 0
        assert str(index) in output and f"'shards[1].{name}' missing" in output
        again = run_pack(corpus, toy_tokenizer_path, out, cfg, spans=True)
        assert again.returncode == 0, again.stderr
        assert index.read_bytes() == written
        assert {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")} == expected
        assert (out / "packcli.json").read_bytes() == marker
