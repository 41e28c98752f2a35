"""The plan stage's records (packcli.stages.plan_records): read back as written, a damaged
one refused naming file and field, and a work folder of an older packcli (records without
``version``) planned again, never misread: the output is the first run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_pack
from corpora import pack_inputs
from hypothesis import given
from hypothesis import strategies as st

from packcli.atomic import json_bytes
from packcli.errors import PackcliError
from packcli.publish.marker import Marker
from packcli.records import OldRecordError, RecordError
from packcli.stages.plan import load_plan
from packcli.stages.plan_records import GroupRecord, PlanPart, PlanRecord
from packcli.stages.write_records import TailShard
from packcli.tokenize.shards import TokenShards

hexes = st.text("0123456789abcdef", min_size=64, max_size=64)
counts = st.integers(0, 2**40)
ranges = st.lists(st.tuples(counts, counts), max_size=3)
per_config = st.fixed_dictionaries({"long": counts, "short": counts})
parts = st.builds(
    PlanPart,
    name=st.sampled_from(["group-00000", "group-00012", "tail"]),
    shards=st.lists(counts, max_size=4).map(tuple),
    files=st.fixed_dictionaries({"long": ranges, "short": ranges}),
    rows=per_config,
    tokens=per_config,
    tail_pieces=counts,
    content_sha256=hexes,
)
stats = st.dictionaries(st.text("abc_", min_size=1, max_size=6), counts, max_size=4)


@given(parts, stats, st.dictionaries(st.text(min_size=1, max_size=9), st.tuples(counts, hexes)))
def test_a_group_record_reads_back_as_written(
    part: PlanPart, stats: dict[str, int], files: dict[str, tuple[int, str]]
) -> None:
    record = GroupRecord(fingerprint="f" * 64, part=part, stats=stats, files=files)
    data = json.loads(json.dumps(record.to_json()))
    assert GroupRecord.from_json(data, "plan/group-00000.json") == record
    del data["part"]["tail_pieces"]
    with pytest.raises(RecordError, match=r"^plan/group-00000.json: field 'part.tail_pieces'"):
        GroupRecord.from_json(data, "plan/group-00000.json")


@given(st.lists(parts, min_size=1, max_size=3), st.none() | counts, st.none() | st.just("x"))
def test_a_plan_record_reads_back_as_written(
    plan_parts: list[PlanPart], min_files: int | None, cost_model: str | None
) -> None:
    record = PlanRecord(
        content_sha256="a" * 64,
        fingerprint="b" * 64,
        tokens_fingerprint="c" * 64,
        stats={"documents": 3},
        plan={"short_len": 64},
        write_shard_tokens=8192,
        write_min_files=min_files,
        write_cost_model=cost_model,
        parts=tuple(plan_parts),
    )
    data = json.loads(json.dumps(record.to_json()))
    assert PlanRecord.from_json(data, "plan.json") == record
    data["parts"][0]["files"]["long"] = [[1, 2, 3]]
    with pytest.raises(RecordError, match=r"field 'parts\[0\].files.long\[0\]' is list"):
        PlanRecord.from_json(data, "plan.json")
    del data["version"]
    with pytest.raises(OldRecordError):
        PlanRecord.from_json(data, "plan.json")


CONFIG = """
read:
  batch_size: 16
tokenize:
  shard_tokens: 1024
plan:
  short_len: 128
  long_len: 1024
  group_tokens: 4096
"""


def _as_older(path: Path, edit: str, by: int) -> None:
    """``path`` as an older packcli wrote it (no version), with a count that would change
    the output if it were read."""
    raw = json.loads(path.read_text())
    del raw["version"]
    where = raw
    *keys, last = edit.split(".")
    for key in keys:
        where = where[key]
    where[last] += by
    path.write_text(json.dumps(raw))


def test_an_older_plan_is_planned_again(tmp_path: Path, toy_tokenizer_path: Path) -> None:
    corpus, cfg = pack_inputs(tmp_path, 400, 7, CONFIG)
    out = tmp_path / "out"
    first = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert first.returncode == 0, first.stderr
    work = out / ".packcli"
    expected = {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")}
    marker = (out / "packcli.json").read_bytes()
    groups = sorted((work / "plan").glob("group-*.json"))
    tails = sorted((work / "write").glob("tail-*.json"))
    assert len(groups) >= 2 and len(tails) == len(groups)  # several groups and the tail
    truth = {p: GroupRecord.from_json(json.loads(p.read_text()), p) for p in groups}
    tail_truth = {p: TailShard.from_json(json.loads(p.read_text()), p) for p in tails}
    for path in groups:
        _as_older(path, "stats.documents", 7)
    for path in tails:
        _as_older(path, "pieces", 1)
    _as_older(work / "plan.json", "write_shard_tokens", 1)
    with pytest.raises(PackcliError, match="of another packcli"):
        load_plan(work, TokenShards(work / "tokens"))
    (out / "packcli.json").unlink()  # the output is remade from the records
    again = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert again.returncode == 0, again.stderr
    for path, record in truth.items():
        assert GroupRecord.from_json(json.loads(path.read_text()), path) == record
    for path, tail in tail_truth.items():
        assert TailShard.from_json(json.loads(path.read_text()), path) == tail
    assert {p.name: p.read_bytes() for p in out.glob("data/*/*.parquet")} == expected
    assert (out / "packcli.json").read_bytes() == marker
    # packcli.json's typed reader gives back its bytes (what finalize writes through it).
    assert json_bytes(Marker.from_json(json.loads(marker), "packcli.json").to_json()) == marker
