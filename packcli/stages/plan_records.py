"""The plan stage's records in the work folder: each part's record (``plan/group-NNNNN.json``:
the part, its plan's counts and its arrays' sizes and hashes) and ``plan.json`` (every part,
the settings the plan was made with, the counts of the whole plan).

Beside ``stages/plan.py``, which writes them; the write tasks and finalize read ``plan.json``.
Same reader and writer as the other records (``packcli.records``): a part's record of another
version is planned again, a ``plan.json`` of another version is no plan (``packcli plan`` makes
it again). The plan's counts (``stats``) stay a JSON object: the planner, the mixture and the
balancer each add their own, and the report reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packcli.records import Fields, Record

PLAN_DIR = "plan"  # the parts' arrays and records: plan/group-NNNNN.npz, plan/tail.npz
PLAN = "plan.json"  # in the work folder: the saved plan, written last by the plan stage
TAIL = "tail"


@dataclass(frozen=True)
class PlanPart(Fields):
    """One independently planned part of the output: a group of token shards, or the tail
    (the pieces the groups released, planned together). Its rows are written from its own
    shards only (the tail: from the tail shards the groups' write tasks cut)."""

    name: str  # group-NNNNN | tail
    shards: tuple[int, ...]  # token shards its rows read (the tail: none)
    files: dict[str, list[tuple[int, int]]]  # per config, each file's rows r0..r1-1
    rows: dict[str, int]  # per config
    tokens: dict[str, int]  # per config
    tail_pieces: int  # a group: pieces it released; the tail: pieces it holds
    content_sha256: str

    @property
    def is_tail(self) -> bool:
        return self.name == TAIL

    @property
    def arrays(self) -> list[str]:
        """Its files in the work folder: the plan arrays and (a group) its released pieces."""
        names = [f"{PLAN_DIR}/{self.name}.npz"]
        return names if self.is_tail else [*names, f"{PLAN_DIR}/{self.name}.tail.npz"]


@dataclass(frozen=True)
class GroupRecord(Record):
    """``plan/group-NNNNN.json``: a group's part, its plan's counts, and its arrays' files
    (``rel -> (size, sha256)``), for the fingerprint (plan settings, tokens, file cut) it was
    planned for."""

    fingerprint: str
    part: PlanPart
    stats: dict[str, Any]
    files: dict[str, tuple[int, str]]


@dataclass(frozen=True)
class PlanRecord(Record):
    """``plan.json``: the parts in output order with a digest over their arrays
    (``content_sha256``, which the write fingerprint covers), the plan settings (``plan``,
    ``PlanConfig``'s fields) and the output file cut the parts' files were made by."""

    content_sha256: str
    fingerprint: str
    tokens_fingerprint: str  # the shard index's the plan was made from
    stats: dict[str, Any]
    plan: dict[str, Any]
    # Output files are cut when planning (each part's rows into files of about this many
    # tokens), so write tasks need only their own parts' arrays.
    write_shard_tokens: int
    write_min_files: int | None
    write_cost_model: str | None
    parts: tuple[PlanPart, ...]
