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

``rss`` measures the peak RSS (``ru_maxrss`` of each command, run from a small wrapper
process) and wall time of every stage process as a cluster runs them, one ``python -m
packcli`` process each: ``plan --task-index i --num-tasks N`` (the groups), ``plan`` (the
driver: the tail and ``plan.json``), ``write --task-index i --num-tasks N``, ``finalize``
(with N > 1 it writes the tail's files), ``verify`` (``--num-tasks N``: its part tasks in
this process, one after another; ``--no-verify`` leaves it out; its input re-check is
skipped, as the seed input does not match the synthetic shards). Per corpus size it prints
each stage's largest process and the slope of its peak in bytes per document from the size
before. The work folder is synthetic but real: a one-line jsonl is tokenized by ``packcli
tokenize`` (the stage's own records), then its unit's shards are replaced by shards written
by packcli's ``ShardWriter`` with ``real_mix`` lengths (``synthetic_work``), so the stage
commands run on it unchanged. To keep 100M documents within ~13 GB of disk it is a **scale model**
(``--scale``, default 16): document lengths (rounded up, so a median of 2 tokens, mean 14),
``short_len``, ``long_len``, ``group_tokens`` and both ``shard_tokens`` are divided by the
scale, so documents, pieces and rows per group, groups, token shards and output files are as
at full scale; ``row_group_tokens`` is not (a writer thread holds a row group of 16M tokens
as at full scale). What it understates: a write task's memory-mapped shard pages (its
group's tokens, 1/scale of a full group's ~1 GB) and the tail's pieces (a released row holds
up to ``long_len`` one-token documents: 1/scale as many), so ``--scale 1`` at 1M documents
and the ``plan`` mode above (full-scale lengths) measure those. Token ids are uniform in
0..255 (Parquet at ~1.3 bytes per token). Tokenize is measured on real text
(``make_real_corpus.py``) of growing size, default settings.

    python scripts/bench_scale.py rss --docs 1000000 10000000 100000000 --tokenize-mb 25 100 400
    python scripts/bench_scale.py rss --docs 1000000 --scale 1 --tokenize-mb
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
from dataclasses import asdict, dataclass, field
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


def _group(mix: str, n_docs: int, n_groups: int, g: int, tails: str) -> dict[str, object]:
    """One group task: its lengths, its plan, what it keeps and releases (saved under
    ``tails``, as the plan stage saves a group's ``.tail.npz``)."""
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
        "tail": _save_tail(Path(tails) / f"{g}.npz", gp.tail),
        "tail_pieces": gp.tail.size,
    }


def _save_tail(path: Path, tail: object) -> str:
    np.savez(path, doc=tail.doc, start=tail.start, length=tail.length)  # type: ignore[attr-defined]
    return str(path)


