"""Attention-cost balance of the long tier (``--balance attention``) on long-context mixes.

A long row's attention cost is sum(segment length^2); the balance ratio is max / mean of that
over the long tier's rows (what ``packcli pack`` reports). Sum over all rows is fixed by the
documents, so only the costliest row can move, and never below the largest document's own
cost (``floor``). For each mix this plans the two tiers with ``--balance none`` and
``attention`` and prints the ratio before and after, the floor, the long tier's rows against
the lower bound, the row delta and the planning time.

    python scripts/bench_balance.py                  # both mixes at 100k and 1M documents
    python scripts/bench_balance.py --sizes 100000

Mixes (fixed seed): ``longctx`` has 25% documents log-uniform between 8k and 64k tokens and
75% SFT-like short ones (lognormal, median ~350, up to 4096); ``pretrain64k`` is the
pretraining mix of ``bench_plan.py`` with documents capped at 64k tokens. Both pair several
large documents in a row, which is where balance matters.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_plan import pretrain_mix, sft_mix

from packcli.config import PlanConfig
from packcli.pack.plan import plan_two_tier, tier_summary


def longctx_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    """25% long-context documents (log-uniform 8k..64k) among SFT-like short ones."""
    lengths = sft_mix(n, rng)
    long = rng.random(n) < 0.25
    lengths[long] = np.exp(rng.uniform(np.log(8192), np.log(65536), int(long.sum()))).astype(
        np.int64
    )
    return lengths


def pretrain64k_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.minimum(pretrain_mix(n, rng), 65536)


MIXES = {"longctx": longctx_mix, "pretrain64k": pretrain64k_mix}


def row_costs(plan: object) -> np.ndarray:
    """sum(segment length^2) of every long row, from the layout itself."""
    layout = plan.long  # type: ignore[attr-defined]
    sq = plan.piece_len[layout.row_pieces].astype(np.float64) ** 2  # type: ignore[attr-defined]
    rows = np.repeat(np.arange(layout.num_rows), np.diff(layout.row_offsets))
    return np.bincount(rows, weights=sq, minlength=layout.num_rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    plan_two_tier(np.array([1, 5000, 200_000]), PlanConfig(balance="attention"))  # compile
    print(
        f"{'mix':<12}{'N':>11}{'balance':>10}{'ratio':>8}{'floor':>8}{'long rows':>11}"
        f"{'rows/bound':>12}{'+rows':>7}{'moves':>7}{'plan s':>8}"
    )
    for n in args.sizes:
        for name, mix in MIXES.items():
            lengths = mix(n, np.random.default_rng(args.seed))
            base_rows = None
            for balance in ("none", "attention"):
                t = time.perf_counter()
                plan = plan_two_tier(lengths, PlanConfig(balance=balance))
                dt = time.perf_counter() - t
                s = tier_summary(plan.long)
                b = plan.stats["long_attention_balance"]
                cost = row_costs(plan)
                ratio = cost.max() / cost.mean()
                floor = float(plan.piece_len.max()) ** 2 / cost.mean()
                base_rows = s["rows"] if base_rows is None else base_rows
                print(
                    f"{name:<12}{n:>11,}{balance:>10}{ratio:>8.3f}{floor:>8.3f}{s['rows']:>11,}"
                    f"{s['rows_over_bound']:>12.6f}{s['rows'] - base_rows:>+7}"
                    f"{b.get('moves', 0):>7}{dt:>8.2f}"
                )


if __name__ == "__main__":
    main()
