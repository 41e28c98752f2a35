"""packcli's planner and in-memory pack stage against TRL's ``pack_dataset`` (GitHub issue 3).

Both length mixes of ``bench_plan.py`` (``sft``: lognormal, median ~350, clipped to 4096;
``pretrain``: heavy tail up to 600k tokens) become one Arrow table of random int32 token ids
(vocab 128k) per size, built identically from a fixed seed. On it, in the same run:

- ``plan pack_lengths bfd``  packcli's bin packer over the lengths only, at 4096 (sft only:
  it takes items up to the capacity);
- ``plan plan_two_tier``     the whole two-tier plan over the lengths only (both tiers);
- ``pack_table``             the full in-memory pack stage: the two-tier plan plus gathering
  tokens into rows of *both* configs with ``input_ids``, ``segment_ids``, ``seq_lengths``,
  ``doc_ids``, ``num_tokens`` (the work ``packcli pack`` does before Parquet);
- ``pack one tier``          the same for only the config compared with TRL
  (``pack_table(..., configs=(tier,))``: it plans and gathers what that config needs), since
  TRL builds one config;
- ``trl bfd`` / ``trl bfd_split``  ``trl.pack_dataset(dataset, seq_length, strategy=...)`` at
  its defaults (``Dataset.map`` in batches of 1000) on a ``datasets.Dataset`` over the same
  Arrow table.

The comparison is at 4096 for ``sft`` (packcli's ``short`` config: every sft document is
short) and at 131072 for ``pretrain`` (packcli's ``long`` config, which holds every token:
long documents plus whole short packs, documents over 131072 split). Each method runs in a
fresh spawned process, so its peak RSS is its own: ``peak GB`` is the process's high-water
mark during the method (input included; ``VmHWM`` is reset once the input is built) and
``+GB`` is that peak minus the resident size with the input built. ``median s`` is the median
of the repeats and ``1st s`` the first, which also pays for first-touching fresh memory (slow
on the VM dev machine). ``rows/bound`` divides rows by ceil(output tokens / capacity);
``dropped`` is input tokens minus output tokens.

    python scripts/bench_pack.py                      # sft 100k and 1M, pretrain 100k
    python scripts/bench_pack.py --sft-sizes 100000 --pretrain-sizes 100000 --repeats 1

TRL is only needed here: ``pip install -e '.[bench]'`` (or ``pip install trl``).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_plan import pretrain_mix, sft_mix

VOCAB = 128_000
MIXES = {"sft": (sft_mix, 4096), "pretrain": (pretrain_mix, 131072)}
OURS = ("plan pack_lengths bfd", "plan plan_two_tier", "pack_table", "pack one tier")
TRL = ("trl bfd", "trl bfd_split")


def token_table(lengths: np.ndarray, seed: int) -> Any:
    """One ``input_ids`` list<int32> column with the given lengths and random ids."""
    import pyarrow as pa

    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise SystemExit(f"{offsets[-1]:,} tokens do not fit int32 list offsets; use a smaller N")
    values = np.random.default_rng(seed + 1).integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    return pa.table({"input_ids": ids})


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _list_tokens(table: Any, column: str = "input_ids") -> tuple[int, int]:
    """(total tokens, longest row) of a list column."""
    import pyarrow.compute as pc

    lens = pc.list_value_length(table.column(column))
    return int(pc.sum(lens).as_py() or 0), int(pc.max(lens).as_py() or 0)


def run_method(method: str, mix: str, n: int, seed: int, repeats: int) -> dict[str, Any]:
    """Runs in a fresh process: build the input, warm up, time ``repeats`` runs."""
    make, capacity = MIXES[mix]
    lengths = make(n, np.random.default_rng(seed))
    input_tokens = int(lengths.sum())
    needs_table = method.startswith(("pack", "trl"))
    table = token_table(lengths, seed) if needs_table else None

    if method.startswith("trl"):
        import datasets
        from datasets.table import InMemoryTable
        from trl.data_utils import pack_dataset

        datasets.disable_progress_bars()
        strategy = method.split()[1]
        dataset = datasets.Dataset(InMemoryTable(table))
        pack_dataset(dataset.select(range(10)), 64, strategy=strategy)  # imports, warm caches

        def fn() -> Any:
            return pack_dataset(dataset, capacity, strategy=strategy)

        def measure(out: Any) -> tuple[int, int, int]:
            return (len(out), *_list_tokens(out.data.table))

    else:
        from packcli.config import PlanConfig
        from packcli.pack.binpack import pack_lengths
        from packcli.pack.plan import plan_two_tier, tier_summary
        from packcli.write import pack_table

        config = PlanConfig(short_len=4096, long_len=131072, algorithm="bfd", seed=0)
        tier = "short" if capacity == config.short_len else "long"
        from packcli import jit

        # Load the numba cache (or compile) outside the timings (forced: inputs this small
        # would run the kernels as plain Python).
        with jit.forced("numba"):
            pack_lengths(np.array([1, 2, 3]), 8)
            plan_two_tier(np.array([1, 5000, 200_000]), config)
        if method == "plan pack_lengths bfd":

            def fn() -> Any:
                return pack_lengths(lengths, capacity, algorithm="bfd")

            def measure(out: Any) -> tuple[int, int, int]:
                rows = int(out.max()) + 1
                row_tokens = np.bincount(out, weights=lengths)
                return rows, input_tokens, int(row_tokens.max())

        elif method == "plan plan_two_tier":

            def fn() -> Any:
                return plan_two_tier(lengths, config)

            def measure(out: Any) -> tuple[int, int, int]:
                s = tier_summary(getattr(out, tier))
                return s["rows"], s["tokens"], s["max_row_tokens"]

        elif method == "pack_table":

            def fn() -> Any:
                long, short, _ = pack_table(table, config)
                return long if tier == "long" else short

        elif method == "pack one tier":

            def fn() -> Any:
                # Only the config compared with TRL, which builds one.
                long, short, _ = pack_table(table, config, configs=(tier,))
                return long if tier == "long" else short

        else:
            raise ValueError(f"unknown method {method!r}")
        if method.startswith("pack"):
            import pyarrow.compute as pc

            pack_table(token_table(np.array([3, 5000]), seed), config)

            def measure(out: Any) -> tuple[int, int, int]:
                tokens = pc.sum(out.column("num_tokens")).as_py() or 0
                return out.num_rows, int(tokens), _list_tokens(out)[1]

    gc.collect()
    base_kb = _status_kb("VmRSS")
    reset = _reset_peak()
    times, summary = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        summary = measure(out)
        del out
        gc.collect()
    peak_kb = _status_kb("VmHWM") if reset else None
    if peak_kb is None:  # no /proc: the lifetime peak of this process
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert summary is not None
    rows, out_tokens, longest = summary
    if longest > capacity:
        raise AssertionError(f"{method}: a row holds {longest} tokens > {capacity}")
    bound = -(-out_tokens // capacity)
    return {
        "method": method,
        "mix": mix,
        "n": n,
        "capacity": capacity,
        "seconds": statistics.median(times),
        "times": times,
        "peak_gb": peak_kb / 2**20,
        "delta_gb": (peak_kb - base_kb) / 2**20 if base_kb is not None else float("nan"),
        "rows": rows,
        "rows_over_bound": rows / bound if bound else 1.0,
        "input_tokens": input_tokens,
        "output_tokens": out_tokens,
        "dropped": input_tokens - out_tokens,
    }


def _child(conn: Any, *args: Any) -> None:
    try:
        conn.send(run_method(*args))
    except BaseException as e:  # report, then let the parent decide
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def in_fresh_process(*args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, *args))
    proc.start()
    child.close()
    try:
        result = parent.recv()
    except EOFError:
        result = {"error": "worker died (out of memory?)"}
    proc.join()
    if proc.exitcode not in (0, None) and "error" not in result:
        result = {"error": f"worker exit code {proc.exitcode}"}
    return result


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--pretrain-sizes", type=int, nargs="*", default=[100_000])
    ap.add_argument("--repeats", type=int, default=3, help="runs per method; median reported")
    ap.add_argument("--trl-repeats", type=int, default=None, help="runs per TRL method [--repeats]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-trl", action="store_true", help="time packcli only")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    have_trl = importlib.util.find_spec("trl") is not None
    if not have_trl and not args.skip_trl:
        sys.exit(
            "bench_pack.py compares against TRL, which is not installed.\n"
            "Install it with: pip install -e '.[bench]'   (or: pip install trl)\n"
            "or run packcli's side alone with --skip-trl."
        )
    methods = OURS + (() if args.skip_trl else TRL)
    trl_repeats = args.trl_repeats or args.repeats
    print(
        f"python {platform.python_version()}, packcli {_version('packcli')}, "
        f"trl {_version('trl')}, datasets {_version('datasets')}, "
        f"pyarrow {_version('pyarrow')}, numpy {_version('numpy')}, numba {_version('numba')}; "
        f"repeats {args.repeats} (trl {trl_repeats}), seed {args.seed}"
    )
    header = (
        f"{'method':<22}{'mix':<9}{'N':>10}{'cap':>8}{'median s':>10}{'1st s':>9}{'peak GB':>9}"
        f"{'+GB':>7}{'rows':>10}{'rows/bound':>12}{'dropped':>20}"
    )
    print(header, flush=True)
    results: list[dict[str, Any]] = []
    jobs = [("sft", n) for n in args.sft_sizes] + [("pretrain", n) for n in args.pretrain_sizes]
    for mix, n in jobs:
        for method in methods:
            if method == "plan pack_lengths bfd" and mix != "sft":
                continue  # pack_lengths takes items up to the capacity; plan_two_tier splits
            reps = trl_repeats if method.startswith("trl") else args.repeats
            r = in_fresh_process(method, mix, n, args.seed, reps)
            if "error" in r:
                print(f"{method:<22}{mix:<9}{n:>10,}  failed: {r['error']}", flush=True)
                continue
            results.append(r)
            dropped = f"{r['dropped']:,}"
            if r["dropped"]:
                dropped += f" ({r['dropped'] / r['input_tokens']:.1%})"
            print(
                f"{method:<22}{mix:<9}{n:>10,}{r['capacity']:>8,}{r['seconds']:>10.3f}{r['times'][0]:>9.3f}"
                f"{r['peak_gb']:>9.2f}{r['delta_gb']:>7.2f}{r['rows']:>10,}"
                f"{r['rows_over_bound']:>12.6f}{dropped:>20}",
                flush=True,
            )

    print("\nspeed-up of packcli over TRL (TRL pack_dataset time / packcli time, same run):")
    print(f"{'packcli step':<22}{'mix':<9}{'N':>10}{'vs trl bfd':>12}{'vs trl bfd_split':>18}")
    by_key = {(r["method"], r["mix"], r["n"]): r for r in results}
    for mix, n in jobs:
        for ours in OURS:
            mine = by_key.get((ours, mix, n))
            if mine is None:
                continue
            cells = []
            for peer in TRL:
                other = by_key.get((peer, mix, n))
                cells.append(f"{other['seconds'] / mine['seconds']:.1f}x" if other else "-")
            print(f"{ours:<22}{mix:<9}{n:>10,}{cells[0]:>12}{cells[1]:>18}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
