"""End-to-end throughput against the tokenizers' own limits, measured in the same run.

Tokenization is the cost of ``packcli pack``; everything else (reading, decompressing,
planning, writing) should hide behind it. On the same texts and cores this measures:

(a) the raw throughput of HF ``encode_batch_fast`` over the texts already in memory, in
    batches of the size packcli uses, and (a') the same for every fast backend installed
    (``fastokens``, ``gigatoken``; packcli/tokenize/backends.py), flat outputs;
(n) the naive script of issue 24 (``naive_script``: orjson per line, fastokens
    ``encode_batch_flat`` in batches of 4,096, numpy concatenation with EOS, one tier cut into
    128k rows with segment ids, one zstd Parquet file without dictionary), the floor packcli
    is held to (``packcli / naive`` at most 1);
(b) ``packcli pack --tokenizer-backend hf`` and (c) ``packcli pack`` with defaults (auto: the
    fastest backend that passes the self-check), end to end, fresh output folder;
(f) the fixed cost: ``packcli pack`` of the corpus's first 100 documents, the whole CLI
    process timed from outside (``--fixed-repeats`` runs after one untimed);

each in a fresh interpreter (timed around the work, not the interpreter's start), and prints
MB/s, tokens/s, ratios against (a) and against the fastest (a') by wall time, the CPU
seconds each used (all threads), the peak RSS of each pack, and the stages' breakdown (busy
seconds of reading, the tokenizer calls, assembling, writing, and the time the pipeline sat
waiting for the tokenizer). Repeats are interleaved and medians reported.

Use a real-text-like corpus (``scripts/make_real_corpus.py``: many ~100-character documents
and a few huge ones) and a 128k vocabulary (``scripts/train_bench_tokenizer.py``); without
``--corpus`` a generated corpus is made (``scripts/make_sample_corpus.py``), which hides
per-document costs. With ``--memory`` it also runs the tokenize stage alone on two corpus
sizes 10x apart and prints the peak RSS of each. ``--check-ids`` only compares every
document's ids from each installed fast backend with HF's.

``--chat`` measures chat data the same way: the corpus holds dialogues (``--chat-from
TEXT.jsonl`` makes ``--size-mb`` of them from real text drawn at random: 1-4 turns, an
optional system message, user turns cut to 800 characters), the tokenizer gets ChatML's
two special tokens, (a)/(a') encode the rendered dialogues (rendered beforehand, untimed:
what the tokenizer gets), and (b)/(c) run ``packcli pack --format chat``.

    python scripts/bench_pipeline.py --chat-from /tmp/real150.jsonl --size-mb 100 \
        --tokenizer /tmp/tok128k --repeats 1

    python scripts/make_real_corpus.py --out /tmp/real150.jsonl --size-mb 150
    python scripts/train_bench_tokenizer.py --corpus /tmp/real150.jsonl --out /tmp/tok128k
    python scripts/bench_pipeline.py --corpus /tmp/real150.jsonl --tokenizer /tmp/tok128k \
        --repeats 3
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_sample_corpus import main as make_corpus_main  # noqa: E402

from packcli.config import TokenizeConfig, build_config  # noqa: E402
from packcli.stages.run import RunResult, run_pack  # noqa: E402
from packcli.tokenize.backends import _MAKERS, HFEncoder  # noqa: E402
from packcli.tokenize.tokenizer import load_tokenizer  # noqa: E402

DEFAULT_TOKENIZER = ROOT / "packcli" / "assets" / "demo_tokenizer.json"


CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>"]


def make_chat_corpus(text_corpus: Path, path: Path, size_mb: int, seed: int) -> None:
    """Dialogues made of real text, so per-dialogue costs and text shapes are real."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    limit = size_mb * 1_000_000
    written = 0
    with text_corpus.open("rb") as src:
        pool = [t for t in (orjson.loads(line)["text"] for line in src) if 0 < len(t) < 8000]
    with path.open("wb") as out:
        while written < limit:  # texts drawn at random: a corpus of any size
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": pool[rng.integers(len(pool))][:300]})
            for _ in range(int(rng.choice([1, 1, 2, 2, 3, 4]))):
                msgs.append({"role": "user", "content": pool[rng.integers(len(pool))][:800]})
                msgs.append({"role": "assistant", "content": pool[rng.integers(len(pool))]})
            line = orjson.dumps({"messages": msgs}) + b"\n"
            out.write(line)
            written += len(line)


