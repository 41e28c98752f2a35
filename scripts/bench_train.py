"""Training throughput on CPU: padded batches versus packcli rows, measured in the same run.

A small Llama (hidden 256, 4 layers, vocab of the bundled demo tokenizer) takes the same few
optimizer steps (AdamW) over the same documents, fed four ways:

* ``padded``: documents batched in a seeded random order, each batch padded to its longest
  document with a 2D ``attention_mask`` (the usual ``DataCollatorWithPadding`` recipe);
* ``position_ids`` / ``mask4d`` / ``flash``: the rows ``packcli pack`` wrote for those
  documents, collated by ``packcli.collate.PackedCollator``. ``flash`` is the flattened
  ``[1, total]`` layout; without flash-attn (CPU) the model runs it on sdpa through the
  restarting ``position_ids``, which costs attention over the whole flattened batch.

Both sides take the same number of optimizer steps over the same real tokens (the documents
are read back from the packed rows, so they are identical token for token). Printed per
arm: the median over ``--repeats`` of real (non-pad) tokens per second, the pad fraction
(pad tokens / tokens computed), the speed-up over ``padded`` and the spread of the repeats
((max - min) / median time). The arms run interleaved, so a slowdown of the machine hits all.

The corpus is generated here (the synthetic language of ``make_sample_corpus.py``, lengths
lognormal like chat/SFT data, capped at the row capacity so every document is in the short
config) and packed with the real CLI and ``packcli/assets/demo_tokenizer.json``.

Example::

    .venv/bin/python scripts/bench_train.py --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "packcli" / "assets" / "demo_tokenizer.json"
TOKENS_PER_WORD = 1.6  # demo tokenizer on the synthetic language (make_sample_corpus.py)


def write_corpus(path: Path, n_docs: int, capacity: int, median_words: int, seed: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_sample_corpus import build_language, render_batch

    rng = np.random.default_rng(seed)
    cap = int(capacity / TOKENS_PER_WORD * 0.85)  # stay under the capacity after tokenizing
    words = np.clip(rng.lognormal(np.log(median_words), 0.9, n_docs).astype(int), 1, cap)
    texts = render_batch(rng, build_language(), words.tolist())
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"text": text, "id": i}, ensure_ascii=False) + "\n")


def pack(corpus: Path, out: Path, capacity: int) -> None:
    exe = Path(sys.executable).with_name("packcli")
    cmd = (
        [str(exe)]
        if exe.exists()
        else [sys.executable, "-c", "from packcli.cli import main; main()"]
    )
    cmd += ["pack", str(corpus), "-t", str(TOKENIZER), "-o", str(out), "-q"]
    cmd += ["--short-len", str(capacity), "--long-len", str(4 * capacity)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def documents_of(rows: list[dict[str, Any]]) -> list[list[int]]:
    docs = []
    for row in rows:
        cu = np.cumsum([0, *row["seq_lengths"]])
        docs += [row["input_ids"][a:b] for a, b in itertools.pairwise(cu)]
    return docs


def pad_batch(docs: list[list[int]], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(d) for d in docs)
    ids = torch.full((len(docs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(docs), width), dtype=torch.long)
    for i, doc in enumerate(docs):
        ids[i, : len(doc)] = torch.tensor(doc)
        mask[i, : len(doc)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def run_arm(
    model: Any, batches: list[Any], collate: Callable[[Any], dict[str, Any]], lr: float
) -> float:
    """Seconds for one optimizer step per batch (collation included), from a fixed start."""
    import torch

    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    start = time.perf_counter()
    for batch in batches:
        loss = model(**collate(batch), use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=512, help="row capacity (--short-len)")
    parser.add_argument("--rows-per-step", type=int, default=4, help="packed rows per step")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per arm")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    parser.add_argument("--median-words", type=int, default=60, help="document length median")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import datasets
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from packcli.collate import PackedCollator

    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    pad_id = tokenizer.token_to_id("<|pad|>")
    n_rows = args.rows_per_step * args.steps

    with tempfile.TemporaryDirectory(prefix="packcli-bench-train-") as tmp:
        corpus, out = Path(tmp) / "corpus.jsonl", Path(tmp) / "out"
        # Enough documents for n_rows full rows, at ~median * 1.5 tokens on average.
        n_docs = int(n_rows * args.capacity / (args.median_words * TOKENS_PER_WORD * 1.5)) * 2
        write_corpus(corpus, n_docs, args.capacity, args.median_words, args.seed)
        t0 = time.perf_counter()
        pack(corpus, out, args.capacity)
        pack_s = time.perf_counter() - t0
        table = datasets.load_dataset(str(out), "short", split="train")
        rows = [table[i] for i in range(min(n_rows, table.num_rows))]
    if len(rows) < n_rows:
        raise SystemExit(f"only {len(rows)} rows packed, {n_rows} needed: raise the corpus size")

    docs = documents_of(rows)
    random.Random(args.seed).shuffle(docs)
    real = sum(len(d) for d in docs)
    per_step = -(-len(docs) // args.steps)
    doc_batches = [docs[i : i + per_step] for i in range(0, len(docs), per_step)]
    row_batches = [rows[i : i + args.rows_per_step] for i in range(0, n_rows, args.rows_per_step)]
    assert len(doc_batches) == len(row_batches) == args.steps

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.capacity,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.set_attn_implementation(args.attn)
    params = sum(p.numel() for p in model.parameters())

    def padded_collate(batch: list[list[int]]) -> dict[str, Any]:
        return pad_batch(batch, pad_id)

    arms: dict[str, tuple[list[Any], Callable[[Any], dict[str, Any]]]] = {
        "padded": (doc_batches, padded_collate)
    }
    for mode in ("position_ids", "mask4d", "flash"):
        arms[mode] = (row_batches, PackedCollator(mode=mode, pad_token_id=pad_id))  # type: ignore[arg-type]

    computed: dict[str, int] = {}
    for name, (batches, collate) in arms.items():
        collated = [collate(b) for b in batches]
        computed[name] = sum(int(c["input_ids"].numel()) for c in collated)
        assert sum(int((c["labels"] != -100).sum()) for c in collated) <= real

    times: dict[str, list[float]] = {name: [] for name in arms}
    run_arm(model, doc_batches[:1], padded_collate, 1e-3)  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        for name, (batches, collate) in arms.items():  # interleaved: drift hits every arm
            times[name].append(run_arm(model, batches, collate, 1e-3))

    print(
        f"model: Llama hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f}M params, "
        f"{args.attn}, float32, {args.threads} torch thread(s)"
    )
    print(
        f"data: {len(docs)} documents, {real:,} real tokens, {args.steps} AdamW steps per arm; "
        f"packed into {n_rows} rows of <= {args.capacity} ({args.rows_per_step} per step) "
        f"by packcli pack in {pack_s:.1f}s"
    )
    print(f"median of {args.repeats} repeats\n")
    print(
        f"{'arm':<14}{'real tok/s':>12}{'pad fraction':>14}{'speed-up':>10}"
        f"{'seconds':>10}{'spread':>8}"
    )
    base = real / statistics.median(times["padded"])
    for name in arms:
        seconds = statistics.median(times[name])
        rate = real / seconds
        pad = 1 - real / computed[name]
        spread = (max(times[name]) - min(times[name])) / seconds
        print(
            f"{name:<14}{rate:>12,.0f}{pad:>14.1%}{rate / base:>9.2f}x{seconds:>10.2f}"
            f"{spread:>8.0%}"
        )


if __name__ == "__main__":
    main()
