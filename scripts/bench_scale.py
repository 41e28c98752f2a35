"""Scale of the plan: peak RSS per process and rows / lower bound, global vs grouped.

The global plan holds every document in one process; the grouped plan
(``packcli.pack.groups``) plans each group of shards in its own process and the released
tail once. Each role runs in a fresh process (a group task generates its own lengths, as a
real one reads only its shards' ``length`` column), so ``ru_maxrss`` is that role's peak.
Lengths are real-shaped (``real_mix``: fitted to 121k documents of real mixed text with
the Llama-3 tokenizer, median ~30 tokens, 0.014% over 128k) or the pretraining mix of
``bench_plan.py``.

    python scripts/bench_scale.py --docs 1000000 10000000 100000000 --global-max 10000000

``io`` measures the store traffic of the stage commands instead: a local moto S3 server
(``tests/s3count.py``, the tests' own) logs every request, and a real-text-shaped jsonl
corpus is packed as on machines that share no disk (``--work-dir s3://...``): ``tokenize``
and ``write`` as N tasks, each a separate ``python -m packcli`` process, then ``plan``,
``finalize`` and ``verify``.
Per N and stage it prints the GET count and bytes, LIST/HEAD/PUT counts, PUT bytes, the bytes
of token shards fetched over the shards' total size, and the stage's peak RSS (the largest
of its processes). Small token shards, output files and groups (``--shard-tokens``,
``--file-tokens``, ``--group-tokens``) give a ~25 MB corpus as many shards, files and groups
as a big job has per task.

    python scripts/bench_scale.py io --size-mb 25 --tasks 1 2 4 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

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


def plan_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--mix", choices=MIXES, default="real")
    ap.add_argument("--docs-per-group", type=int, default=1_000_000)
    ap.add_argument("--global-max", type=int, default=10_000_000, help="skip the global plan above")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
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


# --- io: store traffic of the stage commands -------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent
TOKENIZER = SCRIPTS.parent / "packcli" / "assets" / "demo_tokenizer.json"
STAGES = ("tokenize", "plan", "write", "finalize", "verify")
BUCKET = "bench-io"
MB = 1e6


@dataclass
class Stage:
    name: str
    procs: int
    wall: float
    rss_mb: float  # the largest peak RSS of the stage's processes
    requests: list  # s3count.Request


def make_corpus(path: Path, size_mb: float, seed: int) -> None:
    """Real text shaped like a web/code mix (``make_real_corpus.py``: median ~100 characters,
    a few documents of 1-20 MB); where this machine has too little text for it, words drawn
    at random in the same shape."""
    subprocess.run(
        [sys.executable, SCRIPTS / "make_real_corpus.py", "--out", path, "--size-mb", str(size_mb)],
        check=True,
    )
    if path.stat().st_size < 0.5 * size_mb * 2**20:
        print(f"{path}: too little text on this machine, generating words", file=sys.stderr)
        synthetic_corpus(path, size_mb, seed)


def synthetic_corpus(path: Path, size_mb: float, seed: int) -> None:
    import orjson

    rng = np.random.default_rng(seed)
    words = np.array(["".join(rng.choice(list("etaoinshrdlucmfw"), k)) for k in range(1, 9)] * 64)
    budget = int(size_mb * 2**20)
    with path.open("wb") as fh:
        while budget > 0:
            chars = int(min(rng.lognormal(np.log(100), 1.9), 20 << 20))
            if rng.random() < 1e-4:
                chars = int(2**20 * (1 + rng.exponential(2.0)))  # a huge one, ~1-5 MB
            text = " ".join(rng.choice(words, max(1, chars // 5)))
            line = orjson.dumps({"text": text}) + b"\n"
            fh.write(line)
            budget -= len(line)


# Runs a command and writes its peak RSS (KiB) to argv[1]. A child's ru_maxrss starts at its
# parent's RSS at fork (Linux keeps the high-water mark across exec), and this process holds
# every object of the moto store: so each stage command is forked from this small one instead.
PEAK_RSS = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(rc)"
)


def run_stage(name: str, cmds: list[list[str]], env: dict, jobs: int, logs: Path) -> Stage:
    """Run the stage's processes, ``jobs`` at a time, each with its peak RSS measured."""

    def one(i: int, cmd: list[str]) -> float:
        log, rss = logs / f"{name}-{i}.log", logs / f"{name}-{i}.rss"
        with log.open("wb") as fh:
            wrapped = [sys.executable, "-c", PEAK_RSS, str(rss), *cmd]
            rc = subprocess.call(wrapped, env=env, stdout=fh, stderr=subprocess.STDOUT)
        if rc:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(cmd)} exited {rc}:\n{tail}")
        return int(rss.read_text()) / 1024

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        peaks = list(pool.map(one, range(len(cmds)), cmds))
    return Stage(name, len(cmds), time.perf_counter() - t, max(peaks), [])


