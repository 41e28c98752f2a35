"""Scale of the plan: peak RSS per process and rows / lower bound, global vs grouped.

The global plan holds every document in one process; the grouped plan
(``packcli.pack.groups``) plans each group of shards in its own process and the released
tail once. Each role runs in a fresh process (a group task generates its own lengths, as a
real one reads only its shards' ``length`` column), so ``ru_maxrss`` is that role's peak.
Lengths are real-shaped (``real_mix``: fitted to 121k documents of real mixed text with
the Llama-3 tokenizer, median ~30 tokens, 0.014% over 128k) or the pretraining mix of
``bench_plan.py``.

    python scripts/bench_scale.py --docs 1000000 10000000 100000000 --global-max 10000000
"""

from __future__ import annotations

import argparse
import resource
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

MIXES = ("real", "pretrain")


def real_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    """Median ~30 tokens (~100 characters), a lognormal body with a heavy tail, and 0.014%
    of documents over 128k tokens (17 of 121k in the real corpus)."""
    lengths = np.clip(rng.lognormal(np.log(30), 1.9, n).astype(np.int64), 1, None)
    huge = rng.random(n) < 1.4e-4
    lengths[huge] = (131072 * (1 + rng.exponential(1.0, int(huge.sum())))).astype(np.int64)
    return lengths


def lengths_of(mix: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if mix == "real":
        return real_mix(n, rng)
    from bench_plan import pretrain_mix

    return pretrain_mix(n, rng)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm() -> float:
    """Load the compiled kernels outside the timings (a tiny plan forced through numba);
    returns the process's RSS then, the base that the per-document slope leaves out."""
    from packcli import jit
    from packcli.config import PlanConfig
    from packcli.pack.plan import plan_two_tier

    with jit.forced("numba"):
        plan_two_tier(np.array([1, 5000, 200_000]), PlanConfig())
    return rss_mb()


def _global(mix: str, n_docs: int, n_groups: int) -> dict[str, float]:
    from packcli.config import PlanConfig
    from packcli.pack.plan import plan_two_tier, tier_summary

    base = warm()
    lengths = np.concatenate(
        [lengths_of(mix, _group_docs(n_docs, n_groups, g), g) for g in range(n_groups)]
    )
    t = time.perf_counter()
    plan = plan_two_tier(lengths, PlanConfig())
    wall = time.perf_counter() - t
    return {
        "wall": wall,
        "rss": rss_mb(),
        "base": base,
        "long": tier_summary(plan.long)["rows_over_bound"],
        "short": tier_summary(plan.short)["rows_over_bound"],
    }


def _group_docs(n_docs: int, n_groups: int, g: int) -> int:
    return n_docs // n_groups + (1 if g < n_docs % n_groups else 0)


def _group(mix: str, n_docs: int, n_groups: int, g: int) -> dict[str, object]:
    """One group task: its lengths, its plan, what it keeps and releases."""
    from packcli.config import PlanConfig
    from packcli.pack.groups import plan_group

    base = warm()
    n = _group_docs(n_docs, n_groups, g)
    first = sum(_group_docs(n_docs, n_groups, i) for i in range(g))
    t = time.perf_counter()
    gp = plan_group(lengths_of(mix, n, g), np.arange(first, first + n), PlanConfig(), g)
    return {
        "wall": time.perf_counter() - t,
        "rss": rss_mb(),
        "base": base,
        "rows": {k: getattr(gp.plan, k).num_rows for k in ("long", "short")},
        "tokens": {k: int(getattr(gp.plan, k).row_tokens.sum()) for k in ("long", "short")},
        "tail": gp.tail,
    }


def _tail(tails: list[object]) -> dict[str, object]:
    from packcli.config import PlanConfig
    from packcli.pack.groups import plan_tail

    base = warm()
    t = time.perf_counter()
    plan = plan_tail(tails, PlanConfig())  # type: ignore[arg-type]
    return {
        "wall": time.perf_counter() - t,
        "rss": rss_mb(),
        "base": base,
        "rows": {k: getattr(plan, k).num_rows for k in ("long", "short")},
        "tokens": {k: int(getattr(plan, k).row_tokens.sum()) for k in ("long", "short")},
        "tail_tokens": plan.stats["tail_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--mix", choices=MIXES, default="real")
    ap.add_argument("--docs-per-group", type=int, default=1_000_000)
    ap.add_argument("--global-max", type=int, default=10_000_000, help="skip the global plan above")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    L, S = 131072, 4096
    print(
        f"{'docs':>11}{'groups':>7}{'process':>9}{'peak MB':>9}{'base MB':>9}{'B/doc':>7}"
        f"{'wall s':>8}{'long/bound':>12}{'short/bound':>12}{'tail %':>8}"
    )
    for n in args.docs:
        n_groups = max(1, n // args.docs_per_group)
        jobs = [(args.mix, n, n_groups, g) for g in range(n_groups)]
        with ProcessPoolExecutor(args.workers, max_tasks_per_child=1) as pool:
            groups = list(pool.map(_group, *zip(*jobs, strict=True)))
            tail = pool.submit(_tail, [g["tail"] for g in groups]).result()
            glob = None
            if n <= args.global_max:
                glob = pool.submit(_global, args.mix, n, n_groups).result()
        parts = [*groups, tail]
        tokens = {k: sum(p["tokens"][k] for p in parts) for k in ("long", "short")}
        rows = {k: sum(p["rows"][k] for p in parts) for k in ("long", "short")}
        ratio = {k: rows[k] / -(-tokens[k] // (L if k == "long" else S)) for k in rows}
        big = max(groups, key=lambda g: g["rss"])
        per_doc = (big["rss"] - big["base"]) * 2**20 / (n / n_groups)
        tail_share = 100 * tail["tail_tokens"] / tokens["long"]
        wall = max(g["wall"] for g in groups)
        print(
            f"{n:>11}{n_groups:>7}{'group':>9}{big['rss']:>9.0f}{big['base']:>9.0f}"
            f"{per_doc:>7.0f}{wall:>8.2f}{ratio['long']:>12.6f}{ratio['short']:>12.6f}"
            f"{tail_share:>8.3f}"
        )
        print(
            f"{n:>11}{n_groups:>7}{'tail':>9}{tail['rss']:>9.0f}{tail['base']:>9.0f}"
            f"{'':>7}{tail['wall']:>8.2f}"
        )
        if glob:
            per_doc = (glob["rss"] - glob["base"]) * 2**20 / n
            print(
                f"{n:>11}{1:>7}{'global':>9}{glob['rss']:>9.0f}{glob['base']:>9.0f}"
                f"{per_doc:>7.0f}{glob['wall']:>8.2f}{glob['long']:>12.6f}{glob['short']:>12.6f}"
            )


if __name__ == "__main__":
    main()
