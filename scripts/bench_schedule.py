"""Idle GPU share of data-parallel training on packcli's rows: shuffled (the output's order)
against the compute-balanced step schedule (issue 27).

    python scripts/bench_schedule.py OUT            # a packcli output folder
    python scripts/bench_schedule.py --rows 1000000 # schedule time per million rows only

For each config (tier), DP size and rows per rank per step, and two model presets, it
prints the simulated idle share (``packcli.pack.schedule.idle_share``: every rank waits for
the slowest at each step) of the rows in the output's own (shuffled) order and in the
scheduled order, and the time the schedule takes per million rows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from packcli.pack.schedule import idle_share, preset, schedule

DP_SIZES = (8, 64, 512)
ROWS_PER_RANK = (1, 4)
PRESETS = ("llama-1b", "llama-8b")


def tier_rows(out: Path, config: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's tokens and sum of squared segment lengths, in the output's order."""
    tokens, squares = [], []
    for f in sorted((out / "data" / config).glob("*.parquet")):
        col = pq.read_table(f, columns=["seq_lengths"]).column("seq_lengths").combine_chunks()
        offsets = col.offsets.to_numpy()
        lens = col.values.to_numpy().astype(np.float64)
        row = np.repeat(np.arange(len(col)), np.diff(offsets))
        tokens.append(np.bincount(row, weights=lens, minlength=len(col)))
        squares.append(np.bincount(row, weights=lens * lens, minlength=len(col)))
    if not tokens:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(tokens), np.concatenate(squares)


def schedule_seconds(n_rows: int, ranks: int = 64, k: int = 1) -> float:
    cost = np.random.default_rng(0).lognormal(0, 1, n_rows)
    t0 = time.perf_counter()
    schedule(cost, ranks, rows_per_rank=k)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, help="a packcli output folder")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows for the timing")
    args = ap.parse_args()
    if args.out is not None:
        print(
            f"{'tier':6} {'rows':>7} {'model':9} {'DP':>4} {'k':>2} {'steps':>6} "
            f"{'idle shuffled':>14} {'idle scheduled':>15}"
        )
        for config in ("long", "short"):
            tokens, squares = tier_rows(args.out, config)
            for name in PRESETS:
                cost = preset(name).row_cost(tokens, squares)
                for dp in DP_SIZES:
                    for k in ROWS_PER_RANK:
                        steps = cost.size // (dp * k)
                        if steps < 2:
                            continue
                        before = idle_share(cost, dp, rows_per_rank=k)
                        order = schedule(cost, dp, rows_per_rank=k)
                        after = idle_share(cost[order], dp, rows_per_rank=k)
                        print(
                            f"{config:6} {cost.size:>7} {name:9} {dp:>4} {k:>2} {steps:>6} "
                            f"{100 * before:>13.1f}% {100 * after:>14.1f}%"
                        )
    for k in ROWS_PER_RANK:
        secs = schedule_seconds(args.rows, 64, k)
        print(
            f"schedule of {args.rows:,} rows, DP=64, k={k}: {secs:.2f} s "
            f"({secs / args.rows * 1e6:.2f} s per million rows)"
        )


if __name__ == "__main__":
    main()
