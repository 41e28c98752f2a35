"""Mixture benchmark (issue 26): how well each optimizer step's mix holds its target.

Four sources of very different length distributions (fortune-like ~30 tokens, man-page-like
~2.5k, source files lognormal ~700, books 40k-200k), target shares 0.5/0.2/0.2/0.1 (share
mode: multipliers from the counted tokens), planned two-tier as packcli plans a mixture
(``packcli.pack.mixture.expand`` then ``plan_two_tier``). Per config and step size: the
largest and 99th-percentile deviation of a step window's source share from the config's own
realised share, for the shuffled order (the baseline: packcli's row shuffle, a random order)
and the mix order; rows / lower bound; plan and order time.

    python scripts/bench_mixture.py --scale 1.0
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from packcli.pack import mixture as mx
from packcli.pack.plan import plan_two_tier, tier_summary
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
    ap.add_argument("--steps", type=int, nargs="+", default=[1 << 20, 4 << 20, 8 << 20])
    args = ap.parse_args()
    lens = lengths(args.scale, args.seed)
    tokens = np.array([x.sum() for x in lens])
    shares = np.array([0.5, 0.2, 0.2, 0.1])
    mult = mx.multipliers_from_shares(shares, tokens)
    first = np.cumsum([0] + [x.size for x in lens[:-1]])
    all_lens = np.concatenate(lens)
    spec = mx.MixSpec(("fortunes", "manpages", "code", "books"), tuple(mult), ("split",) * 4)
    t0 = time.perf_counter()
    ex = mx.expand(all_lens, np.arange(all_lens.size), first, spec, 131072)
    plan = plan_two_tier(ex.lengths, PlanConfig())
    plan_s = time.perf_counter() - t0
    src = mx.source_of(ex.keys[plan.piece_doc], first)
    print(f"documents {all_lens.size:,}, copies {ex.keys.size:,}, multipliers {np.round(mult, 3)}")
    print(f"plan (expand + two-tier) {plan_s:.2f} s")
    print(
        "config  step tokens  rows/bound  order s  source      share   shuffled max"
        "  mix max  mix p99"
    )
    for tier in ("short", "long"):
        layout = getattr(plan, tier)
        m = mx.row_source_tokens(layout.row_offsets, layout.row_pieces, src, plan.piece_len, 4)
        t1 = time.perf_counter()
        order = mx.mix_order(m)
        order_s = time.perf_counter() - t1
        bound = tier_summary(layout)["rows_over_bound"]
        share = m.sum(axis=0) / m.sum()
        for step in args.steps:
            w = max(1, step // layout.capacity)
            base = mx.window_deviation(m, w)
            mixed = mx.window_deviation(m[order], w)
            for k, name in enumerate(spec.names):
                print(
                    f"{tier:<7} {step:>11,} {bound:>11.6f} {order_s:>8.2f}  {name:<10} "
                    f"{share[k] * 100:>6.2f}% {base['max'][k] * 100:>11.2f}pt "
                    f"{mixed['max'][k] * 100:>6.2f}pt {mixed['p99'][k] * 100:>6.2f}pt"
                )


if __name__ == "__main__":
    main()
