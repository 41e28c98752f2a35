"""Mixture benchmark (issue 26): how well each optimizer step's mix holds its target.

Four sources of very different length distributions (fortune-like ~30 tokens, man-page-like
~2.5k, source files lognormal ~700, books 40k-200k), target shares 0.5/0.2/0.2/0.1 (share
mode: multipliers from the counted tokens), planned two-tier as packcli plans a mixture
(``packcli.pack.mixture.expand`` then ``plan_two_tier``). Per config and step size: the
largest and 99th-percentile deviation of a step window's source share from the config's own
realised share, for the shuffled order (the baseline: packcli's row shuffle, a random order),
the row order alone (``mix_order``, before the exchange) and what packcli plans
(``order_plan``: the row order, then the long config's units exchanged between windows,
``packcli.pack.exchange``); the piece bound (no layout does better at that step); rows /
lower bound before and after; plan and order time (``order_plan`` timed on its second run,
so numba's cache load is not in it, and again without the exchange: the difference is the
exchange's cost). ``--groups G`` plans by groups instead and measures the output's windows
across them (``grouped``): packcli's groups of a mixture (``source_slices``: runs of each
source's documents, ``1/G`` of its tokens each) over shards of ``--shard-tokens``.

    python scripts/bench_mixture.py --scale 1.0
    python scripts/bench_mixture.py --scale 2.0 --groups 4
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from packcli.pack import exchange as xc
from packcli.pack import mixture as mx
from packcli.pack.exchange import piece_bound
from packcli.pack.groups import (
    Ballast,
    balance_tail,
    part_rows_multiple,
    plan_group,
    plan_tail,
    source_slices,
)
from packcli.pack.plan import Plan, plan_two_tier, tier_summary
from packcli.pack.plan_config import PlanConfig


def lengths(scale: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = [int(400_000 * scale), int(8_000 * scale), int(30_000 * scale), max(4, int(150 * scale))]
    return [
        np.clip(rng.lognormal(3.3, 0.5, n[0]), 1, None).astype(np.int64),
        np.clip(rng.lognormal(7.8, 0.6, n[1]), 1, None).astype(np.int64),
        np.clip(rng.lognormal(6.5, 1.0, n[2]), 1, None).astype(np.int64),
        rng.integers(40_000, 200_000, n[3]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, nargs="+", default=[1 << 20, 2 << 20, 4 << 20, 8 << 20])
    ap.add_argument("--step", type=int, default=1 << 20, help="the plan's step (--tokens-per-step)")
    ap.add_argument(
        "--groups", type=int, default=0, help="also plan in this many groups (as packcli does)"
    )
    ap.add_argument(
        "--shard-tokens", type=int, default=16 << 20, help="the token shards groups cut (grouped)"
    )
    ap.add_argument(
        "--no-carry",
        action="store_true",
        help="grouped: the last group does not count the tail's rows in the window they share",
    )
    ap.add_argument(
        "--no-spread",
        action="store_true",
        help="large long pieces placed densely (before plan_two_tier's spread for mixtures)",
    )
    ap.add_argument(
        "--no-align",
        action="store_true",
        help="grouped: groups keep any number of long rows (before balance_tail's align)",
    )
    ap.add_argument(
        "--no-ballast",
        action="store_true",
        help="grouped: the tail only what groups release (before balance_tail)",
    )
    args = ap.parse_args()
    lens = lengths(args.scale, args.seed)
    if args.groups > 1:
        grouped(lens, args)
        return
    tokens = np.array([x.sum() for x in lens])
    shares = np.array([0.5, 0.2, 0.2, 0.1])
    mult = mx.multipliers_from_shares(shares, tokens)
    first = np.cumsum([0] + [x.size for x in lens[:-1]])
    all_lens = np.concatenate(lens)
    spec = mx.MixSpec(("fortunes", "manpages", "code", "books"), tuple(mult), ("split",) * 4)
    t0 = time.perf_counter()
    ex = mx.expand(all_lens, np.arange(all_lens.size), first, spec, 131072)
    plan = plan_two_tier(ex.lengths, PlanConfig(), spread=not args.no_spread)
    plan = dataclasses.replace(plan, piece_doc=ex.keys[plan.piece_doc])
    plan_s = time.perf_counter() - t0
    src = mx.source_of(plan.piece_doc, first)
    print(f"documents {all_lens.size:,}, copies {ex.keys.size:,}, multipliers {np.round(mult, 3)}")
    print(f"plan (expand + two-tier) {plan_s:.2f} s")
    mx.order_plan(plan, first, args.step)  # numba's cache load
    t1 = time.perf_counter()
    ordered, spread = mx.order_plan(plan, first, args.step)
    order_s = time.perf_counter() - t1
    row_s = {}
    for tier in ("short", "long"):
        layout = getattr(plan, tier)
        m = mx.row_source_tokens(layout.row_offsets, layout.row_pieces, src, plan.piece_len, 4)
        t2 = time.perf_counter()
        mx.mix_order(m)
        row_s[tier] = time.perf_counter() - t2
    real = xc.balance_steps
    xc.balance_steps = lambda layout, *a, **k: (layout, 0)  # the row order alone
    try:
        t3 = time.perf_counter()
        mx.order_plan(plan, first, args.step)
        rows_only_s = time.perf_counter() - t3
    finally:
        xc.balance_steps = real
    exchange_s = order_s - rows_only_s
    print(
        f"the exchange (order_plan {order_s:.2f} s less {rows_only_s:.2f} s without it): "
        f"{exchange_s:.2f} s, {exchange_s / plan.long.num_rows * 1e6:,.0f} s per million "
        "long rows"
    )
    print(
        f"order_plan {order_s:.2f} s (row order alone: short {row_s['short']:.2f} s, long "
        f"{row_s['long']:.2f} s); long: {plan.long.num_rows:,} rows, exchange windows of "
        f"{spread['long'].exchange_window_rows} rows, "
        f"{spread['long'].exchange_moves} moves"
    )
    print(
        "config  step tokens  rows/bound before after  source      share  bound  shuffled"
        "  row order  exchanged  exch p99"
    )
    for tier in ("short", "long"):
        layout, after_layout = getattr(plan, tier), getattr(ordered, tier)
        m = mx.row_source_tokens(layout.row_offsets, layout.row_pieces, src, plan.piece_len, 4)
        after = mx.row_source_tokens(
            after_layout.row_offsets, after_layout.row_pieces, src, plan.piece_len, 4
        )
        order = mx.mix_order(m)
        bound = tier_summary(layout)["rows_over_bound"]
        bound_after = tier_summary(after_layout)["rows_over_bound"]
        share = m.sum(axis=0) / m.sum()
        max_piece = np.zeros(4)
        lens_in = plan.piece_len[layout.row_pieces]
        np.maximum.at(max_piece, src[layout.row_pieces], np.where(lens_in > 4096, lens_in, 0))
        for step in args.steps:
            w = max(1, step // layout.capacity)
            base = mx.window_deviation(m, w)
            mixed = mx.window_deviation(m[order], w)
            done = mx.window_deviation(after, w)
            floor = piece_bound(max_piece, share, w * layout.capacity)
            for k, name in enumerate(spec.names):
                print(
                    f"{tier:<7} {step:>11,} {bound:>10.6f} {bound_after:>8.6f}  {name:<10} "
                    f"{share[k] * 100:>6.2f}% {floor[k] * 100:>5.2f} "
                    f"{base['max'][k] * 100:>8.2f}pt {mixed['max'][k] * 100:>8.2f}pt "
                    f"{done['max'][k] * 100:>8.2f}pt {done['p99'][k] * 100:>7.2f}pt"
                )


def source_groups(
    lens: list[np.ndarray], n_groups: int, shard_tokens: int, spec: mx.MixSpec
) -> list[np.ndarray]:
    """packcli's groups of a mixture (``source_slices`` on each document's copy tokens, as
    ``packcli.stages.plan._copy_weights``), as global doc ids: each source's documents
    (consecutive ids, as tokenized) in shards of about ``shard_tokens`` tokens."""
    start, first, size, source, tokens = 0, [], [], [], []
    weights = [
        x * mx.copies(np.arange(x.size), np.full(x.size, k), spec) for k, x in enumerate(lens)
    ]
    for k, x in enumerate(lens):
        cut = np.concatenate([[0], np.cumsum(x)[:-1]]) // shard_tokens  # a shard per cut
        counts = np.bincount(cut)
        ends = np.cumsum(counts)
        for n, e in zip(counts, ends, strict=True):
            if n:
                first.append(start + int(e - n))
                size.append(int(n))
                source.append(k)
                tokens.append(int(weights[k][e - n : e].sum()))
        start += x.size
    all_weights = np.concatenate(weights)
    groups = source_slices(
        np.array(source),
        np.array(tokens),
        np.array(size),
        n_groups,
        lambda s: all_weights[first[s] : first[s] + size[s]],
    )
    return [
        np.concatenate([np.arange(first[s] + a, first[s] + b) for s, a, b in g]) for g in groups
    ]


def grouped(lens: list[np.ndarray], args: argparse.Namespace) -> None:
    """The long config planned by groups (as ``packcli plan`` does past ``group_tokens``:
    ``source_groups``, every group ``1/G`` of every source): each group and the
    tail row-ordered alone (``order_plan`` without the exchange), the output their rows
    one part after another. Then three ways on: the row order alone; each part exchanged on
    its own windows (from its first row, as if it started the output); and what packcli
    plans, each part exchanged on the output's windows (``exchange_plan`` at its first
    output row, the second pass). Deviation over the output's windows, largest per source:
    over the whole output (the tail too), over the groups' rows against the output's share,
    and over the groups' rows against each row's part's own share (a window's expected
    tokens: each of its rows' tokens at its part's share), which leaves out how far the
    groups' own shares are apart (a sampling matter, the same for every order)."""
    tokens = np.array([x.sum() for x in lens])
    mult = mx.multipliers_from_shares(np.array([0.5, 0.2, 0.2, 0.1]), tokens)
    first = np.cumsum([0] + [x.size for x in lens[:-1]])
    all_lens = np.concatenate(lens)
    spec = mx.MixSpec(("fortunes", "manpages", "code", "books"), tuple(mult), ("split",) * 4)
    cfg = PlanConfig(overlong="split")
    planned, tails, ballasts = [], [], []
    for g, docs in enumerate(source_groups(lens, args.groups, args.shard_tokens, spec)):
        ex = mx.expand(all_lens[docs], docs, first, spec, cfg.long_len)
        gp = plan_group(ex.lengths, ex.keys, cfg, g, spread=not args.no_spread)
        if not args.no_ballast:  # as packcli's plan stage: the tail holds the group's mix
            src = [mx.source_of(x, first) for x in (gp.plan.piece_doc, gp.tail.doc)]
            last = g == args.groups - 1  # as packcli: the last shares a window with the tail
            align = 1 if args.no_align or last else part_rows_multiple(cfg.long_len, args.step)
            gp = balance_tail(gp, src[0], src[1], len(lens), align=align)
        planned.append(gp.plan)
        tails.append(gp.tail)
        ballasts.append(gp.ballast or Ballast.empty(cfg.short_len, cfg.long_len))
    firsts = np.cumsum([0, *(t.size for t in tails[:-1])]).tolist()
    given_whole = Ballast.concat(ballasts, firsts)
    planned.append(plan_tail(tails, cfg, given_whole, spread=not args.no_spread))
    given = planned[-1].stats.get("ballast_rows", 0)
    print(f"rows given whole to the tail (balance_tail): {given}")
    rows = [mx.order_plan(p, first, args.step, exchange=False) for p in planned]
    counts = [int(p.long.num_rows) for p, _ in rows]
    offsets = np.cumsum([0, *counts[:-1]])
    bounds = [tier_summary(p.long)["rows_over_bound"] for p, _ in rows]
    last = len(rows) - 1

    def packcli_pass(k: int, p: Plan, s: mx.WindowSpread) -> Plan:
        return mx.exchange_plan(
            p, first, s, spec.seed, int(offsets[k]), k < last, tail_rows if k == last - 1 else None
        )[0]

    variants = {
        "row order alone": lambda k, p, s: p,
        "exchanged, each part on its own windows": lambda k, p, s: mx.exchange_plan(
            p, first, s, spec.seed
        )[0],
        "exchanged on the output's windows (packcli)": packcli_pass,
    }
    shares = [int(p.long.row_tokens.sum()) for p, _ in rows]
    print(f"{args.groups} groups and the tail; long rows per part {counts}; tokens {shares}")
    # The tail is exchanged before the groups' second pass (its rows then known to the last).
    tail_plan = mx.exchange_plan(rows[last][0], first, rows[last][1]["long"], spec.seed,
                                 int(offsets[last]))[0]  # fmt: skip
    tail_rows = None
    if not args.no_carry:
        tl = tail_plan.long
        tail_rows = mx.row_source_tokens(
            tl.row_offsets, tl.row_pieces, mx.source_of(tail_plan.piece_doc, first),
            tail_plan.piece_size, len(lens),
        )  # fmt: skip
    for label, how in variants.items():
        t0 = time.perf_counter()
        parts = [
            tail_plan if how is packcli_pass and k == last else how(k, p, s["long"])
            for k, (p, s) in enumerate(rows)
        ]
        took = time.perf_counter() - t0
        after = [tier_summary(p.long)["rows_over_bound"] for p in parts]
        assert after == bounds  # the same rows, each its tokens: rows / bound unchanged
        print(f"{label}: {took:.2f} s; long rows / bound per part {np.round(after, 6).tolist()}")
        ms = []
        for part in parts:
            src = mx.source_of(part.piece_doc, first)
            layout = part.long
            ms.append(
                mx.row_source_tokens(layout.row_offsets, layout.row_pieces, src, part.piece_len, 4)
            )
        m = np.vstack(ms)
        target = m.sum(axis=0) / m.sum()
        expected = np.vstack([np.outer(x.sum(1), x.sum(0) / x.sum()) for x in ms])
        n_groups = m.shape[0] - ms[-1].shape[0]
        for step in args.steps:
            w = max(1, step // cfg.long_len)
            out = mx.window_deviation(m, w, target)["max"] * 100
            groups = mx.window_deviation(m[:n_groups], w, target)["max"] * 100
            n = n_groups // w * w
            got = m[:n].reshape(-1, w, 4).sum(1)
            want = expected[:n].reshape(-1, w, 4).sum(1)
            own = (np.abs(got - want) / got.sum(1, keepdims=True)).max(0) * 100
            print(
                f"  long {step:>11,}  output {np.round(out, 2)}  groups' rows "
                f"{np.round(groups, 2)}  against their parts' shares {np.round(own, 2)}"
            )
    print(f"  the output's share {np.round(target * 100, 2)}")
    for k, m in enumerate(ms[:-1]):
        print(f"  group {k}'s share {np.round(m.sum(0) / m.sum() * 100, 2)}")


if __name__ == "__main__":
    main()