def pack_on_store(
    n: int, corpus: str, tokenizer: str, config: Path, env: dict, jobs: int, logs: Path, server
) -> list[Stage]:
    """The five stage commands as a cluster runs them, work folder and output on the store."""
    root = f"s3://{BUCKET}/n{n:02d}"
    where = ["-o", f"{root}/out", "--work-dir", f"{root}/work"]
    cli = [sys.executable, "-m", "packcli"]

    def task(i: int) -> list[str]:
        return ["--task-index", str(i), "--num-tasks", str(n)]

    cmds = {
        "tokenize": [
            [*cli, "tokenize", corpus, "-t", tokenizer, *where, "-c", config, *task(i), "-q"]
            for i in range(n)
        ],
        "plan": [[*cli, "plan", *where, "-c", config, "-q"]],
        "write": [[*cli, "write", *where, "-c", config, *task(i), "-q"] for i in range(n)],
        "finalize": [[*cli, "finalize", *where]],
        "verify": [[*cli, "verify", f"{root}/out"]],
    }
    server.log.take()  # the driver's own requests (upload, clean-up) are not a stage's
    stages = []
    for name in STAGES:
        print(f"N={n}: {name} ({len(cmds[name])} processes)", file=sys.stderr, flush=True)
        stage = run_stage(name, [[str(c) for c in cmd] for cmd in cmds[name]], env, jobs, logs)
        stage.requests = server.log.take()
        stages.append(stage)
    return stages


def sizes(fs, prefix: str, suffix: str) -> tuple[int, int]:
    """(count, bytes) of the files under ``prefix`` whose names end with ``suffix``."""
    found = fs.find(prefix, detail=True)
    hits = [info["size"] for path, info in found.items() if path.endswith(suffix)]
    return len(hits), sum(hits)


IO_HEADER = (
    f"{'N':>3} {'stage':<9}{'procs':>6}{'GET':>7}{'GET MB':>9}{'/input':>7}{'shard MB':>10}"
    f"{'/shards':>8}{'LIST':>6}{'HEAD':>6}{'PUT':>6}{'PUT MB':>8}{'peak MB':>9}{'wall s':>8}"
)


def io_row(n: int, stage: Stage, corpus: tuple[str, int], shards: tuple[str, int]) -> str:
    """One line of the table; ``corpus`` is the input's key and size, ``shards`` the key
    prefix of the token shards and their total size (``.arrow`` files only)."""
    by_op: dict[str, list] = {}
    for r in stage.requests:
        by_op.setdefault(r.op, []).append(r)
    gets, puts = by_op.get("GET", []), by_op.get("PUT", [])
    got = sum(r.sent for r in gets)
    input_got = sum(r.sent for r in gets if r.key == corpus[0])
    shard_got = sum(r.sent for r in gets if r.key.startswith(shards[0]) and ".arrow" in r.key)
    return (
        f"{n:>3} {stage.name:<9}{stage.procs:>6}{len(gets):>7}{got / MB:>9.1f}"
        f"{input_got / corpus[1]:>7.2f}{shard_got / MB:>10.1f}{shard_got / shards[1]:>8.2f}"
        f"{len(by_op.get('LIST', [])):>6}{len(by_op.get('HEAD', [])):>6}{len(puts):>6}"
        f"{sum(r.received for r in puts) / MB:>8.1f}{stage.rss_mb:>9.0f}{stage.wall:>8.1f}"
    )


