"""Fixed cost of ``packcli pack`` on a small input: what every run and cluster task pays.

Runs ``python -m packcli pack IN -t TOK -o OUT -q`` in fresh processes (one warm-up, then
``--repeats``), each into a fresh output folder with a shared scratch ``PACKCLI_CACHE_DIR``
(so the warm-up fills the caches a user's second run finds), and prints the median wall
time and CPU time (user + sys of the child; on a shared machine CPU time is the steadier
figure). Then one more run in a harness that times the phases of the same command: Python
start-up and exit, imports, tokenizer load, backend self-check, tokenizing, planning,
writing, the card, and the rest; and which heavy modules (pandas, datasets, numba, ...)
each phase imported. Phases that the pipeline does not have (renamed functions) are left
out with a note, so the script keeps working while the pipeline changes.

    python scripts/bench_fixed_cost.py                 # 100 documents of sample/corpus.jsonl
    python scripts/bench_fixed_cost.py --docs 1000 --repeats 3
    python scripts/bench_fixed_cost.py --input my.jsonl --tokenizer my/tokenizer.json
    python scripts/bench_fixed_cost.py --jit   # where packcli.jit.SMALL_WORK comes from
    python scripts/bench_fixed_cost.py --against ../base --repeats 9   # A/B, interleaved

``--against OTHER`` (another checkout, e.g. a worktree of main) alternates the same command
between this checkout and OTHER (ABBA order, each with its own warmed cache) and prints both
medians: on a shared machine, runs far apart in time do not compare.

``--jit`` times ``plan_two_tier`` on the pretraining mix of ``bench_plan.py`` in fresh
processes, every kernel as plain Python against every kernel compiled (numba's import and
cache loads included, as a run pays them), by CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "datasets", "numba", "torch", "transformers", "scipy", "matplotlib")

# Runs in the child: wraps pipeline functions with timers, then runs the CLI as usual.
HARNESS = textwrap.dedent(
    """
    import json, os, sys, time
    # The console script sets this before numpy is imported; the timed imports come first here.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    t_start = time.perf_counter()
    c_start = time.process_time()
    HEAVY = {heavy!r}
    phases = []  # (name, wall, cpu, imported heavy modules); nested phases are subtracted

    def loaded():
        return {{m for m in HEAVY if m in sys.modules}}

    stack = []

    def timed(name, func):
        def wrapper(*args, **kwargs):
            before = loaded()
            stack.append([0.0, 0.0, set()])  # time and imports of nested phases
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                w, c = time.perf_counter() - w0, time.process_time() - c0
                inner = stack.pop()
                new = loaded() - before
                if stack:
                    stack[-1][0] += w
                    stack[-1][1] += c
                    stack[-1][2] |= new
                phases.append((name, w - inner[0], c - inner[1], sorted(new - inner[2])))
        return wrapper

    def imported(name, module):
        before = loaded()
        w0, c0 = time.perf_counter(), time.process_time()
        __import__(module)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        phases.append((name, w, c, sorted(loaded() - before)))

    imported("import packcli.cli", "packcli.cli")
    imported("import packcli.stages.run", "packcli.stages.run")
    import importlib, pkgutil
    import packcli.stages
    stages = [importlib.import_module(m.name)
              for m in pkgutil.iter_modules(packcli.stages.__path__, "packcli.stages.")]
    missing = []
    for name, attr in {phases!r}:
        # Patched wherever a stage module looks the function up (its own or an import).
        holders = [m for m in stages if hasattr(m, attr)]
        if not holders:
            missing.append(attr)
        wrapped = timed(name, getattr(holders[0], attr)) if holders else None
        for m in holders:
            setattr(m, attr, wrapped)
    import atexit
    import packcli.cli
    sys.argv = ["packcli", *{argv!r}]
    w0, c0 = time.perf_counter(), time.process_time()

    def dump():
        phases.append(("run_pack total", time.perf_counter() - w0, time.process_time() - c0, []))
        with open({result!r}, "w") as f:
            json.dump(
                {{"phases": phases, "missing": missing,
                  "harness_wall": time.perf_counter() - t_start,
                  "harness_cpu": time.process_time() - c_start}},
                f,
            )

    # As the console script runs it (its exit handlers run before its os._exit), else main.
    atexit.register(dump)
    entry = getattr(packcli.cli, "console", None) or packcli.cli.main
    try:
        entry()
    except SystemExit:
        pass
    """
)

# (label, function name in the packcli.stages modules); the functions are looked up by name.
PHASES = [
    ("tokenize: load tokenizer", "load_tokenizer"),
    ("tokenize: choose backend + self-check", "choose_backend"),
    ("tokenize: read/encode/shards", "_tokenize_unit"),
    ("tokenize task (rest)", "tokenize_task"),
    ("plan: plan_two_tier", "plan_two_tier"),
    ("plan stage (rest)", "plan_stage"),
    ("write", "write_task"),
    ("finalize: card", "render_card"),
    ("finalize (rest)", "finalize_stage"),
]


def _child_env(cache: Path, root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PACKCLI_CACHE_DIR"] = str(cache)
    # As on a user's machine: Python keeps compiled modules (some sandboxes set this, and
    # then every run compiles packcli's sources again, ~0.15 s).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def _input(args: argparse.Namespace, tmp: Path) -> Path:
    if args.input is not None:
        return args.input
    source = ROOT / "sample" / "corpus.jsonl"
    if not source.is_file():
        source = tmp / "sample.jsonl"
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_sample_corpus.py"), "--out", str(source)],
            check=True,
            cwd=ROOT,
        )
    path = tmp / f"docs-{args.docs}.jsonl"
    with open(source, "rb") as src, open(path, "wb") as dst:
        for i, line in enumerate(src):
            if i == args.docs:
                break
            dst.write(line)
    return path


JIT_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {scripts!r})
    import numpy as np
    from bench_plan import pretrain_mix
    from packcli import jit
    from packcli.config import PlanConfig
    from packcli.pack.plan import plan_two_tier
    lengths = pretrain_mix({n}, np.random.default_rng(0))
    c0 = time.process_time()
    with jit.forced({mode!r}):
        plan_two_tier(lengths, PlanConfig())
    print(time.process_time() - c0)
    """
)


