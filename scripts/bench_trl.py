"""TRL SFT step time on CPU: packcli's recipe against TRL's padding-free path, same run.

Both arms are TRL 1.16 ``SFTTrainer`` built on the same ``packcli pack`` rows (1024-token
rows of the demo corpus, demo tokenizer) and a small Llama on sdpa; each times one optimizer
step (forward, backward, AdamW) on the batches TRL's own dataloader yields:

* ``padding_free``: ``SFTConfig(padding_free=True, max_length=None)``, TRL's collator. The
  batch is one flattened row of ``rows x 1024`` tokens; on sdpa transformers reads the
  documents from the restarting ``position_ids`` and builds one ``total x total`` mask.
* ``packed``: ``SFTConfig(padding_free=False, max_length=None, remove_unused_columns=False)``
  with ``data_collator=PackedCollator(mode="position_ids")``: ``rows`` rows of 1024, one
  ``1024 x 1024`` mask each.

Both are exact (``tests/test_trl_configs.py``); the attention work differs by the number of
rows a step. The arms alternate step by step, so a slowdown of the machine hits both; printed
are the median step time per arm over ``--steps`` steps, and the ratio.

Example::

    .venv/bin/python scripts/bench_trl.py --rows 4 --steps 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "packcli" / "assets" / "demo_tokenizer.json"


def pack(out: Path, capacity: int) -> None:
    """Pack a generated corpus (1 MiB of the synthetic language) with the real CLI."""
    corpus = out.parent / "corpus.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_sample_corpus.py"), "--out", str(corpus),
         "--size-mb", "1"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    cmd = [sys.executable, "-c", "from packcli.cli import main; main()", "pack", str(corpus)]
    cmd += ["-t", str(TOKENIZER), "-o", str(out), "--short-len", "128"]
    cmd += ["--long-len", str(capacity), "-q"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4, help="packed rows per step")
    parser.add_argument("--capacity", type=int, default=1024, help="tokens per packed row")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per arm")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import datasets
    import torch
    import trl
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from packcli.collate import PackedCollator, check_sft_config

    torch.set_num_threads(args.threads)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), eos_token="<|endoftext|>", pad_token="<|pad|>"
    )
    with tempfile.TemporaryDirectory(prefix="packcli-bench-trl-") as tmp:
        out = Path(tmp) / "out"
        pack(out, args.capacity)
        rows = datasets.load_dataset(str(out), "long", split="train")
        rows = rows.filter(lambda r: r["num_tokens"] >= 0.98 * args.capacity)
        need = args.rows * (args.steps + 1)
        if len(rows) < need:
            raise SystemExit(f"only {len(rows)} full rows packed, {need} needed")
        rows = rows.select(range(need))

        def model() -> LlamaForCausalLM:
            torch.manual_seed(0)
            config = LlamaConfig(
                vocab_size=len(tokenizer), hidden_size=args.hidden,
                intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=args.rows * args.capacity,
            )  # fmt: skip
            built = LlamaForCausalLM(config).train()
            built.set_attn_implementation("sdpa")
            return built

        common: dict[str, Any] = dict(
            output_dir=str(Path(tmp) / "ckpt"), report_to=[], use_cpu=True, save_strategy="no",
            bf16=False, activation_checkpointing=False, packing=False, max_length=None,
            per_device_train_batch_size=args.rows, max_steps=args.steps + 1,
        )  # fmt: skip
        arms: dict[str, Any] = {}
        for name, extra, collator in (
            ("padding_free", {"padding_free": True}, None),
            (
                "packed",
                {"padding_free": False, "remove_unused_columns": False},
                PackedCollator(mode="position_ids"),
            ),
        ):
            config = trl.SFTConfig(**common, **extra)
            check_sft_config(config, collator, attn_implementation="sdpa")
            trainer = trl.SFTTrainer(
                model=model(), args=config, train_dataset=rows, processing_class=tokenizer,
                data_collator=collator,
            )  # fmt: skip
            optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
            arms[name] = (trainer.model, optimizer, list(trainer.get_train_dataloader()))

        times: dict[str, list[float]] = {name: [] for name in arms}
        for step in range(args.steps + 1):  # step 0 warms up
            for name, (net, optimizer, batches) in arms.items():
                batch = batches[step]
                t0 = time.perf_counter()
                net(**batch, use_cache=False).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step:
                    times[name].append(time.perf_counter() - t0)
        shapes = {n: tuple(a[2][0]["input_ids"].shape) for n, a in arms.items()}

    print(
        f"model: Llama hidden {args.hidden}, {args.layers} layers, sdpa, float32, "
        f"{args.threads} torch thread(s); TRL {trl.__version__}, torch {torch.__version__}"
    )
    print(f"{args.rows} rows of {args.capacity} tokens a step; median of {args.steps} steps\n")
    base = statistics.median(times["packed"])
    print(f"{'arm':<14}{'batch shape':>14}{'step s':>10}{'vs packed':>11}")
    for name, values in times.items():
        median = statistics.median(values)
        shape = "x".join(map(str, shapes[name]))
        print(f"{name:<14}{shape:>14}{median:>10.3f}{median / base:>10.2f}x")


if __name__ == "__main__":
    main()
