"""The run report (``packcli.publish.report``): its sections as ``packcli.json`` holds them and
the terminal's lines read back from them."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from typing import Any

import numpy as np

from packcli.pack.mixture import WindowSpread
from packcli.pack.plan import RowTotals
from packcli.publish.marker import PolicyCounts
from packcli.publish.report import (
    POLICY_KEYS,
    LengthStats,
    build_report,
    format_report,
    mixture_warnings,
)
from packcli.publish.report_records import InputFiles, Provenance, SourceShare


def _report(
    input_stats: InputFiles, where: Provenance | None, stats: dict[str, int] | None = None
) -> dict[str, Any]:
    lengths = LengthStats.of(np.array([3, 9, 0, 5]), short_len=4, long_len=16, first_doc=10)
    tiers = {
        "short": RowTotals(capacity=4, rows=1, units=1, tokens=3),
        "long": RowTotals(capacity=16, rows=2, units=3, tokens=17, max_row_tokens=9),
    }
    return build_report(
        tiers,
        stats if stats is not None else dict.fromkeys(POLICY_KEYS, 0),
        lengths,
        input_stats=input_stats,
        largest_provenance=where,
        tokens_per_step=32,
    )


def test_report_input_and_largest_document_in_packcli_json_order() -> None:
    """The files' figures first, then documents and tokens; where the largest was read
    after its id and tokens; a corrupt stream's list only when there is one."""
    files = InputFiles(files=2, blank_lines=1, bytes=120, rejected_lines=0, rejected={})
    report = _report(files, Provenance("a.parquet", row=7))
    assert json.dumps(report["input"]) == (
        '{"files": 2, "blank_lines": 1, "bytes": 120, "rejected_lines": 0, "rejected": {}, '
        '"documents": 4, "tokens": 17}'
    )
    assert report["largest_document"] == {"doc_id": 11, "tokens": 9, "file": "a.parquet", "row": 7}
    assert list(report["tiers"]["long"]) == [
        "capacity",
        "rows",
        "tokens",
        "segments",
        "efficiency",
        "lower_bound_rows",
        "rows_over_bound",
        "max_row_tokens",
        "attention_balance",
    ]


def test_report_policy_is_what_the_marker_reads_in_its_field_order() -> None:
    """Each plan count under its own name, in the order of ``PolicyCounts`` (the reader's
    record, not the writer's list, is the oracle: ``packcli.json``'s bytes follow it)."""
    counts = {name: 10 * (i + 1) for i, name in enumerate(reversed(POLICY_KEYS))}
    files = InputFiles(files=1, blank_lines=0, bytes=10, rejected_lines=0, rejected={})
    policy = _report(files, None, counts)["policy"]
    required = [f.name for f in fields(PolicyCounts) if f.default is MISSING]
    assert list(policy) == required
    assert policy == counts
    assert PolicyCounts.from_json(policy, "packcli.json").to_json() == {
        **counts,
        "repeat_tokens": 0,
        "subsampled_tokens": 0,
    }


def test_terminal_report_names_rejects_corrupt_files_and_the_largest_row() -> None:
    corrupt = [{"file": "b.jsonl.gz", "kept_lines": 40, "reason": "truncated"}]
    files = InputFiles(3, 0, 999, 2, {"not_json": 2}, corrupt_streams=corrupt)
    text = format_report(_report(files, Provenance("a.parquet", row=7)))
    assert "input     4 documents, 17 tokens from 3 file(s)" in text
    assert "rejected  2 lines (not_json 2): rejected.jsonl" in text
    assert "corrupt   b.jsonl.gz: kept its first 40 lines, discarded the rest (truncated)" in text
    assert "largest   doc 11: 9 tokens at a.parquet row 7" in text
    jsonl = format_report(_report(files, Provenance("a.jsonl", line=8)))
    assert "largest   doc 11: 9 tokens at a.jsonl:8" in jsonl


def test_mixture_warning_names_a_large_source_off_its_share() -> None:
    spread = WindowSpread(
        window_rows=4,
        windows=3,
        tokens=[900, 100],
        max_deviation=[0.02, 0.001],
        p99_deviation=[0.01, 0.001],
        shuffled_max_deviation=[0.03, 0.002],
    )
    shares = [SourceShare.of(spread, k) for k in range(2)]
    assert shares[0].share == 0.9 and "straddling_window_max_deviation" not in shares[0].to_json()
    mix = {
        "groups": 4,
        "sources": [
            {"name": "web", "long": shares[0].to_json(), "groups": 2},
            {"name": "code", "long": shares[1].to_json(), "groups": 4},
        ],
    }
    (line,) = mixture_warnings(mix)
    assert line.startswith("warning: source web is up to 2.00 points off its 90.00% share")
    assert "sit in 2 of the 4 plan groups" in line