def jit_threshold(sizes: list[int], repeats: int) -> None:
    print(f"{'documents':>10}{'python s':>10}{'numba s':>10}  (CPU, median of {repeats}, cold)")
    for n in sizes:
        medians = []
        for mode in ("python", "numba"):
            code = JIT_CHILD.format(scripts=str(ROOT / "scripts"), n=n, mode=mode)
            env = _child_env(Path(tempfile.gettempdir()))
            times = [
                float(
                    subprocess.run(
                        [sys.executable, "-c", code],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                )
                for _ in range(repeats)
            ]
            medians.append(statistics.median(times))
        print(f"{n:>10,}{medians[0]:>10.3f}{medians[1]:>10.3f}")


def _summary(runs: list[tuple[float, float]]) -> str:
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    return (
        f"wall median {statistics.median(walls):.3f} s "
        f"(min {min(walls):.3f}, max {max(walls):.3f}); "
        f"CPU user+sys median {statistics.median(cpus):.3f} s "
        f"(min {min(cpus):.3f}, max {max(cpus):.3f})"
    )


def against(other: Path, argv: list[str], out: Path, tmp: Path, repeats: int) -> None:
    """This checkout (A) and ``other`` (B), alternated A B B A ..., after a warm-up each."""
    roots = {"this": ROOT, "other": other.resolve()}
    envs = {k: _child_env(tmp / f"cache-{k}", root) for k, root in roots.items()}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in roots}
    loads = []
    for i in range(repeats + 1):  # the first round is the warm-up
        order = list(roots) if i % 2 == 0 else list(roots)[::-1]
        loads.append(os.getloadavg()[0])
        for k in order:
            shutil.rmtree(out, ignore_errors=True)
            timing = _run([sys.executable, "-m", "packcli", *argv], envs[k], cwd=roots[k])
            if i:
                runs[k].append(timing)
    print(f"load      {min(loads):.2f}-{max(loads):.2f} (1-min average during the runs)")
    for k, root in roots.items():
        print(f"{k:<9} {root}: {_summary(runs[k])}; {repeats} runs")
    ratio = statistics.median(r[0] for r in runs["this"]) / statistics.median(
        r[0] for r in runs["other"]
    )
    print(f"this / other by wall median: {ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, help="jsonl to pack (default: --docs of the sample)")
    ap.add_argument("--docs", type=int, default=100, help="documents taken from the sample")
    ap.add_argument("--tokenizer", default=str(ROOT / "packcli/assets/demo_tokenizer.json"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-phases", action="store_true", help="skip the per-phase run")
    ap.add_argument("--against", type=Path, help="another checkout: an interleaved A/B")
    ap.add_argument("--jit", action="store_true", help="time plans as Python vs compiled")
    ap.add_argument("--jit-sizes", type=int, nargs="+", default=[1000, 3000, 10000, 30000])
    ap.add_argument("pack_args", nargs="*", help="extra `packcli pack` arguments (after --)")
    args = ap.parse_args()
    if args.jit:
        jit_threshold(args.jit_sizes, args.repeats)
        return

    tmp = Path(tempfile.mkdtemp(prefix="packcli-fixed-"))
    try:
        inp = _input(args, tmp).resolve()  # absolute: --against runs in the other checkout
        tok = Path(args.tokenizer)
        tokenizer = str(tok.resolve()) if tok.exists() else args.tokenizer  # else a repo id
        env = _child_env(tmp / "cache")
        out = tmp / "out"
        argv = ["pack", str(inp), "-t", tokenizer, "-o", str(out), "-q", *args.pack_args]
        if args.against is not None:
            print(f"input     {inp} ({inp.stat().st_size:,} bytes)")
            against(args.against, argv, out, tmp, args.repeats)
            return
        runs = []
        for i in range(args.repeats + 1):  # the first is the warm-up
            shutil.rmtree(out, ignore_errors=True)
            wall, cpu = _run([sys.executable, "-m", "packcli", *argv], env)
            if i:
                runs.append((wall, cpu))
        print(f"input     {inp} ({inp.stat().st_size:,} bytes)")
        print(f"python    {sys.executable}")
        print(f"load      {os.getloadavg()[0]:.2f} (1-min average, other jobs included)")
        print(f"pack      {_summary(runs)}; {args.repeats} runs after a warm-up")
        if args.no_phases:
            return
        shutil.rmtree(out, ignore_errors=True)
        result = tmp / "phases.json"
        code = HARNESS.format(heavy=HEAVY, phases=PHASES, argv=argv, result=str(result))
        wall, cpu = _run([sys.executable, "-c", code], env)
        data = json.loads(result.read_text())
        print(f"\nphases of one more run (wall {wall:.3f} s, CPU {cpu:.3f} s):")
        print(f"{'phase':<40}{'wall s':>8}{'CPU s':>8}  imported")
        accounted_w = accounted_c = 0.0
        for name, w, c, mods in data["phases"]:
            if name == "run_pack total":
                continue
            accounted_w += w
            accounted_c += c
            print(f"{name:<40}{w:>8.3f}{c:>8.3f}  {', '.join(mods)}")
        pw, pc = data["phases"][-1][1], data["phases"][-1][2]
        rest_w = pw - sum(w for n, w, _, _ in data["phases"] if n not in ("run_pack total",))
        rest_w += sum(w for n, w, _, _ in data["phases"] if n.startswith("import "))
        rest_c = pc - sum(c for n, _, c, _ in data["phases"] if n not in ("run_pack total",))
        rest_c += sum(c for n, _, c, _ in data["phases"] if n.startswith("import "))
        print(f"{'CLI + other (not in a phase)':<40}{rest_w:>8.3f}{rest_c:>8.3f}")
        print(
            f"{'python start-up and exit':<40}{wall - data['harness_wall']:>8.3f}"
            f"{cpu - data['harness_cpu']:>8.3f}"
        )
        if data["missing"]:
            print(f"(no such pipeline function, not timed: {', '.join(data['missing'])})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
