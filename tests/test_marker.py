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
    assert marker.read_marker(tmp_path) == data
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
