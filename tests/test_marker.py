"""packcli.publish.marker: the one reader of ``packcli.json``, at its three strengths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from packcli.atomic import json_bytes
from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES
from packcli.publish import marker, stats


@pytest.mark.parametrize("body", [None, b"\xff\xfe", b"{not json", b"[1, 2]"])
def test_peek_marker_says_nothing_for_a_missing_or_foreign_file(
    tmp_path: Path, body: bytes | None
) -> None:
    if body is not None:
        (tmp_path / "packcli.json").write_bytes(body)
    assert marker.peek_marker(tmp_path) == {}
    with pytest.raises(VerifyError, match=r"packcli\.json"):
        marker.read_marker(tmp_path)


def test_load_marker_returns_any_json_and_raises_on_no_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        marker.load_marker(tmp_path)
    (tmp_path / "packcli.json").write_text('{"run": {"packcli_version": "x"}}')
    assert marker.load_marker(tmp_path) == marker.peek_marker(tmp_path)
    assert marker.peek_marker(tmp_path)["run"] == {"packcli_version": "x"}


def test_stats_refuses_a_folder_without_packcli_json() -> None:
    with pytest.raises(VerifyError, match=r"no packcli\.json"):
        stats.read_meta(Path("/nonexistent-packcli-output"))


def _marker() -> dict[str, Any]:
    """A packcli.json as finalize writes it, cut to what every reader needs, plus extras."""
    listing = {"file": "train-00000-of-00001.parquet", "rows": 2, "tokens": 9, "bytes": 5}
    return {
        "config": {"plan": {"short_len": 64, "long_len": 1024, "overlong": "split", "seed": 0}},
        "run": {"tokenizer": {"vocab_size": 300, "eos_id": 0}, "work_dir": ".packcli"},
        "report": {
            "input": {"tokens": 9, "documents": 1},
            "policy": dict.fromkeys(
                [f"{w}_{n}" for w in ("split", "truncated", "dropped") for n in ("docs", "tokens")]
                + ["split_pieces", "empty_docs"],
                0,
            ),
            "tiers": {
                name: {"rows": 2, "tokens": 9, "segments": 1, "capacity": 64}
                for name in CONFIG_NAMES
            },
        },
        "files": {name: [{**listing, "sha256": "a" * 64}] for name in CONFIG_NAMES},
        "parts": [
            {"name": "group-00000", "shards": [0], "files": {"long": [0, 1], "short": [0, 1]}}
        ],
    }


def test_the_marker_reads_back_to_the_same_bytes(tmp_path: Path) -> None:
    data = _marker()
    record = marker.Marker.from_json(data, "packcli.json")
    assert json_bytes(record.to_json()) == json_bytes(data)
    assert record.plan_shape() == marker.PlanShape(64, 1024, "split")
    assert record.report_shape().tiers.short == marker.TierCounts(rows=2, tokens=9, segments=1)
    (tmp_path / "packcli.json").write_bytes(json_bytes(data))
    assert marker.read_marker(tmp_path) == record
    assert marker.work_folder(tmp_path, record) == tmp_path / ".packcli"
    del data["parts"]  # an output of a packcli before parts: one part (verify_part.parts_of)
    assert json_bytes(marker.Marker.from_json(data, "packcli.json").to_json()) == json_bytes(data)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: m["config"]["plan"].pop("long_len"), "config.plan.long_len"),
        (lambda m: m["run"]["tokenizer"].update(vocab_size=True), "run.tokenizer.vocab_size"),
        (lambda m: m["report"]["tiers"].pop("short"), "report.tiers.short"),
        (lambda m: m["report"]["policy"].update(dropped_tokens="0"), "dropped_tokens"),
        (lambda m: m["files"]["long"][0].pop("sha256"), "files.long[0].sha256"),
        (lambda m: m["files"].update(short={}), "files.short"),
        (lambda m: m["parts"][0]["files"].update(long=[0]), "parts[0].files.long"),
        (lambda m: m["files"]["short"][0].update(file="../x.parquet"), "not a file of data/short"),
    ],
)
def test_a_damaged_marker_fails_naming_the_field(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], named: str
) -> None:
    data = _marker()
    edit(data)
    (tmp_path / "packcli.json").write_bytes(json_bytes(data))
    with pytest.raises(VerifyError, match="damaged or not written by packcli") as caught:
        marker.read_marker(tmp_path)
    assert named in str(caught.value)


def _sliced_meta(slices: list[list[list[int]]]) -> dict[str, Any]:
    """A marker's files and parts: one group per slice list, each with one long and one
    short file, then the tail."""
    n = len(slices)
    files = {c: [{"file": f"f{i}"} for i in range(n + 1)] for c in ("long", "short")}
    parts: list[dict[str, Any]] = [
        {
            "name": f"group-{g:05d}",
            "shards": sorted({s for s, _, _ in runs}),
            "files": {"long": [g, g + 1], "short": [g, g + 1]},
            "slices": runs,
        }
        for g, runs in enumerate(slices)
    ]
    parts.append({"name": "tail", "shards": [], "files": {"long": [n, n + 1], "short": [n, n + 1]}})
    return {"files": files, "parts": parts}


@pytest.mark.parametrize(
    ("slices", "ok"),
    [
        ([[[0, 0, 4], [1, 0, 2]], [[1, 2, 5]]], True),  # shard 1 shared, rows tiled
        ([[[0, 0, 4], [1, 0, 3]], [[1, 2, 5]]], False),  # row 2 of shard 1 twice
        ([[[0, 0, 4], [1, 0, 2]], [[1, 3, 5]]], False),  # row 2 of shard 1 in no part
        ([[[0, 0, 4], [1, 0, 2]], [[1, 2, 4]]], False),  # shard 1's last row in none
        ([[[0, 0, 4]], [[1, 0, 5]], [[2, 0, 1]]], False),  # a shard the tokens lack
    ],
)
def test_parts_cover_every_row_of_every_shard_once(slices: list, ok: bool) -> None:
    """A grouped mixture's parts share shards: verify checks their slices tile every
    shard's rows, each row in exactly one part."""
    from packcli.errors import VerifyError
    from packcli.publish.verify_part import parts_of

    meta = _sliced_meta(slices)
    if ok:
        parts = parts_of(meta, [4, 5])
        assert [p.slices for p in parts[:-1]] == [tuple(tuple(r) for r in runs) for runs in slices]
    else:
        with pytest.raises(VerifyError, match="each row of the 2 tokenized shards exactly once"):
            parts_of(meta, [4, 5])
