"""Idle GPU share of data-parallel training on packcli's rows: shuffled (the output's order)
against the compute-balanced step schedule (issue 27).

    python scripts/bench_schedule.py OUT            # a packcli output folder
    python scripts/bench_schedule.py --rows 1000000 # schedule time per million rows only

For each config (tier), DP size and rows per rank per step, and two model presets, it
prints the simulated idle share (``packcli.pack.schedule.idle_share``: every rank waits for
the slowest at each step) of the rows in the output's own (shuffled) order and in the
scheduled order, and the time the schedule takes per million rows.

Then the context-parallel padding ``packcli pack --cp-size C`` adds, for C in 2, 4, 8, from
the output's segments (an unpadded pack): each segment pads to a multiple of 2C, so a
tier's padding is ``sum((-len) % 2C)`` over its segments, whatever the rows (the pieces do
not depend on C); the rows come from planning the output's pieces again with ``cp_size=C``
(``plan_two_tier``, the packer's own planner), against the same plan with C = 1. The share
among segments longer than ``short_len`` (the documents context parallelism is for) is shown
apart: a segment pads by ``(2C - 1) / 2`` tokens on average whatever its length, so the
share is set by the corpus's documents per token, which no placement changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from packcli.config import PlanConfig
from packcli.pack.plan import plan_two_tier
from packcli.pack.schedule import idle_share, preset, schedule
from packcli.publish.marker import read_marker

DP_SIZES = (8, 64, 512)
CP_SIZES = (2, 4, 8)
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


def segment_lengths(out: Path, config: str) -> np.ndarray:
    """Every segment's length, file after file (an unpadded output: its pieces)."""
    parts = [
        pq.read_table(f, columns=["seq_lengths"]).column("seq_lengths").combine_chunks().values
        for f in sorted((out / "data" / config).glob("*.parquet"))
    ]
    return np.concatenate([p.to_numpy() for p in parts]).astype(np.int64) if parts else np.zeros(0)


def cp_padding(out: Path) -> None:
    """Padding share and rows of each tier at ``--cp-size C`` (see the module docstring)."""
    plan = read_marker(out).config["plan"]
    if int(plan.get("cp_size", 1)) > 1:
        raise SystemExit(f"{out} is padded already: give an output packed without --cp-size")
    pieces = segment_lengths(out, "long")  # every piece once (short packs sit in long rows)
    base = PlanConfig(short_len=int(plan["short_len"]), long_len=int(plan["long_len"]))
    plain = plan_two_tier(pieces, base)
    print(f"\n{'C':>2} {'2C':>3} {'tier':6} {'segments':>9} {'tokens':>12} {'pad tokens':>11} "
          f"{'pad share':>10} {'of long docs':>13} {'rows':>7} {'rows C=1':>9}")  # fmt: skip
    for cp in CP_SIZES:
        m = 2 * cp
        padded = plan_two_tier(pieces, dataclasses.replace(base, cp_size=cp))
        for config in ("long", "short"):
            lens = segment_lengths(out, config)
            pad = int(((-lens) % m).sum())
            share = pad / (int(lens.sum()) + pad) if lens.size else 0.0
            # The share among segments longer than a short pack: the documents CP is for.
            big = lens[lens > base.short_len]
            big_pad = int(((-big) % m).sum())
            big_share = f"{100 * big_pad / (int(big.sum()) + big_pad):.3f}%" if big.size else "-"
            rows, rows_plain = getattr(padded, config).num_rows, getattr(plain, config).num_rows
            print(
                f"{cp:>2} {m:>3} {config:6} {lens.size:>9,} {int(lens.sum()):>12,} {pad:>11,} "
                f"{100 * share:>9.3f}% {big_share:>13} {rows:>7,} {rows_plain:>9,}"
            )


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
        cp_padding(args.out)
    for k in ROWS_PER_RANK:
        secs = schedule_seconds(args.rows, 64, k)
        print(
            f"schedule of {args.rows:,} rows, DP=64, k={k}: {secs:.2f} s "
            f"({secs / args.rows * 1e6:.2f} s per million rows)"
        )


if __name__ == "__main__":
    main()
