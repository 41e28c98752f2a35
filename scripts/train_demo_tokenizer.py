"""Train the small byte-level BPE demo tokenizer shipped as ``packcli/assets/demo_tokenizer.json``.

The tokenizer exists so packcli's tests, docs and demos run offline without downloading a real
model tokenizer. It is trained on text from ``make_sample_corpus.generate_documents`` (same
synthetic language as the demo corpus, different seed, no over-long documents), so its
tokens-per-word ratio on the demo corpus resembles a real tokenizer on real text.

Design: GPT-2/Llama-3-style split regex, then a ByteLevel pre-tokenizer (no prefix space) and a
ByteLevel decoder, so any UTF-8 input round-trips. Special tokens ``<|endoftext|>`` (id 0),
``<|bos|>`` (1) and ``<|pad|>`` (2); there is deliberately no post-processor, so ``encode`` never
adds special tokens on its own (callers decide where BOS/EOS go). Training is deterministic (fixed
generated input; the BPE trainer sums counts and breaks ties by pair ids, independent of thread
count) and the script writes compact JSON, so a rerun gives identical bytes.

Example::

    .venv/bin/python scripts/train_demo_tokenizer.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sample_corpus import MIB, generate_documents

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "packcli" / "assets" / "demo_tokenizer.json"
CONFIG_NAME = "demo_tokenizer_config.json"
DEFAULT_SEED = 1_000_003  # differs from the demo corpus default seed
SPECIAL_TOKENS = ["<|endoftext|>", "<|bos|>", "<|pad|>"]
TOKENIZER_CONFIG = {"bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"}
# Llama-3 split pattern: contractions, letter runs with one optional leading non-letter,
# 1-3 digit groups, punctuation runs, newlines, whitespace.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE with the demo pre-tokenizer and decoder."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train(vocab_size: int, seed: int, train_mb: float) -> Tokenizer:
    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (doc["text"] for doc in generate_documents(seed, int(train_mb * MIB), huge_docs=0))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != i:
            raise RuntimeError(f"{token} did not get id {i}")
    return tokenizer


def serialize(tokenizer: Tokenizer) -> bytes:
    """Compact tokenizer.json, with merges as ``"a b"`` strings so tokenizers 0.19 can load it.

    tokenizers >= 0.20 writes merges as ``[a, b]`` pairs, which older releases reject; every
    release reads the string form, which is unambiguous here because byte-level tokens never
    contain a literal space.
    """
    data = json.loads(tokenizer.to_str(pretty=False))
    merges = data["model"]["merges"]
    if merges and not isinstance(merges[0], str):
        if any(" " in part for pair in merges for part in pair):
            raise RuntimeError("a merge contains a space; cannot use the string form")
        data["model"]["merges"] = [" ".join(pair) for pair in merges]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    reloaded = Tokenizer.from_str(text)
    probe = "Hello wörld, 2024 (test) \u201cquote\u201d 中文 😀\n\nNext paragraph.<|endoftext|>"
    if reloaded.encode(probe).ids != tokenizer.encode(probe).ids:
        raise RuntimeError("re-serialised tokenizer encodes differently")
    return text.encode("utf-8")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="training text seed")
    parser.add_argument("--train-mb", type=float, default=8.0, help="MiB of training text")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="tokenizer.json path")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    tokenizer = train(args.vocab_size, args.seed, args.train_mb)
    elapsed = time.perf_counter() - t0

    data = serialize(tokenizer)
    config_path = args.out.with_name(CONFIG_NAME)
    _write_atomic(args.out, data)
    _write_atomic(config_path, (json.dumps(TOKENIZER_CONFIG, indent=2) + "\n").encode())

    sample = "Hello wörld 😀 中文 2024!\n\nSecond paragraph."
    decoded = tokenizer.decode(tokenizer.encode(sample).ids, skip_special_tokens=False)
    if decoded != sample:
        raise RuntimeError(f"round trip failed: {decoded!r}")
    print(
        f"trained vocab {tokenizer.get_vocab_size()} on {args.train_mb:g} MiB in {elapsed:.1f}s; "
        f"wrote {args.out} ({len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}) "
        f"and {config_path.name}"
    )


if __name__ == "__main__":
    main()
