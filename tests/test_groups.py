"""Planning by groups of shards plus a global tail: the union is a valid two-tier plan of the
whole corpus (every piece once, packs whole inside long rows), and costs at most the tail
share in rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_plan import check_packs_whole, check_plan, pretrain_lengths, rows

from packcli.config import PlanConfig
from packcli.pack.groups import (
    BALLAST_SHARE,
    MOST_BALLAST,
    MOST_RELEASED,
    Ballast,
    Pieces,
    balance_tail,
    group_count,
    merge_plans,
    plan_group,
    plan_tail,
    shard_groups,
    source_slices,
)
from packcli.pack.plan import Plan, plan_two_tier, tier_summary


def grouped(
    lengths: np.ndarray,
    shard_sizes: list[int],
    n_groups: int,
    cfg: PlanConfig,
    tail_share: float = 1e-4,
    most_released: int = MOST_RELEASED,
    sources: np.ndarray | None = None,
) -> tuple[list[Plan], Plan]:
    """Group plans (doc ids of strided shards) and the tail plan, as the stages would;
    with ``sources`` (each document's), groups give the tail whole rows as a mixture's do
    (``balance_tail``)."""
    bounds = np.cumsum([0, *shard_sizes])
    assert bounds[-1] == lengths.size
    plans, tails, ballasts = [], [], []
    for g, shards in enumerate(shard_groups(len(shard_sizes), n_groups)):
        docs = (
            np.concatenate([np.arange(bounds[s], bounds[s + 1]) for s in shards])
            if shards.size
            else np.zeros(0, dtype=np.int64)
        )
        gp = plan_group(
            lengths[docs], docs, cfg, g, tail_share=tail_share, most_released=most_released
        )
        if sources is not None:
            k = int(sources.max(initial=0)) + 1
            gp = balance_tail(gp, sources[gp.plan.piece_doc], sources[gp.tail.doc], k)
        plans.append(gp.plan)
        tails.append(gp.tail)
        ballasts.append(gp.ballast or Ballast.empty(cfg.short_len, cfg.long_len))
    if sources is None:
        return plans, plan_tail(tails, cfg)
    firsts = np.cumsum([0, *(t.size for t in tails[:-1])]).tolist()
    return plans, plan_tail(tails, cfg, Ballast.concat(ballasts, firsts))


def _split(n: int, rng: np.random.Generator) -> list[int]:
    if n == 0:
        return [0]
    cuts = np.sort(rng.integers(0, n + 1, size=int(rng.integers(0, 6))))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), min_size=0, max_size=150),
    short_len=st.integers(8, 40),
    factor=st.integers(2, 6),
    overlong=st.sampled_from(["split", "truncate", "drop"]),
    algorithm=st.sampled_from(["bfd", "ffd", "wrapped"]),
    n_groups=st.integers(1, 5),
    tail_share=st.sampled_from([0.0, 1e-4, 0.05, 1.0]),
    most_released=st.sampled_from([0, 1, 4, 10**9]),
    seed=st.integers(0, 2**32),
)
def test_groups_and_tail_make_a_valid_plan_of_the_whole_corpus(
    lengths: list[int],
    short_len: int,
    factor: int,
    overlong: str,
    algorithm: str,
    n_groups: int,
    tail_share: float,
    most_released: int,
    seed: int,
) -> None:
    cfg = PlanConfig(
        short_len=short_len, long_len=short_len * factor, overlong=overlong, algorithm=algorithm
    )
    arr = np.array(lengths, dtype=np.int64)
    sizes = _split(arr.size, np.random.default_rng(seed))
    plans, tail = grouped(arr, sizes, n_groups, cfg, tail_share, most_released)
    merged = merge_plans([*plans, tail])
    check_plan(arr, cfg, merged)  # every piece of the policy exactly once, packs whole
    whole = plan_two_tier(arr, cfg)  # the same policy counts as one global plan
    for key in ("split_docs", "truncated_tokens", "dropped_docs", "empty_docs", "documents"):
        assert merged.stats[key] == whole.stats[key]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=0, max_size=200),
    short_len=st.integers(8, 40),
    factor=st.integers(2, 6),
    n_groups=st.integers(2, 4),
    n_sources=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_rows_given_whole_keep_the_plan_valid_and_arrive_as_they_were(
    lengths: list[int], short_len: int, factor: int, n_groups: int, n_sources: int, seed: int
) -> None:
    """With groups giving the tail whole rows (a mixture's), groups and tail are still a
    valid plan of the whole corpus, each given row is in the tail exactly as its group had
    it (both configs), and the tail reads every piece from where its group put it."""
    cfg = PlanConfig(short_len=short_len, long_len=short_len * factor, overlong="split")
    arr = np.array(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    sizes = _split(arr.size, rng)
    sources = rng.integers(0, n_sources, arr.size)
    plans, tail = grouped(arr, sizes, n_groups, cfg, 0.0, 2, sources)
    check_plan(arr, cfg, merge_plans([*plans, tail]))
    # What each group gives, and the rows it gives whole, as the stages save them.
    tails, ballasts, before = [], [], []
    for g, shards in enumerate(shard_groups(len(sizes), n_groups)):
        bounds = np.cumsum([0, *sizes])
        docs = np.concatenate([np.arange(bounds[x], bounds[x + 1]) for x in shards] or [[]])
        docs = docs.astype(np.int64)
        gp = plan_group(arr[docs], docs, cfg, g, tail_share=0.0, most_released=2)
        before.append(gp.plan)
        k = int(sources.max(initial=0)) + 1
        gp = balance_tail(gp, sources[gp.plan.piece_doc], sources[gp.tail.doc], k)
        tails.append(gp.tail)
        ballasts.append(gp.ballast)
    given = Pieces.concat(tails)
    assert tail.piece_source is not None
    assert np.array_equal(given.doc[tail.piece_source], tail.piece_doc)
    assert np.array_equal(given.start[tail.piece_source], tail.piece_start)
    assert np.array_equal(given.length[tail.piece_source], tail.piece_len)
    assert sorted(tail.piece_source.tolist()) == list(range(given.size))
    for name in ("short", "long"):
        tail_rows = sorted(map(tuple, rows(tail, getattr(tail, name))))
        old_rows = {tuple(r) for p in before for r in rows(p, getattr(p, name))}
        whole = [b for b in ballasts if b is not None]
        n_given = sum(getattr(b, name).num_rows for b in whole)
        kept = sum(getattr(p, name).num_rows for p in plans)
        assert kept + n_given <= sum(getattr(p, name).num_rows for p in before)
        assert sum(r in old_rows for r in tail_rows) >= n_given


def test_rows_given_whole_bring_the_tail_to_the_groups_mix() -> None:
    """A mixture's group whose released pieces lack a source of short documents (the
    released rows hold packs of fewest pieces) gives whole rows until what it gives is near
    its own mix, within the limits; a group that released nothing gives nothing."""
    rng = np.random.default_rng(3)
    short = np.clip(rng.lognormal(3.3, 0.5, 60_000), 1, None).astype(np.int64)
    longer = np.clip(rng.lognormal(7.8, 0.6, 1_500), 1, None).astype(np.int64)
    lengths = np.concatenate([short, longer])
    sources = np.repeat([0, 1], [short.size, longer.size])
    cfg = PlanConfig(overlong="split", short_len=1024, long_len=16384)
    gp = plan_group(lengths, np.arange(lengths.size), cfg, 0)
    assert gp.tail.size > 0
    out = balance_tail(gp, sources[gp.plan.piece_doc], sources[gp.tail.doc], 2)
    assert out.ballast is not None and 0 < out.ballast.long.num_rows <= MOST_BALLAST
    share = np.bincount(sources, weights=lengths) / lengths.sum()

    def off(p: Pieces) -> float:
        return float(np.abs(np.bincount(sources[p.doc], weights=p.length, minlength=2)
                            / p.length.sum() - share).max())  # fmt: skip

    assert off(out.tail) < off(gp.tail) / 4
    assert out.tail.length.sum() <= (1 + BALLAST_SHARE) * gp.tail.length.sum()
    assert out.plan.long.num_rows + out.ballast.long.num_rows == gp.plan.long.num_rows
    assert out.ballast.long.num_rows <= gp.plan.long.num_rows // 2
    check_plan(lengths, cfg, merge_plans([out.plan, plan_tail([out.tail], cfg, out.ballast)]))
    none = plan_group(lengths, np.arange(lengths.size), cfg, 0, most_released=0)
    assert none.tail.size == 0
    assert balance_tail(none, sources[none.plan.piece_doc], sources[none.tail.doc], 2) is none


@pytest.mark.parametrize("align", [2, 7, 32])
def test_a_group_keeps_whole_windows_of_rows(align: int) -> None:
    """With ``align``, a mixture's group gives the tail rows until it keeps a multiple of
    ``align`` long rows (at most ``align - 1`` more than the greedy gives, never more than
    half its rows), also when it released nothing; groups and tail stay a valid plan."""
    rng = np.random.default_rng(3)
    short = np.clip(rng.lognormal(3.3, 0.5, 60_000), 1, None).astype(np.int64)
    longer = np.clip(rng.lognormal(7.8, 0.6, 1_500), 1, None).astype(np.int64)
    lengths = np.concatenate([short, longer])
    sources = np.repeat([0, 1], [short.size, longer.size])
    cfg = PlanConfig(overlong="split", short_len=1024, long_len=16384)
    for most_released in (MOST_RELEASED, 0):
        gp = plan_group(lengths, np.arange(lengths.size), cfg, 0, most_released=most_released)
        src = sources[gp.plan.piece_doc], sources[gp.tail.doc]
        greedy = balance_tail(gp, *src, 2)
        out = balance_tail(gp, *src, 2, align=align)
        n = gp.plan.long.num_rows
        given = out.ballast.long.num_rows if out.ballast is not None else 0
        before = greedy.ballast.long.num_rows if greedy.ballast is not None else 0
        assert out.plan.long.num_rows == n - given
        assert out.plan.long.num_rows % align == 0
        assert before <= given < before + align and given <= n // 2
        check_plan(lengths, cfg, merge_plans([out.plan, plan_tail([out.tail], cfg, out.ballast)]))


def test_kept_rows_leave_at_most_the_tail_share_free() -> None:
    # With no cap on the rows released, a group keeps at most the tail share of free room,
    # also after its released rows exchanged packs with kept ones (which may leave a kept
    # row a little less full: within the same budget).
    lengths = pretrain_lengths(60_000, seed=3)
    cfg = PlanConfig(short_len=512, long_len=8192)
    for share in (0.0, 1e-3):
        plans, tail = grouped(lengths, [15_000] * 4, 4, cfg, share, most_released=10**9)
        for plan in plans:
            for layout in (plan.long, plan.short):
                room = layout.num_rows * layout.capacity - int(layout.row_tokens.sum())
                # the budget is a share of the group's tokens before release: bound it by
                # the kept ones plus the tail's (a generous but exact-direction check)
                assert room <= share * (int(layout.row_tokens.sum()) + tail.stats["tail_tokens"])
    # Nothing released when any free room is allowed: the tail is empty.
    plans, tail = grouped(lengths, [15_000] * 4, 4, cfg, 1.0)
    assert tail.stats["tail_pieces"] == 0 and tail.long.num_rows == 0


def test_a_corpus_that_cannot_fill_its_rows_stays_in_its_groups() -> None:
    # Pre-chunked documents of half a short pack plus one token: every pack of every group
    # has the same free room, which no tail can fill. Each group releases at most
    # MOST_RELEASED rows per config, not everything (which would plan the corpus in one
    # process), and the job needs no more rows than one global plan.
    cfg = PlanConfig(short_len=64, long_len=512)
    for size in (33, 65):  # half a short pack + 1; a long piece of a short pack + 1
        lengths = np.full(16_000, size, dtype=np.int64)
        plans, tail = grouped(lengths, [2_000] * 8, 4, cfg)
        merged = merge_plans([*plans, tail])
        check_packs_whole(merged)
        whole = plan_two_tier(lengths, cfg)
        for name in ("long", "short"):
            assert getattr(merged, name).num_rows <= getattr(whole, name).num_rows
        per_long_row = cfg.long_len // size
        assert tail.stats["tail_pieces"] <= 4 * 2 * MOST_RELEASED * per_long_row
        assert tail.stats["tail_pieces"] < lengths.size // 20


def test_released_rows_hold_few_pieces() -> None:
    # Best fit decreasing fills a group's last rows with packs of its smallest documents,
    # and those are the rows it releases: the tail would hold one piece per token. The
    # released rows exchange those packs for kept packs of fewer pieces, so the tail is
    # no denser in pieces than the corpus, and the plan stays a valid plan of the corpus.
    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(np.log(30), 1.9, 40_000).astype(np.int64), 1, 3_000)
    cfg = PlanConfig(short_len=512, long_len=8192)
    plans, tail = grouped(lengths, [5_000] * 8, 4, cfg)
    merged = merge_plans([*plans, tail])
    check_packs_whole(merged)
    assert tail.stats["tail_tokens"] > 0
    density = tail.stats["tail_pieces"] / tail.stats["tail_tokens"]
    assert density <= lengths.size / lengths.sum(), (density, tail.stats)
    for name in ("long", "short"):  # and it costs no rows against the uncapped release
        rows = getattr(merged, name).num_rows
        bound = -(-int(getattr(merged, name).row_tokens.sum()) // getattr(cfg, f"{name}_len"))
        assert rows <= bound + len(plans), (name, rows, bound)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=200),
    overlong=st.sampled_from(["split", "truncate"]),
    balance=st.sampled_from(["none", "attention"]),
)
def test_rebuilt_long_rows_are_the_planners_when_no_pack_moves(
    lengths: list[int], overlong: str, balance: str
) -> None:
    # The release rebuilds the long layout after packs change rows; with every pack where
    # the planner put it, that rebuild is the planner's own layout (order within rows too).
    from packcli.pack.groups import _moved_packs, _pack_rows, _row_of_piece

    cfg = PlanConfig(short_len=16, long_len=64, overlong=overlong, balance=balance)
    plan = plan_two_tier(np.array(lengths), cfg)
    n = plan.piece_len.size
    long_row = _row_of_piece(plan.long, n)
    rebuilt = _moved_packs(plan, long_row, _pack_rows(plan.short, long_row))
    for field in ("row_offsets", "row_pieces", "row_tokens"):
        assert np.array_equal(getattr(rebuilt, field), getattr(plan.long, field)), field


def test_grouping_costs_little_on_a_pretraining_mix() -> None:
    # 600k documents in 6 groups of strided shards: both tiers stay within 1.0003x of the
    # lower bound (a global plan: ~1.0001x), with a small tail.
    lengths = pretrain_lengths(600_000, seed=1)
    plans, tail = grouped(lengths, [25_000] * 24, 6, PlanConfig())
    merged = merge_plans([*plans, tail])
    check_packs_whole(merged)
    for name in ("long", "short"):
        summary = tier_summary(getattr(merged, name))
        assert summary["rows_over_bound"] <= 1.0003, (name, summary)
    assert tail.stats["tail_tokens"] <= 0.02 * int(lengths.sum())


def test_same_plan_whatever_runs_it() -> None:
    # Groups depend on the shards, never on tasks: planning them in any order gives the
    # same arrays; each group has its own shuffle, fixed by the seed.
    lengths = pretrain_lengths(5_000, seed=2)
    cfg = PlanConfig(short_len=256, long_len=4096, seed=7)
    a_plans, a_tail = grouped(lengths, [1000] * 5, 3, cfg)
    b_plans, b_tail = grouped(lengths, [1000] * 5, 3, cfg)
    for a, b in zip([*a_plans, a_tail], [*b_plans, b_tail], strict=True):
        for field in ("piece_doc", "piece_start", "piece_len"):
            assert np.array_equal(getattr(a, field), getattr(b, field))
        assert np.array_equal(a.long.row_pieces, b.long.row_pieces)
    other = grouped(lengths, [1000] * 5, 3, PlanConfig(short_len=256, long_len=4096, seed=8))
    assert not np.array_equal(other[0][0].long.row_pieces, a_plans[0].long.row_pieces)


def test_shard_groups_stride_and_count() -> None:
    assert [g.tolist() for g in shard_groups(7, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [g.tolist() for g in shard_groups(2, 5)] == [[0], [1]]  # no empty groups
    assert group_count(0) == 1 and group_count(10, 4) == 3 and group_count(8, 4) == 2
    with pytest.raises(ValueError):
        group_count(10, 0)
    assert Pieces.concat([]).size == 0


def test_gathered_pieces_are_held_once() -> None:
    parts = [Pieces(np.arange(k) + 10 * k, np.zeros(k, np.int64), np.full(k, k)) for k in (3, 0, 5)]
    got = Pieces.gather([p.size for p in parts], parts.__getitem__)
    want = Pieces.concat(parts)
    for f in ("doc", "start", "length"):
        arr = getattr(got, f)
        assert np.array_equal(arr, getattr(want, f)) and arr.dtype == np.int64
        assert arr.base is None  # one allocation for all parts, no views of them
    assert Pieces.concat([got]) is got  # the tail's planner takes it without a copy
    with pytest.raises(ValueError):
        Pieces.gather([4], parts.__getitem__)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(  # per source: its shards' documents, each a list of lengths
        st.lists(st.lists(st.integers(0, 300), min_size=0, max_size=12), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 9),
)
@example([[[0, 0]]], 2)  # a source of no tokens, cut by count: nothing read
def test_source_slices_give_each_group_its_part_of_every_source(
    sources: list[list[list[int]]], n_groups: int
) -> None:
    """A mixture's groups as runs of shard rows: every row of every shard in exactly one
    group, runs in row order; each group holds within one document (half at each end) of
    ``1/G`` of every source's tokens, found by an oracle that walks the documents one by
    one; only shards a cut falls in have their lengths read."""
    shard_lens = [np.array(s, np.int64) for src in sources for s in src]
    shard_source = np.array([k for k, src in enumerate(sources) for _ in src], np.int64)
    tokens = np.array([int(x.sum()) for x in shard_lens], np.int64)
    docs = np.array([x.size for x in shard_lens], np.int64)
    read: list[int] = []

    def lengths_of(s: int) -> np.ndarray:
        read.append(s)
        return shard_lens[s]

    groups = source_slices(shard_source, tokens, docs, n_groups, lengths_of)
    assert all(groups) and len(groups) <= n_groups
    owner: dict[tuple[int, int], int] = {}
    for g, runs in enumerate(groups):
        assert runs == sorted(runs)
        for s, a, b in runs:
            assert 0 <= a < b <= docs[s]
            for r in range(a, b):
                assert (s, r) not in owner
                owner[(s, r)] = g
    assert set(owner) == {(s, r) for s in range(docs.size) for r in range(int(docs[s]))}
    for k, src in enumerate(sources):
        first = int(np.flatnonzero(shard_source == k)[0])
        flat = [(first + i, r, n) for i, s in enumerate(src) for r, n in enumerate(s)]
        total = sum(n for *_, n in flat)
        biggest = max((n for *_, n in flat), default=0)
        held = np.zeros(len(groups))
        for s, r, n in flat:
            held[owner[(s, r)]] += n
        if total:  # each group within a document of its part (empty groups dropped)
            full = np.zeros(n_groups)
            cum = 0
            for *_, n in flat:  # the oracle: midpoint of each document
                full[min(n_groups - 1, (n_groups * (2 * cum + n)) // (2 * total))] += n
                cum += n
            assert sorted(held[held > 0].tolist()) == sorted(full[full > 0].tolist())
            assert np.all(np.abs(full - total / n_groups) <= biggest)
    # A source of no tokens is cut by document count: nothing of it needs reading.
    weighed = {int(k) for k in np.unique(shard_source) if tokens[shard_source == k].sum()}
    straddled = {s for s in range(docs.size) if len({owner[(s, r)] for r in range(docs[s])}) > 1}
    assert {s for s in straddled if shard_source[s] in weighed} <= set(read)
    assert {int(shard_source[s]) for s in read} <= weighed