def _tail(paths: list[str], sizes: list[int]) -> dict[str, object]:
    """The tail as the plan stage's driver plans it: the groups' released pieces read one
    group at a time into one set of arrays (``Pieces.gather``)."""
    from packcli.config import PlanConfig
    from packcli.pack.groups import Pieces, plan_tail

    def load(i: int) -> Pieces:
        with np.load(paths[i]) as z:
            return Pieces(z["doc"], z["start"], z["length"])

    base = warm()
    t = time.perf_counter()
    plan = plan_tail([Pieces.gather(sizes, load)], PlanConfig())
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
        tail_dir = tempfile.TemporaryDirectory(prefix="bench-tails-")
        jobs = [(args.mix, n, n_groups, g, tail_dir.name) for g in range(n_groups)]
        with ProcessPoolExecutor(args.workers, max_tasks_per_child=1) as pool:
            groups = list(pool.map(_group, *zip(*jobs, strict=True)))
            sizes = [int(g["tail_pieces"]) for g in groups]  # type: ignore[call-overload]
            tail = pool.submit(_tail, [g["tail"] for g in groups], sizes).result()
            glob = None
            if n <= args.global_max:
                glob = pool.submit(_global, args.mix, n, n_groups).result()
        tail_dir.cleanup()
        parts = [*groups, tail]
        tokens = {k: sum(p["tokens"][k] for p in parts) for k in ("long", "short")}
        rows = {k: sum(p["rows"][k] for p in parts) for k in ("long", "short")}
        ratio = {k: rows[k] / -(-tokens[k] // (L if k == "long" else S)) for k in rows}
        big = max(groups, key=lambda g: g["rss"])
        per_doc = (big["rss"] - big["base"]) * 2**20 / (n / n_groups)
        tail_share = 100 * tail["tail_tokens"] / tokens["long"]
        per_piece = (tail["rss"] - tail["base"]) * 2**20 / max(1, sum(sizes))
        wall = max(g["wall"] for g in groups)
        print(
            f"{n:>11}{n_groups:>7}{'group':>9}{big['rss']:>9.0f}{big['base']:>9.0f}"
            f"{per_doc:>7.0f}{wall:>8.2f}{ratio['long']:>12.6f}{ratio['short']:>12.6f}"
            f"{tail_share:>8.3f}"
        )
        print(
            f"{n:>11}{n_groups:>7}{'tail':>9}{tail['rss']:>9.0f}{tail['base']:>9.0f}"
            f"{per_piece:>7.0f}{tail['wall']:>8.2f}"
            f"{'':>32}  {sum(sizes):,} pieces (B/doc: per piece)"
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
    peaks: list[float] = field(default_factory=list)  # each process's peak RSS, MB
    walls: list[float] = field(default_factory=list)  # each process's wall seconds


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

    def one(i: int, cmd: list[str]) -> tuple[float, float]:
        stem = f"{name.replace(' ', '-')}-{i}"
        log, rss = logs / f"{stem}.log", logs / f"{stem}.rss"
        t0 = time.perf_counter()
        with log.open("wb") as fh:
            wrapped = [sys.executable, "-c", PEAK_RSS, str(rss), *cmd]
            rc = subprocess.call(wrapped, env=env, stdout=fh, stderr=subprocess.STDOUT)
        if rc:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(cmd)} exited {rc}:\n{tail}")
        return int(rss.read_text()) / 1024, time.perf_counter() - t0

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        done = list(pool.map(one, range(len(cmds)), cmds))
    peaks, walls = [p for p, _ in done], [w for _, w in done]
    return Stage(name, len(cmds), time.perf_counter() - t, max(peaks), [], peaks, walls)


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


# --- rss: peak RSS and wall time of every stage process, 1M-100M documents -------------------

# The settings a scale model divides by ``--scale`` (section, key, full-scale default).
SCALED = (
    ("tokenize", "shard_tokens", 64 << 20),
    ("plan", "short_len", 4096),
    ("plan", "long_len", 131072),
    ("plan", "group_tokens", 1 << 28),
    ("write", "shard_tokens", 256 << 20),
)
BATCH_DOCS = 1 << 16  # documents per record batch handed to the shard writer
# The stages measured, in the order a cluster runs them (``--no-verify``: all but verify).
RSS_STAGES = ("plan group", "plan tail", "write", "finalize", "verify")
DRIVERS = ("plan tail", "finalize")  # one per job, whatever its size: must not grow


def scale_config(path: Path, scale: int) -> dict[str, dict[str, int]]:
    """The scale model's config file: token counts and capacities divided by ``scale``, so
    documents, pieces, rows, groups, token shards and output files per document are as at
    full scale; ``write.row_group_tokens`` stays at its default (16M), so what one writer
    thread holds (a row group) is as at full scale too."""
    sections: dict[str, dict[str, int]] = {}
    for section, key, value in SCALED:
        sections.setdefault(section, {})[key] = value // scale
    path.write_text(
        "".join(
            f"{section}:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items())
            for section, keys in sections.items()
        )
    )
    return sections


def synthetic_work(out: Path, config: Path, n_docs: int, scale: int, seed: int) -> dict[str, int]:
    """A work folder of ``n_docs`` documents as ``packcli tokenize`` leaves it, fast: the
    stage's own records from tokenizing a one-line jsonl, then that unit's shard replaced by
    synthetic shards written by packcli's own ``ShardWriter`` (``real_mix`` lengths divided
    by ``scale``, rounded up; token ids uniform in 0..255, so the Parquet output compresses
    to ~1 byte per token) and the unit's completion record updated to match. ``plan``,
    ``write`` and ``finalize`` then run on it unchanged."""
    import pyarrow as pa

    from packcli.arrow_np import list_array, to_arrow
    from packcli.atomic import atomic_write_json
    from packcli.tokenize.shards import SHARD_SCHEMA, SUCCESS, ShardWriter

    seed_doc = out.parent / f"{out.name}-seed.jsonl"
    seed_doc.write_text('{"text": "one seed document"}\n')
    cmd = [sys.executable, "-m", "packcli", "tokenize", seed_doc, "-t", TOKENIZER, "-o", out]
    subprocess.run([str(c) for c in [*cmd, "-c", config, "-q"]], check=True, capture_output=True)
    (unit,) = (out / ".packcli" / "tokens" / "files").iterdir()
    record = json.loads((unit / SUCCESS).read_text())
    for f in unit.glob("shard-*"):
        f.unlink()
    tokens = 0
    with ShardWriter(unit, SCALED[0][2] // scale, schema=SHARD_SCHEMA) as writer:
        for first in range(0, n_docs, BATCH_DOCS):
            m = min(BATCH_DOCS, n_docs - first)
            rng = np.random.default_rng([seed, first])  # 1M documents are 10M's first ones
            lengths = -(-real_mix(m, rng) // scale)
            offsets = np.zeros(m + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            values = rng.integers(0, 256, int(offsets[-1]), dtype=np.int32)
            doc_index = np.arange(first, first + m, dtype=np.int64)
            columns = [
                list_array(offsets, values, pa.int32()),
                to_arrow(lengths, pa.int32()),
                to_arrow(doc_index),
                to_arrow(np.zeros(m, dtype=np.int32)),
                to_arrow(doc_index + 1),  # jsonl lines count from 1
            ]
            writer.add(pa.record_batch(columns, schema=SHARD_SCHEMA))
            tokens += int(offsets[-1])
    record.update(num_docs=n_docs, num_tokens=tokens, shards=writer.manifests)
    record["read_stats"].update(documents=n_docs, lines=n_docs)
    atomic_write_json(unit / SUCCESS, record)
    nbytes = sum(m["bytes"] for m in writer.manifests)
    return {"tokens": tokens, "shards": len(writer.manifests), "bytes": nbytes}


def rss_commands(
    out: Path, config: Path, n_groups: int, tasks: int, verify: bool
) -> dict[str, list[list[str]]]:
    """The stage commands as a Slurm array runs them, each its own process: ``tasks`` plan
    tasks (each plans every ``tasks``-th group), the plan driver (reuses the groups, plans
    the tail, writes ``plan.json``), ``tasks`` write tasks, finalize (the tail's files, the
    report, the card); with ``verify``, ``packcli verify`` of the output."""
    cli = [sys.executable, "-m", "packcli"]
    n = max(1, min(tasks, n_groups))

    def task(i: int) -> list[str]:
        return ["--task-index", str(i), "--num-tasks", str(n)]

    cmds = {
        "plan group": [[*cli, "plan", "-o", out, "-c", config, *task(i), "-q"] for i in range(n)],
        "plan tail": [[*cli, "plan", "-o", out, "-c", config, "-q"]],
        "write": [[*cli, "write", "-o", out, "-c", config, *task(i), "-q"] for i in range(n)],
        "finalize": [[*cli, "finalize", "-o", out]],
    }
    if verify:
        cmds["verify"] = [[*cli, "verify", out, "--num-tasks", n]]
    return {k: [[str(c) for c in cmd] for cmd in v] for k, v in cmds.items()}


def reset_plan(out: Path) -> None:
    """Back to a tokenized work folder (for a repeat): no plan, no write records, no output."""
    import shutil

    work = out / ".packcli"
    for folder in (work / "plan", work / "write", work / "owned", out / "data", out / "stats"):
        shutil.rmtree(folder, ignore_errors=True)
    for f in (work / "plan.json", out / "README.md", out / "packcli.json", out / "rejected.jsonl"):
        f.unlink(missing_ok=True)


@dataclass
class RssRow:
    stage: str
    docs: int
    groups: int
    procs: int
    peak_mb: float  # median over repeats of the stage's largest process peak
    wall: float  # median over repeats of the stage's wall seconds
    proc_wall: float  # median over repeats of its longest process's wall seconds
    input_mb: float = 0.0  # tokenize: the jsonl's size


def _median_row(stage: str, docs: int, groups: int, runs: list[Stage]) -> RssRow:
    return RssRow(
        stage,
        docs,
        groups,
        runs[0].procs,
        float(np.median([r.rss_mb for r in runs])),
        float(np.median([r.wall for r in runs])),
        float(np.median([max(r.walls) for r in runs])),
    )


def tokenize_rows(
    sizes_mb: list[float], tmp: Path, jobs: int, repeat: int, seed: int
) -> list[RssRow]:
    """``packcli tokenize`` of real-text jsonl (``make_real_corpus.py``) of growing size, the
    default config, one process each: its peak should not grow with the input."""
    rows = []
    env = dict(os.environ)
    for mb in sizes_mb:
        corpus = tmp / f"real{mb:g}.jsonl"
        make_corpus(corpus, mb, seed)
        with corpus.open("rb") as fh:
            docs = sum(1 for _ in fh)
        corpus_mb = corpus.stat().st_size / MB
        runs = []
        for r in range(repeat):
            out, logs = tmp / f"tok{mb:g}-{r}", tmp / f"tok{mb:g}-{r}-logs"
            logs.mkdir()
            cmd = [sys.executable, "-m", "packcli", "tokenize", corpus, "-t", TOKENIZER, "-o", out]
            runs.append(run_stage("tokenize", [[str(c) for c in [*cmd, "-q"]]], env, jobs, logs))
            _rmtree(out)
        corpus.unlink()
        rows.append(_median_row("tokenize", docs, 0, runs))
        rows[-1].input_mb = corpus_mb
        print(f"tokenize {mb:g} MB: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def stage_rows(
    n_docs: int, args: argparse.Namespace, tmp: Path
) -> tuple[list[RssRow], dict[str, int]]:
    """One corpus size: the synthetic work folder, then every stage's processes (median of
    ``args.repeat`` runs, each from a tokenized work folder)."""
    from packcli.pack.groups import group_count

    config = tmp / f"scale{args.scale}.yaml"
    scale_config(config, args.scale)
    out = tmp / f"out-{n_docs}"
    t = time.perf_counter()
    made = synthetic_work(out, config, n_docs, args.scale, args.seed)
    made["build_s"] = round(time.perf_counter() - t, 1)
    group_tokens = dict((k, v) for s, k, v in SCALED if s == "plan")["group_tokens"]
    n_groups = min(group_count(made["tokens"], group_tokens // args.scale), made["shards"])
    made["groups"] = n_groups
    print(f"{n_docs:,} documents: {made}", file=sys.stderr, flush=True)
    cmds = rss_commands(out, config, n_groups, args.tasks, args.verify)
    runs: dict[str, list[Stage]] = {name: [] for name in cmds}
    env = dict(os.environ)
    for r in range(args.repeat):
        reset_plan(out)
        logs = tmp / f"logs-{n_docs}-{r}"
        logs.mkdir()
        for name, stage_cmds in cmds.items():
            if name == "verify":  # the seed input no longer matches the synthetic shards:
                # marked changed, so verify's input re-check says so instead of failing
                with open(out.parent / f"{out.name}-seed.jsonl", "a") as fh:
                    fh.write(" ")
            stage = run_stage(name, stage_cmds, env, args.jobs, logs)
            print(
                f"{n_docs:,} run {r}: {name} {stage.procs} proc(s), peak "
                f"{stage.rss_mb:.0f} MB, {stage.wall:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            runs[name].append(stage)
        if r == 0:
            made["output_bytes"] = sum(f.stat().st_size for f in (out / "data").rglob("*.parquet"))
    if not args.keep:
        _rmtree(out)
    return [_median_row(name, n_docs, n_groups, runs[name]) for name in cmds], made


RSS_HEADER = (
    f"{'stage':<18}{'docs':>12}{'groups':>7}{'procs':>6}{'peak MB':>9}{'B/doc':>9}"
    f"{'wall s':>8}{'proc s':>8}"
)


def rss_table(rows: list[RssRow]) -> list[str]:
    """Rows by stage then size; ``B/doc``: the peak's growth per document from the size
    before (the slope), for the same stage."""
    lines = [RSS_HEADER]
    order = {name: i for i, name in enumerate(("tokenize", *RSS_STAGES))}
    rows = sorted(rows, key=lambda r: (order.get(r.stage, len(order)), r.docs))
    prev: RssRow | None = None
    for row in rows:
        slope = ""
        if prev is not None and prev.stage == row.stage and row.docs > prev.docs:
            slope = f"{(row.peak_mb - prev.peak_mb) * 2**20 / (row.docs - prev.docs):.1f}"
        name = f"{row.stage} {row.input_mb:.0f} MB" if row.input_mb else row.stage
        lines.append(
            f"{name:<18}{row.docs:>12,}{row.groups or '':>7}{row.procs:>6}"
            f"{row.peak_mb:>9.0f}{slope:>9}{row.wall:>8.1f}{row.proc_wall:>8.1f}"
        )
        prev = row
    return lines


def rss_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="bench_scale.py rss",
        description="Peak RSS and wall time of every stage process at growing corpus sizes.",
    )
    ap.add_argument("--docs", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument("--scale", type=int, default=16, help="divide token counts and capacities")
    ap.add_argument("--tokenize-mb", type=float, nargs="*", default=[25, 100, 400])
    ap.add_argument("--tasks", type=int, default=2, help="plan and write tasks (processes)")
    ap.add_argument("--jobs", type=int, default=2, help="task processes at a time")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size (medians)")
    ap.add_argument(
        "--no-verify", dest="verify", action="store_false", help="leave `packcli verify` out"
    )
    ap.add_argument("--dir", type=Path, help="where the work folders go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep each size's output folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="append the rows here (jsonl)")
    args = ap.parse_args(argv)
    if args.scale < 1 or 4096 % args.scale:
        raise SystemExit("--scale must divide 4096 (short_len)")
    with tempfile.TemporaryDirectory(prefix="bench-rss-", dir=args.dir) as tmp_dir:
        tmp = Path(tmp_dir)
        rows = tokenize_rows(args.tokenize_mb, tmp, args.jobs, args.repeat, args.seed)
        built = {}
        for n in args.docs:
            stage, built[n] = stage_rows(n, args, tmp)
            rows += stage
            if args.json:
                with args.json.open("a") as fh:
                    for row in stage:
                        fh.write(json.dumps({**asdict(row), "scale": args.scale}) + "\n")
    print(f"\nscale model 1/{args.scale} (tokens per document and capacities); {built}")
    print("\n".join(rss_table(rows)))
    if args.docs:
        top = max(args.docs)
        worst = max(
            (r for r in rows if r.docs == top and not r.stage.startswith("tok")),
            key=lambda r: r.peak_mb,
        )
        print(
            f"\nlargest process at {top:,} documents: {worst.stage}, {worst.peak_mb:.0f} MB "
            f"({'within' if worst.peak_mb <= 3072 else 'OVER'} 3 GB)"
        )


def main() -> None:
    if sys.argv[1:2] == ["io"]:
        io_main(sys.argv[2:])
    elif sys.argv[1:2] == ["rss"]:
        rss_main(sys.argv[2:])
    else:
        plan_main(sys.argv[1:])


if __name__ == "__main__":
    main()
