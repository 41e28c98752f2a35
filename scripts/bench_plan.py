"""Planner speed and quality on generated length mixes (lengths only, no tokens).

Prints, per mix and size: median wall time of ``pack_lengths`` (bfd/ffd) and of the full
two-tier ``plan_two_tier``, and rows against the lower bound ceil(tokens / capacity).

    python scripts/bench_plan.py --sizes 1000000 10000000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from packcli import jit
from packcli.config import PlanConfig
from packcli.pack.binpack import pack_lengths
from packcli.pack.plan import plan_two_tier, tier_summary


def sft_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal, median ~350 tokens, clipped to 4096 (chat/SFT-like)."""
    return np.clip(rng.lognormal(np.log(350), 1.0, n).astype(np.int64), 1, 4096)


def pretrain_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    """Mostly short web-like documents with a heavy tail up to hundreds of thousands."""
    lengths = np.clip(rng.lognormal(np.log(600), 1.2, n).astype(np.int64), 1, None)
    tail = rng.random(n) < 0.03
    lengths[tail] = (4096 * np.exp(rng.exponential(1.0, int(tail.sum())))).astype(np.int64)
    return np.minimum(lengths, 600_000)


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # Compile / load the numba cache outside the timings (forced: inputs this small would run
    # the kernels as plain Python).
    with jit.forced("numba"):
        pack_lengths(np.array([1, 2, 3]), 8)
        plan_two_tier(np.array([1, 5000, 200_000]), PlanConfig())
    print(f"{'mix':<9}{'N':>11}{'what':>22}{'median s':>10}{'rows':>11}{'rows/bound':>12}")
    for n in args.sizes:
        for name, mix in (("sft", sft_mix), ("pretrain", pretrain_mix)):
            lengths = mix(n, np.random.default_rng(args.seed))
            if name == "sft":
                for alg in ("bfd", "ffd"):
                    t, a = median_time(
                        lambda a=alg, x=lengths: pack_lengths(x, 4096, algorithm=a), args.repeats
                    )
                    rows = int(a.max()) + 1  # type: ignore[union-attr]
                    bound = -(-int(lengths.sum()) // 4096)
                    print(
                        f"{name:<9}{n:>11,}{'pack_lengths ' + alg:>22}{t:>10.3f}"
                        f"{rows:>11,}{rows / bound:>12.6f}"
                    )
            t, plan = median_time(lambda x=lengths: plan_two_tier(x, PlanConfig()), args.repeats)
            for tier in ("short", "long"):
                s = tier_summary(getattr(plan, tier))
                print(
                    f"{name:<9}{n:>11,}{'plan_two_tier ' + tier:>22}{t:>10.3f}"
                    f"{s['rows']:>11,}{s['rows_over_bound']:>12.6f}"
                )


if __name__ == "__main__":
    main()
