"""Planning by groups of shards, so no process holds the whole corpus (issue 23's design).

A global plan needs every document's length in one process (~116 B per document: 12 GB at
100M documents) and makes every write task read most shards, because best fit scatters a
file's rows over the whole corpus. Here the corpus is cut into **groups** of tokenized
shards instead, and each group is planned, and later written, on its own:

1. **Groups stride over the shards** (shard ``s`` is in group ``s mod G``, ``G`` from the
   corpus's token count and ``group_tokens``, never from the task count), so every group
   samples the whole input and a group's rows are as mixed as global rows would be; output
   bytes do not depend on how many tasks run.
2. **Each group is planned** by ``plan_two_tier`` over its own lengths (its own seed, drawn
   from ``seed`` and the group index). Then its least-filled rows are **released**: long
   rows in order of free room, most first, until the room left in the kept long rows is at
   most ``tail_share`` of the group's long-config tokens, and likewise for short packs
   (a released short pack takes the long row it sits in with it, so both views stay
   consistent: a kept short pack is always whole inside a kept long row). Whatever is
   released (every piece of the released long rows) goes to the **tail**.
3. **The tail is planned once, globally** (``plan_tail``): the released pieces of every
   group, which are small (a few percent of the tokens at most, often 0.1%), packed
   two-tier as one corpus. Its under-filled last rows are the only ones the job leaves.

Cost in packing: each group leaves at most ``tail_share`` of its tokens as free room in the
rows it keeps, and the tail adds the global plan's own rounding, so rows / lower bound stay
within about ``1 + tail_share`` of the bound per tier (``scripts/bench_scale.py`` measures
it: docs/scale.md). Cost in memory: a group's plan, ~116 B per document of that group; the
tail's, ~120 B per released piece at its peak. The released pieces are few in tokens but
not in number: the rows a group releases are its least-filled ones, which best fit
decreasing fills last, with the smallest documents, so on the real-shaped mix
(``scripts/bench_scale.py``) a group of 1M documents releases ~0.04% of its tokens but ~5%
of its pieces (~50k, ~1.6 tokens each), and the tail's planner holds ~50k pieces per group
(~6 MB per group above its ~200 MB base: ~0.8 GB at 100 groups). Everything here is pure
and deterministic for given lengths, groups and config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packcli.names import CONFIG_NAMES
from packcli.pack.plan import Plan, RowLayout, plan_two_tier
from packcli.pack.plan_config import PlanConfig

# Tokens per group: a group's plan then holds ~1M documents of real text (~116 MB) and its
# shards are ~1 GB of int32, one write task's worth.
GROUP_TOKENS = 1 << 28
# Free room the rows a group keeps may hold, as a share of the group's tokens (per config).
TAIL_SHARE = 1e-4
# Policy counts summed over groups (the tail never holds an overlong or empty document).
POLICY_KEYS = (
    "empty_docs",
    "split_docs",
    "split_tokens",
    "split_pieces",
    "truncated_docs",
    "truncated_tokens",
    "dropped_docs",
    "dropped_tokens",
    "documents",
    "input_tokens",
)


@dataclass(frozen=True)
class Pieces:
    """Slices of documents, by global doc id: ``doc[i][start[i] : start[i] + length[i]]``."""

    doc: np.ndarray  # int64
    start: np.ndarray  # int64
    length: np.ndarray  # int64

    @property
    def size(self) -> int:
        return int(self.length.size)

    @classmethod
    def concat(cls, parts: Sequence[Pieces]) -> Pieces:
        """The parts one after another; one part is returned as it is (no copy: the plan
        stage hands the tail's planner all released pieces already in one)."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty)
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PIECE_FIELDS))

    @classmethod
    def gather(cls, sizes: Sequence[int], load: Callable[[int], Pieces]) -> Pieces:
        """``load(i)`` for every part, ``sizes[i]`` pieces each, copied into arrays made once
        for all of them (one part loaded at a time): each piece is held once, where a list of
        the parts plus their ``concat`` holds it twice."""
        out = cls(*(np.empty(int(sum(sizes)), dtype=np.int64) for _ in _PIECE_FIELDS))
        at = 0
        for i, size in enumerate(sizes):
            part = load(i)
            if part.size != size:
                raise ValueError(f"part {i} has {part.size} pieces, expected {size}")
            for f in _PIECE_FIELDS:
                getattr(out, f)[at : at + size] = getattr(part, f)
            at += size
        return out


