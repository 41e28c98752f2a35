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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from packcli.pack.mixture import WindowEdges, WindowSpread
from packcli.records import Fields, Record

PLAN_DIR = "plan"  # the parts' arrays and records: plan/group-NNNNN.npz, plan/tail.npz
PLAN = "plan.json"  # in the work folder: the saved plan, written last by the plan stage
TAIL = "tail"
GROUPS = "plan/groups.json"  # in the work folder: a grouped mixture's groups (GroupsRecord)
STEPS = "steps"  # a grouped mixture's second pass: plan/steps.json, plan/steps/group-NNNNN.*


@dataclass(frozen=True)
class PlanInputs(Fields):
    """What a plan is made from, hashed into its fingerprint (``plan_fingerprint``): the
    token shards' fingerprint, the plan settings, packcli's version, the tail's release
    rule, the placement rule and, for a mixture, its spec and row-order rule. Never
    written as a file."""

    tokens: str
    plan: dict[str, Any]
    v: str
    release: int
    placement: int
    mixture: dict[str, Any] | None = field(default=None, metadata={"omit": True})


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
    steps: bool = False  # a grouped mixture's group after the second pass (_exchange_groups)
    # A grouped mixture's group: its documents as runs of shard rows, (shard, first, end):
    # its shards' rows hold other groups' documents too (``packcli.pack.groups.source_slices``).
    # None: it holds its shards whole.
    slices: tuple[tuple[int, int, int], ...] | None = field(default=None, metadata={"omit": True})

    @property
    def is_tail(self) -> bool:
        return self.name == TAIL

    @property
    def plan_array(self) -> str:
        """Its plan arrays in the work folder: ``plan/NAME.npz``, or after the second pass
        ``plan/steps/NAME.npz`` (the first pass's file stays, so a killed second pass
        resumes without planning the group again)."""
        return (
            f"{PLAN_DIR}/{STEPS}/{self.name}.npz" if self.steps else f"{PLAN_DIR}/{self.name}.npz"
        )

    @property
    def arrays(self) -> list[str]:
        """Its files in the work folder: the plan arrays and (a group) its released pieces."""
        names = [self.plan_array]
        return names if self.is_tail else [*names, f"{PLAN_DIR}/{self.name}.tail.npz"]


@dataclass(frozen=True)
class GroupsRecord(Record):
    """``plan/groups.json``: a grouped mixture's groups as runs of shard rows (``(shard,
    first row, end row)``), for the plan fingerprint they were cut for. Cutting at each
    source's copy tokens reads the length column of every shard of a source whose weight
    is fractional; saved once, so the plan tasks read this instead of every shard."""

    fingerprint: str
    groups: list[list[tuple[int, int, int]]]


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


@dataclass(frozen=True)
class StepRows(Record):
    """``plan/steps.json``, the second pass's input, fixed once every group and the tail are
    planned (row counts do not change in it): per group, its first long row in the output,
    and whether long rows follow it (a later group's or the tail's); and the tail's first
    long rows' tokens per source (``tail_rows``, by ``piece_size``; at most ``HEAD_ROWS``),
    which the last group counts in the window it shares with them (the tail is exchanged
    before the groups' second pass, so its rows are known)."""

    first_rows: tuple[int, ...]
    open_end: tuple[bool, ...]
    tail_rows: tuple[tuple[int, ...], ...]

    HEAD_ROWS: ClassVar[int] = 4096  # more than any exchange window of the default steps

    @classmethod
    def of(cls, parts: Sequence[PlanPart], tail_rows: np.ndarray | None = None) -> StepRows:
        """From the parts in output order: the groups, then the tail."""
        rows = [p.rows["long"] for p in parts]
        first = np.cumsum([0, *rows[:-1]])
        after = np.cumsum(rows[::-1])[::-1] - rows  # rows of the parts after each
        head = (
            ()
            if tail_rows is None
            else tuple(tuple(int(x) for x in r) for r in np.asarray(tail_rows)[: cls.HEAD_ROWS])
        )
        return cls(tuple(int(x) for x in first[:-1]), tuple(bool(x > 0) for x in after[:-1]), head)


@dataclass(frozen=True)
class StepsRecord(Record):
    """``plan/steps/group-NNNNN.json``: a group after the second pass (its part, now reading
    ``plan/steps/NAME.npz``), its long config's window figures at its output rows, its rows
    in the steps it shares with its neighbours (``edges``, for the straddling deviation) and
    its arrays' files, for the fingerprint (first pass, first output row, open end)."""

    fingerprint: str
    part: PlanPart
    mixture_windows: dict[str, WindowSpread]
    edges: WindowEdges
    files: dict[str, tuple[int, str]]