def chat_tokenizer(tokenizer: Path, work: Path) -> Path:
    """``tokenizer`` with ChatML's turn markers as special tokens, as chat models have."""
    from tokenizers import Tokenizer

    folder = work / "chat-tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    source = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    tok = Tokenizer.from_file(str(source))
    tok.add_special_tokens(CHAT_SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def rendered_dialogues(path: Path, tokenizer: Path, template: str) -> list[str]:
    """The texts packcli's chat path tokenizes (rendered in its sandbox)."""
    from packcli.chat import load_chat_template, render_dialogues
    from packcli.chat.encoder import RENDER_DATE

    tok = load_tokenizer(str(tokenizer)).tokenizer
    dialogues = [orjson.loads(line)["messages"] for line in path.open("rb") if line.strip()]
    chat = load_chat_template(str(tokenizer), template)
    return [r.text for _, r in render_dialogues(tok, chat, dialogues, {}, now=RENDER_DATE)]


def make_corpus(path: Path, size_mb: int, seed: int) -> None:
    if path.exists():
        return
    argv = sys.argv
    sys.argv = ["make_sample_corpus", "--out", str(path), "--size-mb", str(size_mb)]
    sys.argv += ["--seed", str(seed)]
    try:
        make_corpus_main()
    finally:
        sys.argv = argv


def raw_tokenizer(
    path: Path, tokenizer: Path, batch_size: int, backend: str, chat: str | None = None
) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, bytes and tokens of the backend's batched call over texts
    held in memory: HF ``encode_batch_fast`` or a fast backend, from the same file, with
    packcli's default settings (special-token strings as text; for chat, the rendered
    dialogues with the template's markers as special tokens)."""
    if chat is not None:
        texts = rendered_dialogues(path, tokenizer, chat)
    else:
        texts = [orjson.loads(line)["text"] for line in path.open("rb") if line.strip()]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    tok = load_tokenizer(str(tokenizer)).tokenizer
    tok.encode_special_tokens = chat is None
    encode = HFEncoder(tok) if backend == "hf" else _MAKERS[backend](tok)
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    for i in range(0, len(texts), batch_size):
        tokens += int(encode(texts[i : i + batch_size])[1][-1])
    return time.perf_counter() - t0, time.process_time() - c0, nbytes, tokens


def packcli_pack(
    path: Path, tokenizer: Path, out: Path, backend: str, chat: str | None = None
) -> tuple[float, float, RunResult]:
    if out.exists():
        shutil.rmtree(out)
    overrides: dict = {
        "run": {"out": str(out)},
        "read": {"inputs": (str(path),)},
        "tokenize": {"tokenizer": str(tokenizer), "backend": backend},
    }
    if chat is not None:
        overrides["chat"] = {"format": "chat", "chat_template": chat}
    cfg = build_config(overrides=overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_pack(cfg, quiet=True)
    return time.perf_counter() - t0, time.process_time() - c0, result


# The naive arm (issue 24): what a user writes in ~60 lines to get a packed Parquet file.
NAIVE_BATCH = 4096
NAIVE_ROW = 131072
NAIVE_EOS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")


def naive_script(path: Path, tokenizer: Path, out: Path) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, bytes and tokens of the pipeline issue 24 measures packcli
    against: orjson per line, fastokens ``encode_batch_flat`` in batches of 4,096, one numpy
    concatenation with EOS, one tier cut into 128k rows with segment ids, one Parquet file
    (zstd at packcli's default level, no dictionary). No checks, no plan, no resume: the
    floor of what the same tokenizer and cores allow, timed from loading the tokenizer."""
    import fastokens
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0, c0 = time.perf_counter(), time.process_time()
    source = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    tok = fastokens.Tokenizer.from_file(str(source))
    tok.no_truncation()
    tok.no_padding()
    eos = next(i for t in NAIVE_EOS if (i := tok.token_to_id(t)) is not None)
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    nbytes = 0

    def encode(texts: list[str]) -> None:
        ids, offsets = tok.encode_batch_flat(
            texts, add_special_tokens=False, split_special_tokens=True
        )
        ends = np.frombuffer(offsets, np.uint64).astype(np.int64)[1:]
        parts.append(np.insert(np.frombuffer(ids, np.uint32).astype(np.int32), ends, eos))
        lengths.append(np.diff(ends, prepend=0) + 1)

    batch: list[str] = []
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            text = orjson.loads(line)["text"]
            nbytes += len(text.encode("utf-8"))
            batch.append(text)
            if len(batch) == NAIVE_BATCH:
                encode(batch)
                batch = []
    if batch:
        encode(batch)
    ids = np.concatenate(parts)
    doc_len = np.concatenate(lengths)
    segment = np.repeat(np.arange(doc_len.size, dtype=np.int32), doc_len)
    starts = np.arange(0, ids.size, NAIVE_ROW)
    row_len = np.diff(np.append(starts, ids.size))
    segment -= np.repeat(segment[starts], row_len)  # numbered from 0 in each row
    offsets = pa.array(np.append(starts, ids.size).astype(np.int32))
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids)),
            "segment_ids": pa.ListArray.from_arrays(offsets, pa.array(segment)),
        }
    )
    pq.write_table(table, out, compression="zstd", compression_level=3, use_dictionary=False)
    return time.perf_counter() - t0, time.process_time() - c0, nbytes, int(ids.size)


def tokenize_peak_rss_mb(path: Path, tokenizer: Path, out: Path, shard_tokens: int) -> float:
    """Peak RSS of ``packcli tokenize`` alone, in a fresh subprocess.

    Read from ``VmHWM`` (the peak of the child's own address space): ``ru_maxrss`` would
    report this benchmark's RSS at the fork, which Linux carries over ``exec``.
    """
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = out.parent / f"{out.name}-config.yaml"
    config.write_text(f"tokenize:\n  shard_tokens: {shard_tokens}\n")
    code = (
        "import resource, sys\n"
        "from packcli.cli import app\n"
        "try:\n"
        f"    app(['tokenize', {str(path)!r}, '-t', {str(tokenizer)!r}, '-o', {str(out)!r},"
        f" '-c', {str(config)!r}, '-q'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "print(int(hwm[0].split()[1]) if hwm else "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(res.stdout.strip().splitlines()[-1]) / 1024


def throughput(args: argparse.Namespace, corpus: Path, work: Path) -> None:
    """(a), (a'), (b), (c): interleaved repeats, medians, and the stage breakdowns."""
    rows: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    rss: dict[str, list[float]] = {}
    packs = ["auto"] + ["hf"] * (not args.no_pack_hf)
    stages: dict[str, list[dict]] = {p: [] for p in packs}
    busy: dict[str, list[dict]] = {p: [] for p in packs}
    chosen = ""
    fast = [b for b in _MAKERS if importlib.util.find_spec(b) is not None]
    naive = ["naive"] * (not args.chat and "fastokens" in fast)
    arms = ["raw hf", *(f"raw {b}" for b in fast), *naive, *(f"pack {p}" for p in packs)]
    nbytes = tokens = 0
    # Untimed: compiles the kernels into numba's cache after an edit, warms the page cache.
    in_fresh_process(args, f"pack {packs[0]}", corpus, work)
    for _ in range(args.repeats):
        for arm in arms:
            got = in_fresh_process(args, arm, corpus, work)
            rows.setdefault(arm, []).append(got["wall"])
            cpu.setdefault(arm, []).append(got["cpu"])
            if arm.startswith("raw"):
                nbytes = got["bytes"]
            elif arm == "naive":
                rss.setdefault(arm, []).append(got["peak_rss_mb"])
            else:
                backend = arm.removeprefix("pack ")
                stages[backend].append(got["timings"])
                busy[backend].append(got["tokenize_times"])
                rss.setdefault(arm, []).append(got["peak_rss_mb"])
                tokens = got["tokens"]
                chosen = got["backend"] if backend == "auto" else chosen
    med = {k: statistics.median(v) for k, v in rows.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    best = min((f"raw {b}" for b in fast), key=med.__getitem__, default="raw hf")
    labels = {
        "raw hf": "(a) HF encode_batch_fast, in memory",
        **{f"raw {b}": f"(a') {b}, in memory" for b in fast},
        "naive": "(n) naive script: fastokens -> 1 tier",
        "pack hf": "(b) packcli pack --tokenizer-backend hf",
        "pack auto": f"(c) packcli pack (auto: {chosen})",
    }
    print(f"corpus {corpus.name}: {nbytes / 1e6:.1f} MB of text, {tokens:,} tokens (with EOS)")
    print(
        f"tokenizer {args.tokenizer.name}, {os.cpu_count()} cores, medians of {args.repeats}, "
        f"load average at the end {os.getloadavg()[0]:.2f} (1 min) {os.getloadavg()[1]:.2f} (5 min)"
    )
    head = f"{'what':<42}{'wall s':>8}{'MB/s':>7}{'Mtok/s':>7}{'x (a)':>8}{'x best':>8}"
    print(head + f"{'CPU s':>8}{'CPU x':>8}{'RSS MB':>8}")
    print(f"{'':<42}{'':>8}{'':>7}{'':>7}{'HF':>8}{'(a)':>8}{'':>8}{'(a)':>8}")
    for key in arms:
        t = med[key]
        peak = f"{statistics.median(rss[key]):>8.0f}" if key in rss else ""
        print(
            f"{labels[key]:<42}{t:>8.2f}{nbytes / t / 1e6:>7.1f}{tokens / t / 1e6:>7.2f}"
            f"{med['raw hf'] / t:>8.2f}{med[best] / t:>8.2f}"
            f"{med_cpu[key]:>8.1f}{med_cpu['raw hf'] / med_cpu[key]:>8.2f}{peak}"
        )
    if naive:
        print(
            "packcli / naive by wall: "
            + ", ".join(f"pack {p} {med[f'pack {p}'] / med['naive']:.2f}" for p in packs)
            + " (at most 1.00 is issue 24's goal)"
        )
    for backend in packs:
        stage = {k: statistics.median(s[k] for s in stages[backend]) for k in stages[backend][0]}
        parts = {k: statistics.median(b[k] for b in busy[backend]) for k in busy[backend][0]}
        print(
            f"stages of pack {backend}: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in stage.items())
            + "; inside tokenize, busy: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in parts.items())
        )
    if args.fixed_repeats and not args.chat:
        med["fixed pack"] = fixed_cost(args, corpus, work)
    print(json.dumps({k: round(v, 3) for k, v in med.items()}))


FIXED_DOCS = 100


def fixed_cost(args: argparse.Namespace, corpus: Path, work: Path) -> float:
    """(f) The fixed cost: ``packcli pack`` of the corpus's first 100 documents, the whole CLI
    process timed from outside (interpreter start, imports, tokenizer load, card, hashes,
    finalize), as a user runs it. One untimed run first, so every timed one finds warm
    caches: the page cache, and the bytecode an installed package has (this run writes it
    even where PYTHONDONTWRITEBYTECODE is set). Prints and returns the median wall."""
    small = work / f"first-{FIXED_DOCS}.jsonl"
    with corpus.open("rb") as src, small.open("wb") as dst:
        dst.writelines(itertools.islice((ln for ln in src if ln.strip()), FIXED_DOCS))
    out = work / "out-fixed"
    cmd = [sys.executable, "-m", "packcli", "pack", str(small), "-t", str(args.tokenizer)]
    cmd += ["-o", str(out), "-q"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    walls = []
    for i in range(args.fixed_repeats + 1):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        if i:
            walls.append(time.perf_counter() - t0)
    median = statistics.median(walls)
    print(
        f"(f) packcli pack of {FIXED_DOCS} documents, whole process: median {median:.2f} s "
        f"of {len(walls)} (min {min(walls):.2f}, max {max(walls):.2f}; issue 24: at most 1.0 s)"
    )
    return median


def in_fresh_process(args: argparse.Namespace, arm: str, corpus: Path, work: Path) -> dict:
    """One measurement in its own interpreter, as users run ``packcli pack``: after other
    arms in the same process, HF tokenizing ran up to 30% slower (heap and thread state)."""
    cmd = [sys.executable, __file__, "--child", arm, "--child-corpus", str(corpus)]
    cmd += ["--tokenizer", str(args.tokenizer), "--batch-size", str(args.batch_size)]
    cmd += ["--workdir", str(work)]
    if args.chat:
        cmd += ["--chat", "--chat-template", args.chat_template]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{arm} failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def child(args: argparse.Namespace) -> None:
    # numba's import and cache loads count, as a user pays them (``throughput`` ran one
    # untimed pack first, so an edit's compiles are in numba's cache, not in the timings).
    corpus = Path(args.child_corpus)
    if args.child.startswith("raw "):
        backend = args.child.removeprefix("raw ")
        batch = args.batch_size
        chat = args.chat_template if args.chat else None
        wall, cpu_s, nbytes, tokens = raw_tokenizer(corpus, args.tokenizer, batch, backend, chat)
        print(json.dumps({"wall": wall, "cpu": cpu_s, "bytes": nbytes, "tokens": tokens}))
        return
    if args.child == "naive":
        wall, cpu_s, nbytes, tokens = naive_script(
            corpus, args.tokenizer, args.workdir / "naive.parquet"
        )
        got = {"wall": wall, "cpu": cpu_s, "bytes": nbytes, "tokens": tokens}
        print(json.dumps({**got, "peak_rss_mb": peak_rss_mb()}))
        return
    backend = args.child.removeprefix("pack ")
    chat = args.chat_template if args.chat else None
    out = args.workdir / "out"
    wall, cpu_s, result = packcli_pack(corpus, args.tokenizer, out, backend, chat)
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu_s,
                "timings": result.timings,
                "tokenize_times": result.tokenize_times,
                "tokens": result.report["input"]["tokens"],
                "peak_rss_mb": peak_rss_mb(),
                "backend": json.loads((args.workdir / "out" / "packcli.json").read_text())["run"][
                    "tokenizer_backend"
                ]["backend"],
            }
        )
    )


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``), 0 where /proc is missing."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return 0.0
    hwm = [ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM:")]
    return int(hwm[0].split()[1]) / 1024 if hwm else 0.0


def check_ids(corpus: Path, tokenizer: Path, batch_size: int) -> None:
    """Every document's ids from each installed fast backend against HF's, under packcli's
    default settings (the self-check covers a sample per run; this covers the corpus)."""
    texts = [orjson.loads(line)["text"] for line in corpus.open("rb") if line.strip()]
    tok = load_tokenizer(str(tokenizer)).tokenizer
    tok.encode_special_tokens = True
    hf = HFEncoder(tok)
    backends = {b: _MAKERS[b](tok) for b in _MAKERS if importlib.util.find_spec(b) is not None}
    same = dict.fromkeys(backends, 0)
    first: dict[str, str] = {}
    for i in range(0, len(texts), batch_size):
        chunk = texts[i : i + batch_size]
        want_ids, want_off = hf(chunk)
        for name, encode in backends.items():
            got_ids, got_off = encode(chunk)
            for k in range(len(chunk)):
                g = got_ids[got_off[k] : got_off[k + 1]].astype(np.int64)
                w = want_ids[want_off[k] : want_off[k + 1]].astype(np.int64)
                if np.array_equal(g, w):
                    same[name] += 1
                elif name not in first:
                    at = int(np.argmax(g[: min(g.size, w.size)] != w[: min(g.size, w.size)]))
                    first[name] = f"document {i + k} ({len(chunk[k]):,} chars), token {at}"
    for name, n in same.items():
        where = f"; first difference: {first[name]}" if name in first else ""
        print(f"ids identical to HF: {name} {n:,} / {len(texts):,} documents{where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-corpus", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, default=None, help="an existing jsonl corpus")
    ap.add_argument("--size-mb", type=int, default=300, help="generated corpus size")
    ap.add_argument("--no-pack-hf", action="store_true", help="skip (b), the slowest arm")
    ap.add_argument(
        "--check-ids", action="store_true", help="only compare every document's ids with HF's"
    )
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--fixed-repeats",
        type=int,
        default=5,
        help=f"timed runs of (f), packcli pack of {FIXED_DOCS} documents (0: skip)",
    )
    ap.add_argument("--memory", action="store_true", help="also measure peak RSS at 2 sizes")
    ap.add_argument(
        "--memory-shard-tokens",
        type=int,
        default=1 << 21,
        help="also measure peak RSS with shards this small (0: only the default size)",
    )
    ap.add_argument("--memory-only", action="store_true", help="skip the throughput runs")
    ap.add_argument("--chat", action="store_true", help="the corpus holds dialogues")
    ap.add_argument("--chat-from", type=Path, default=None, help="make dialogues of this text")
    ap.add_argument("--chat-template", default="chatml")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=20240917)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="packcli-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or work / f"corpus-{args.size_mb}mb.jsonl"
    if args.chat_from is not None:
        args.chat = True
        corpus = args.corpus or work / f"chat-{args.size_mb}mb.jsonl"
        make_chat_corpus(args.chat_from, corpus, args.size_mb, args.seed)
    elif args.corpus is None:
        make_corpus(corpus, args.size_mb, args.seed)
    if args.chat:
        args.tokenizer = chat_tokenizer(args.tokenizer, work)

    if args.check_ids:
        check_ids(corpus, args.tokenizer, args.batch_size)
        return
    if not args.memory_only:
        throughput(args, corpus, work)
    if args.memory:
        small = work / f"corpus-{max(1, args.size_mb // 10)}mb.jsonl"
        make_corpus(small, max(1, args.size_mb // 10), args.seed)
        sizes = [TokenizeConfig().shard_tokens] + [args.memory_shard_tokens] * bool(
            args.memory_shard_tokens
        )
        for shard_tokens in sizes:
            for path in (small, corpus):
                rss = tokenize_peak_rss_mb(path, args.tokenizer, work / "out-mem", shard_tokens)
                print(
                    f"tokenize peak RSS on {path.name}, shard_tokens {shard_tokens:,}: {rss:.0f} MB"
                )
    print(f"(workdir {work})")


if __name__ == "__main__":
    main()