_PIECE_FIELDS = ("doc", "start", "length")


@dataclass(frozen=True)
class GroupPlan:
    """One group's kept rows (``plan``: doc ids are global) and what it released."""

    plan: Plan
    tail: Pieces


def group_count(total_tokens: int, group_tokens: int = GROUP_TOKENS) -> int:
    """How many groups a corpus of ``total_tokens`` is planned in (at least one)."""
    if group_tokens <= 0:
        raise ValueError(f"group_tokens must be positive, got {group_tokens}")
    return max(1, -(-int(total_tokens) // group_tokens))


def shard_groups(n_shards: int, n_groups: int) -> list[np.ndarray]:
    """The shards of each group: shard ``s`` belongs to group ``s mod n_groups``, so each
    group samples the whole input order (no group is "the last files")."""
    n_groups = max(1, min(n_groups, n_shards)) if n_shards else 1
    return [np.arange(g, n_shards, n_groups, dtype=np.int64) for g in range(n_groups)]


def group_seed(seed: int, group: int) -> int:
    """The shuffle seed of a group: independent streams per group, fixed by ``seed``."""
    return int(np.random.SeedSequence([seed, group]).generate_state(2, np.uint64)[0] >> 1)


def plan_group(
    lengths: np.ndarray,
    doc_ids: np.ndarray,
    config: PlanConfig,
    group: int,
    *,
    tail_share: float = TAIL_SHARE,
) -> GroupPlan:
    """Plan one group's documents (``lengths[i]`` is document ``doc_ids[i]``) and release
    its least-filled rows to the tail."""
    lengths = np.asarray(lengths, dtype=np.int64)
    doc_ids = np.asarray(doc_ids, dtype=np.int64)
    if lengths.shape != doc_ids.shape:
        raise ValueError("lengths and doc_ids must have the same shape")
    cfg = dataclasses.replace(config, seed=group_seed(config.seed, group))
    local = plan_two_tier(lengths, cfg)
    plan = dataclasses.replace(local, piece_doc=doc_ids[local.piece_doc])
    released = _released_pieces(plan, tail_share)
    return GroupPlan(_keep(plan, ~released), _pieces(plan, released))


def plan_tail(tails: Sequence[Pieces], config: PlanConfig) -> Plan:
    """The released pieces of every group (in group order), planned two-tier as one corpus.

    Every piece is at most ``long_len`` already, so each stays one piece; the plan's pieces
    are mapped back to their documents and offsets."""
    tail = Pieces.concat(tails)
    plan = plan_two_tier(tail.length, config)
    idx = plan.piece_doc  # index into the tail: one piece per released piece
    stats = {k: v for k, v in plan.stats.items() if k not in POLICY_KEYS}
    return dataclasses.replace(
        plan,
        piece_doc=tail.doc[idx],
        piece_start=tail.start[idx] + plan.piece_start,
        stats=stats | {"tail_pieces": tail.size, "tail_tokens": int(tail.length.sum())},
        piece_source=idx,
    )


def policy_counts(stats: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The overlong policy's counts of several groups' plans, summed (each document is in
    exactly one group, and the tail adds none)."""
    return {k: sum(int(s.get(k, 0)) for s in stats) for k in POLICY_KEYS}


def merge_plans(plans: Sequence[Plan]) -> Plan:
    """The plans' rows one after another as one plan (what the output holds, file after
    file): for checking invariants and counting rows, never needed to write."""
    if not plans:
        raise ValueError("no plans to merge")
    base = np.cumsum([0] + [p.piece_len.size for p in plans])
    layouts = {}
    for name in CONFIG_NAMES:
        parts: list[RowLayout] = [getattr(p, name) for p in plans]
        offsets = [np.zeros(1, dtype=np.int64)]
        end = 0
        for part in parts:
            offsets.append(part.row_offsets[1:] + end)
            end += int(part.row_offsets[-1])
        layouts[name] = RowLayout(
            parts[0].capacity,
            np.concatenate(offsets),
            np.concatenate([part.row_pieces + b for part, b in zip(parts, base, strict=False)]),
            np.concatenate([part.row_tokens for part in parts]),
        )
    stats: dict[str, Any] = policy_counts([p.stats for p in plans])
    return Plan(
        np.concatenate([p.piece_doc for p in plans]),
        np.concatenate([p.piece_start for p in plans]),
        np.concatenate([p.piece_len for p in plans]),
        stats=stats,
        **layouts,
    )


def _keep_least_room(room: np.ndarray, budget: float) -> np.ndarray:
    """Rows kept: the fullest ones, as many as keep their total free room within ``budget``
    (ties by row index, so the choice is deterministic)."""
    order = np.argsort(room, kind="stable")
    keep = np.zeros(room.size, dtype=bool)
    keep[order[np.cumsum(room[order]) <= budget]] = True
    return keep


def _row_of_piece(layout: RowLayout, n_pieces: int) -> np.ndarray:
    row = np.full(n_pieces, -1, dtype=np.int64)
    row[layout.row_pieces] = np.repeat(np.arange(layout.num_rows), np.diff(layout.row_offsets))
    return row


def _released_pieces(plan: Plan, tail_share: float) -> np.ndarray:
    """Which pieces go to the tail: those of the long rows released by free room, and of the
    long rows holding a released short pack."""
    long, short = plan.long, plan.short
    assert long is not None and short is not None
    n = plan.piece_len.size
    long_row = _row_of_piece(long, n)
    keep_row = _keep_least_room(
        long.capacity - long.row_tokens, tail_share * float(long.row_tokens.sum())
    )
    keep_pack = _keep_least_room(
        short.capacity - short.row_tokens, tail_share * float(short.row_tokens.sum())
    )
    pack_row = np.repeat(~keep_pack, np.diff(short.row_offsets))
    keep_row[long_row[short.row_pieces[pack_row]]] = False
    return ~keep_row[long_row]


def _pieces(plan: Plan, mask: np.ndarray) -> Pieces:
    return Pieces(plan.piece_doc[mask], plan.piece_start[mask], plan.piece_len[mask])


def _keep(plan: Plan, keep: np.ndarray) -> Plan:
    """The plan restricted to the pieces in ``keep`` (whole rows of both configs)."""
    new_index = np.cumsum(keep) - 1
    layouts = {}
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        counts = np.diff(layout.row_offsets)
        row_kept = np.repeat(True, layout.num_rows)
        if layout.row_pieces.size:
            # rows are kept or released whole: a row's first piece says which
            row_kept = keep[layout.row_pieces[layout.row_offsets[:-1]]]
        piece_kept = np.repeat(row_kept, counts)
        offsets = np.zeros(int(row_kept.sum()) + 1, dtype=np.int64)
        np.cumsum(counts[row_kept], out=offsets[1:])
        layouts[name] = RowLayout(
            layout.capacity,
            offsets,
            new_index[layout.row_pieces[piece_kept]],
            layout.row_tokens[row_kept],
        )
    return Plan(
        plan.piece_doc[keep],
        plan.piece_start[keep],
        plan.piece_len[keep],
        stats=dict(plan.stats),
        **layouts,
    )
