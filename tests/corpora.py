"""Generated test corpora (imported by tests and conftest)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "were",
    "which",
    "this",
    "packing",
    "token",
    "segment",
    "document",
    "attention",
    "row",
    "shard",
    "tier",
    "long",
    "short",
    "écrit",
    "naïve",
    "東京",
    "🙂",
]


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))


def write_corpus(path: Path, word_counts: list[int], seed: int = 0, field: str = "text") -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i, n in enumerate(word_counts):
            fh.write(json.dumps({field: random_text(rng, n), "id": i}, ensure_ascii=False) + "\n")


def mixed_lengths(n: int, seed: int = 0) -> list[int]:
    """A heavy-tailed mix in words: mostly short, some long, a few over the long tier."""
    rng = random.Random(seed)
    counts = []
    for i in range(n):
        if i % 97 == 5:
            counts.append(rng.randint(1500, 2500))  # over long_len=1024 tokens in e2e tests
        elif i % 13 == 3:
            counts.append(rng.randint(70, 600))  # long tier
        else:
            counts.append(int(rng.lognormvariate(2.5, 0.9)) + 1)
    return counts


def mixed_corpus(path: Path, n: int, seed: int) -> Path:
    """``path``: ``n`` documents of ``mixed_lengths``, their words drawn with the same seed
    (so each seed is one corpus, whichever test writes it)."""
    write_corpus(path, mixed_lengths(n, seed=seed), seed=seed)
    return path


def pack_inputs(root: Path, n: int, seed: int, config: str) -> tuple[Path, Path]:
    """``root/corpus.jsonl`` (``mixed_corpus``) and ``root/cfg.yaml`` holding ``config``:
    what a ``pack`` run as a process (``clirun.run_pack``) is given."""
    corpus = mixed_corpus(root / "corpus.jsonl", n, seed)
    cfg = root / "cfg.yaml"
    cfg.write_text(config)
    return corpus, cfg


CHAT_WORDS = ["the", "of", "answer", "question", "tool", "packing", "token", "東京", "🙂", "naïve"]
CHAT_WORDS += ["weather", "is", "sunny"]
IM_END = "<|im_end|>"


def hub_cache(cache: Path, kind: str, repo: str, files: dict[str, bytes]) -> str:
    """A Hugging Face cache holding one snapshot of repo ``repo`` (``kind``: ``datasets`` or
    ``models``), laid out as huggingface_hub lays it out (refs/main, snapshots/<commit>/
    links into blobs/): what the Hub code paths read offline in tests."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / f"{kind}--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "blobs").mkdir()
    for rel, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = root / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return commit


def chatml_tokenizer(folder: Path) -> Path:
    """A small byte-level BPE with ChatML's markers as special tokens (and a config naming
    ``<|im_end|>`` as EOS), saved in ``folder``: the chat and preference tests' tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(CHAT_WORDS)] * 50 + ["user\nassistant\nsystem\n"] * 20
    tok.train_from_iterator(corpus, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": IM_END}))
    return folder


def packed_string_pairs(folder: Path, tokenizer: Path, n: int, seed: int) -> Path:
    """A real ``packcli pack --format preference`` output (``folder/out``) of ``n`` pairs of
    strings (TRL's plain form): what the training-side proofs run on."""
    from clirun import invoke_ok

    rng = random.Random(seed)
    corpus = folder / "pairs.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for _ in range(n):
            pair = {
                "prompt": random_text(rng, rng.randint(3, 15)),
                "chosen": " " + random_text(rng, rng.randint(2, 20)),
                "rejected": " " + random_text(rng, rng.randint(2, 20)),
            }
            fh.write(json.dumps(pair) + "\n")
    out = folder / "out"
    invoke_ok(
        "pack", corpus, "-t", tokenizer, "-o", out, "--format", "preference",
        "--short-len", "96", "--long-len", "256", "-q",
    )  # fmt: skip
    return out
