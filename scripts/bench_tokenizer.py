r"""Benchmark the tiktoken fast path (``packcli/fastpath.py``) against HF ``encode_batch_fast``.

Both backends encode the same documents, in packcli's batches, on the same number of threads;
the script asserts that every document gets identical ids, then prints the median of
``--repeats`` runs as MB/s (UTF-8 bytes) and tokens/s, and the speed-up.

The tokenizer is a byte-level BPE with a Llama-3-style split regex and ByteLevel
(``--tokenizer`` takes any tokenizer.json instead). Without ``--tokenizer`` one is trained
in-process (deterministically) on ``make_sample_corpus.generate_documents`` text plus generated
multilingual text (Latin with accents, Cyrillic, Greek, CJK, Hangul, kana, Arabic, Devanagari,
Thai, emoji, digits, code-like lines): the synthetic language alone has too few distinct words
for 100,000 merges. ``--save`` keeps it so later runs can pass it back with ``--tokenizer``.

Example (the figure quoted in ``packcli/fastpath.py``; training takes ~1.5 min, the whole run
~14 min on a loaded 2-core machine)::

    .venv/bin/python scripts/bench_tokenizer.py --vocab-size 100000 --train-mb 48 \
        --bench-mb 64 --threads 2 --save out/bench/tokenizer-100k.json --json

then, reusing the tokenizer::

    .venv/bin/python scripts/bench_tokenizer.py --tokenizer out/bench/tokenizer-100k.json \
        --bench-mb 16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from make_sample_corpus import MIB, generate_documents

SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
TRAIN_SEED = 11
BENCH_SEED = 22

# Scripts for the generated multilingual text: (alphabet, weight, word length range).
_SCRIPTS: list[tuple[str, float, tuple[int, int]]] = [
    ("abcdefghijklmnopqrstuvwxyz", 4.0, (2, 11)),
    ("abcdefghijklmnopqrstuvwxyzéèêàâçñöüäßøåíóúãõ", 2.0, (2, 11)),
    ("абвгдежзийклмнопрстуфхцчшщъыьэюяё", 1.5, (2, 11)),
    ("αβγδεζηθικλμνξοπρστυφχψωάέήίόύώ", 0.7, (2, 10)),
    ("".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000)), 1.5, (1, 4)),
    ("".join(chr(c) for c in range(0xAC00, 0xAC00 + 2000)), 0.8, (1, 5)),
    ("".join(chr(c) for c in range(0x3041, 0x3097)) + "ー", 0.6, (2, 8)),
    ("ابتثجحخدذرزسشصضطظعغفقكلمنهويىةأإآ", 0.8, (2, 9)),
    ("कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह" + "ािीुूेैोौं्", 0.7, (2, 9)),
    ("กขคงจฉชซญดตถทนบปผพฟภมยรลวศสหอฮะาิีึืุูเแโใไ่้๊๋", 0.4, (2, 9)),
]
_EMOJI = ["\U0001f600", "\U0001f44d\U0001f3fd", "\u2764\ufe0f", "\U0001f468\u200d\U0001f4bb"]
_SEPARATORS = [" "] * 30 + [", ", ". ", ".\n", "\n\n", "; ", ": ", " - ", "? ", "! ", "\t", "\r\n"]


def _lexicon(rng: np.random.Generator, size: int) -> list[str]:
    weights = np.array([w for _, w, _ in _SCRIPTS])
    scripts = rng.choice(len(_SCRIPTS), size=size, p=weights / weights.sum())
    words = []
    for s in scripts.tolist():
        alphabet, _, (lo, hi) = _SCRIPTS[s]
        letters = rng.integers(0, len(alphabet), size=int(rng.integers(lo, hi + 1)))
        word = "".join(alphabet[i] for i in letters.tolist())
        words.append(word.capitalize() if rng.random() < 0.15 else word)
    return words


def multilingual_documents(size_bytes: int, seed: int) -> Iterator[str]:
    """Documents of Zipf-distributed words from a 400k-word multilingual lexicon."""
    rng = np.random.default_rng(seed)
    words = _lexicon(np.random.default_rng(1234), 400_000)  # fixed, like a real language
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    cdf = np.cumsum(1.0 / (ranks + 2.7))
    cdf /= cdf[-1]
    written = 0
    while written < size_bytes:
        n = int(np.clip(rng.lognormal(5.5, 1.0), 10, 20_000))
        picks = np.searchsorted(cdf, rng.random(n)).tolist()
        seps = rng.integers(0, len(_SEPARATORS), size=n).tolist()
        extras = rng.random(n).tolist()
        parts = []
        for w, s, x in zip(picks, seps, extras, strict=True):
            if x < 0.04:
                parts.append(str(int(rng.integers(0, 10 ** int(rng.integers(1, 9))))))
            elif x < 0.05:
                parts.append(_EMOJI[int(rng.integers(0, len(_EMOJI)))])
            elif x < 0.055:
                parts.append(f"    return self.value_{int(rng.integers(99))} + 1  # note")
            else:
                parts.append(words[w])
            parts.append(_SEPARATORS[s])
        text = "".join(parts)
        written += len(text.encode("utf-8"))
        yield text


def corpus(size_bytes: int, seed: int, multilingual_share: float) -> list[str]:
    """``generate_documents`` text and multilingual text, interleaved, ~``size_bytes`` in all."""
    synthetic = [
        d["text"]
        for d in generate_documents(seed, int(size_bytes * (1 - multilingual_share)), huge_docs=0)
    ]
    other = list(multilingual_documents(int(size_bytes * multilingual_share), seed))
    # Deterministic interleave in proportion, so every batch mixes both kinds.
    mixed: list[str] = []
    a, b = synthetic, other
    ia = ib = 0
    while ia < len(a) or ib < len(b):
        if ia < len(a) and (ib >= len(b) or ia * len(b) <= ib * len(a)):
            mixed.append(a[ia])
            ia += 1
        else:
            mixed.append(b[ib])
            ib += 1
    return mixed


def train_tokenizer(vocab_size: int, train_mb: float) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(int(train_mb * MIB), TRAIN_SEED, 0.6), trainer=trainer)
    return tok


def timed(
    encode: Callable[[list[str]], list], texts: list[str], batch: int
) -> tuple[float, float, list]:
    """Wall seconds, CPU seconds of this process (all threads) and the ids."""
    t0, c0 = time.perf_counter(), time.process_time()
    out: list = []
    for i in range(0, len(texts), batch):
        out.extend(encode(texts[i : i + batch]))
    return time.perf_counter() - t0, time.process_time() - c0, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json to use instead of training")
    parser.add_argument("--vocab-size", type=int, default=100_000)
    parser.add_argument("--train-mb", type=float, default=48.0, help="MiB of training text")
    parser.add_argument("--save", type=Path, help="write the trained tokenizer.json here")
    parser.add_argument("--bench-mb", type=float, default=64.0, help="MiB of text to encode")
    parser.add_argument("--multilingual", type=float, default=0.3, help="share of that text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024, help="documents per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ignore-merges",
        action="store_true",
        help="set the BPE's ignore_merges (as Llama-3-style tokenizer.json files do): HF then "
        "looks whole words up before merging, like tiktoken; same ids, faster HF",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)

    # Before the first parallel call: HF's rayon pool reads this once.
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    from packcli.fastpath import choose_encoder
    from packcli.tokenizer import hf_batch_encoder

    t0 = time.perf_counter()
    if args.tokenizer:
        tok = Tokenizer.from_file(str(args.tokenizer))
        source = str(args.tokenizer)
    else:
        tok = train_tokenizer(args.vocab_size, args.train_mb)
        source = f"trained on {args.train_mb:g} MiB in {time.perf_counter() - t0:.0f}s"
        if args.save:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            tok.save(str(args.save))
            source += f", saved to {args.save}"
    if args.ignore_merges:
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
        source += ", ignore_merges=true"
    print(f"tokenizer: vocab {tok.get_vocab_size():,} ({source})")

    texts = corpus(int(args.bench_mb * MIB), BENCH_SEED, args.multilingual)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(
        f"text: {len(texts):,} documents, {n_bytes / 1e6:.1f} MB, "
        f"{args.multilingual:.0%} multilingual"
    )

    t0 = time.perf_counter()
    fast, record = choose_encoder(tok, "tiktoken", texts[:256], args.threads)
    print(f"fast path ready in {time.perf_counter() - t0:.1f}s: {record}")
    hf = hf_batch_encoder(tok)

    times: dict[str, list[float]] = {"hf": [], "tiktoken": []}
    cpu: dict[str, list[float]] = {"hf": [], "tiktoken": []}
    reference: list | None = None
    tokens = 0
    for _ in range(args.repeats):
        for name, encode in (("hf", hf), ("tiktoken", fast)):
            seconds, cpu_seconds, out = timed(encode, texts, args.batch_size)
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
            if reference is None:
                reference = [list(ids) for ids in out]
                tokens = sum(map(len, reference))
            else:
                for i, ids in enumerate(out):
                    if list(ids) != reference[i]:
                        raise SystemExit(f"{name}: ids differ on document {i}: {texts[i][:80]!r}")
    print(f"identical ids on all {len(texts):,} documents ({tokens:,} tokens), every run")

    rows = {}
    # CPU seconds are less sensitive than wall time to other load on a shared machine.
    print(
        f"\n{'backend':<10} {'median s':>9} {'MB/s':>8} {'Mtok/s':>8} {'speed-up':>9} "
        f"{'CPU s':>7} {'MB/CPU-s':>9}"
    )
    base = statistics.median(times["hf"])
    for name, runs in times.items():
        med = statistics.median(runs)
        rows[name] = {
            "median_s": round(med, 3),
            "runs_s": [round(r, 3) for r in runs],
            "mb_per_s": round(n_bytes / med / 1e6, 2),
            "tokens_per_s": round(tokens / med),
            "speedup": round(base / med, 2),
            "cpu_s": round(statistics.median(cpu[name]), 3),
        }
        r = rows[name]
        print(
            f"{name:<10} {med:>9.2f} {r['mb_per_s']:>8.2f} {tokens / med / 1e6:>8.2f} "
            f"{r['speedup']:>8.2f}x {r['cpu_s']:>7.2f} {n_bytes / r['cpu_s'] / 1e6:>9.2f}"
        )
    print(f"\nthreads {args.threads}, batch {args.batch_size}, medians of {args.repeats}")
    if args.json:
        print(json.dumps({"threads": args.threads, "bytes": n_bytes, "tokens": tokens, **rows}))


if __name__ == "__main__":
    main()
