"""Train a Llama-3-shaped tokenizer (128k byte-level BPE) on a jsonl corpus, for benchmarks.

Benchmarks must not download a model's tokenizer, and the bundled 8k demo tokenizer is far
smaller than what users run: a 128k vocabulary changes tokenizer speed (longer merges, bigger
tables) and load time. This trains the same shape as Llama 3's ``tokenizer.json``: its split
regex, then ``ByteLevel(use_regex=False)``, a ByteLevel decoder, ``<|begin_of_text|>`` /
``<|end_of_text|>`` and 256 reserved special tokens after the merged vocabulary, and a
``tokenizer_config.json`` naming BOS/EOS. Training is on the first ``--train-mb`` of the
corpus's text field.

    python scripts/train_bench_tokenizer.py --corpus /tmp/real150.jsonl --out /tmp/tok128k
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"] + [
    f"<|reserved_special_token_{i}|>" for i in range(254)
]


def texts(path: Path, limit: int) -> Iterator[str]:
    seen = 0
    with path.open("rb") as fh:
        for line in fh:
            text = orjson.loads(line).get("text", "")
            yield text
            seen += len(text)
            if seen >= limit:
                return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json")
    ap.add_argument("--vocab-size", type=int, default=128_000)
    ap.add_argument("--train-mb", type=float, default=40)
    args = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts(args.corpus, int(args.train_mb * (1 << 20))), trainer)
    tok.add_special_tokens(SPECIALS)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    )
    print(
        f"{args.out}/tokenizer.json: vocabulary {tok.get_vocab_size():,}, trained in "
        f"{time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
