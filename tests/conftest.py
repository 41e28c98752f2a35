"""Shared fixtures: a toy tokenizer trained in-process and small generated corpora."""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from corpora import random_text, write_corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# The local S3 server and its corpus fixtures (tests/s3local.py), for every module that asks.
pytest_plugins = ["s3local"]

# Before any test imports `datasets`: a private cache (no stale copies between runs) and no
# network, ever.
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="packcli-hf-cache-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# The fast path's spec cache: private to the session, never the user's home.
os.environ["PACKCLI_CACHE_DIR"] = tempfile.mkdtemp(prefix="packcli-cache-")


@pytest.fixture(scope="session")
def toy_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE trained on generated text, saved with a tokenizer_config.json."""
    folder = tmp_path_factory.mktemp("toy_tokenizer")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    tok.train_from_iterator([random_text(rng, 50) for _ in range(300)], trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<|bos|>"})
    )
    return folder / "tokenizer.json"


@pytest.fixture
def make_corpus(tmp_path: Path) -> Callable[..., Path]:
    """Write a jsonl corpus with the given words per document; returns its path."""

    def make(word_counts: list[int], name: str = "corpus.jsonl", seed: int = 0) -> Path:
        path = tmp_path / name
        write_corpus(path, word_counts, seed)
        return path

    return make


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """For the training proofs: matrices this small gain nothing from threads, and on a busy
    2-core machine two OpenMP threads made every matmul ~16 ms instead of ~20 us."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> tuple[Path, Any]:
    """``export_cases.text_pack``: a text pack and its documents, made once per test module
    that asks (the export and torchtitan tests read it)."""
    from export_cases import text_pack  # here, not at the top: after the environment above

    return text_pack(tmp_path_factory.mktemp("text"), toy_tokenizer_path)


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``export_cases.chat_pack``: a chat pack and its dialogues, once per test module."""
    from export_cases import chat_pack

    return chat_pack(tmp_path_factory.mktemp("chat"))