def io_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="bench_scale.py io", description="Store requests per stage command, on local S3."
    )
    ap.add_argument("--tasks", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="N")
    ap.add_argument("--size-mb", type=float, default=25, help="corpus size")
    ap.add_argument("--corpus", type=Path, help="a jsonl to use instead of making one")
    ap.add_argument("-t", "--tokenizer", default=str(TOKENIZER))
    ap.add_argument("--shard-tokens", type=int, default=1 << 19, help="tokenize: shard_tokens")
    ap.add_argument("--file-tokens", type=int, default=1 << 19, help="write: shard_tokens")
    ap.add_argument("--group-tokens", type=int, default=1 << 20, help="plan: group_tokens")
    ap.add_argument("--split-bytes", type=int, default=1 << 20, help="read: split_bytes")
    ap.add_argument("--jobs", type=int, default=2, help="task processes at a time")
    ap.add_argument("--num-proc", type=int, default=1, help="threads per task process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=Path, help="append every request here (jsonl)")
    args = ap.parse_args(argv)

    import s3fs

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3count import CountingMotoServer  # the tests' counting S3 server

    server = CountingMotoServer()
    server.start()
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(  # the stage commands' store, and this process's own s3fs client's
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=server.endpoint,
    )
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp_dir:
        tmp = Path(tmp_dir)
        corpus = args.corpus
        if corpus is None:
            corpus = tmp / "corpus.jsonl"
            make_corpus(corpus, args.size_mb, args.seed)
        config = tmp / "io.yaml"
        config.write_text(
            f"read:\n  split_bytes: {args.split_bytes}\n"
            f"tokenize:\n  shard_tokens: {args.shard_tokens}\n  num_proc: {args.num_proc}\n"
            f"plan:\n  group_tokens: {args.group_tokens}\n"
            f"write:\n  shard_tokens: {args.file_tokens}\n"
            f"  row_group_tokens: {min(args.file_tokens, 1 << 24)}\n"
        )
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        corpus_url = f"s3://{BUCKET}/corpus/{corpus.name}"
        fs.put_file(str(corpus), corpus_url)
        print(
            f"corpus {corpus_url}: {corpus.stat().st_size / MB:.1f} MB; store {server.endpoint}",
            file=sys.stderr,
        )
        summary = []
        for n in args.tasks:
            env["PACKCLI_CACHE_DIR"] = str(tmp / f"cache-n{n:02d}")
            logs = tmp / f"logs-n{n:02d}"
            logs.mkdir()
            stages = pack_on_store(
                n, corpus_url, args.tokenizer, config, env, args.jobs, logs, server
            )
            root = f"{BUCKET}/n{n:02d}"
            fs.invalidate_cache()
            n_shards, shard_bytes = sizes(fs, f"{root}/work/tokens", ".arrow")
            n_files, file_bytes = sizes(fs, f"{root}/out", ".parquet")
            print(
                f"\nN={n}: {n_shards} token shards, {shard_bytes / MB:.1f} MB; "
                f"{n_files} Parquet files, {file_bytes / MB:.1f} MB\n{IO_HEADER}"
            )
            shards = (f"n{n:02d}/work/tokens/", shard_bytes)
            corpus_at = (corpus_url.removeprefix(f"s3://{BUCKET}/"), corpus.stat().st_size)
            for s in stages:
                print(io_row(n, s, corpus_at, shards), flush=True)
            write = stages[STAGES.index("write")]
            fetched = sum(r.sent for r in write.requests if r.op == "GET" and ".arrow" in r.key)
            summary.append(
                f"{n:>3}{shard_bytes / MB:>10.1f}{fetched / MB:>12.1f}"
                f"{fetched / shard_bytes:>8.2f}{write.rss_mb:>9.0f}"
            )
            if args.requests:
                with args.requests.open("a") as fh:
                    for s in stages:
                        for r in s.requests:
                            fh.write(json.dumps({"n": n, "stage": s.name, **asdict(r)}) + "\n")
            fs.rm(root, recursive=True)  # moto keeps every object in this process's memory
    server.stop()
    print(f"\nwrite stage\n{'N':>3}{'shard MB':>10}{'fetched MB':>12}{'ratio':>8}{'peak MB':>9}")
    print("\n".join(summary))


def main() -> None:
    if sys.argv[1:2] == ["io"]:
        io_main(sys.argv[2:])
    else:
        plan_main(sys.argv[1:])


if __name__ == "__main__":
    main()
