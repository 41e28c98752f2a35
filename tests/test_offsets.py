"""Character offsets from ids (packcli/chat/offsets.py) equal HF's, and chat on a fast backend
writes the same bytes as chat on HF."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from clirun import invoke, invoke_ok
from test_backends import (
    INSTALLED,
    edited,
    llama3_pre_tokenizer,
    multilingual_texts,
    train,
    wordpiece,
)
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers

from packcli import jit
from packcli.chat.offsets import ADVERSARIAL, ByteOffsets, FastOffsets, check_offsets
from packcli.tokenize.backends import HFEncoder

needs_fastokens = pytest.mark.skipif("fastokens" not in INSTALLED, reason="needs fastokens")

CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>"]


def _with_processor(processor: dict) -> callable:
    return lambda d: d.update(post_processor=processor)


def _whitespace_added_tokens(tok: Tokenizer) -> Tokenizer:
    """Added tokens with whitespace at their edges (code tokenizers add runs of spaces):
    HF's trimming counts their characters, not bytes."""
    out = Tokenizer.from_str(tok.to_str())
    out.add_tokens(["    ", "\n\n", " <tool> ", "\u3000x"])
    out.add_special_tokens(CHAT_SPECIALS)
    return out


@pytest.fixture(scope="module")
def shapes() -> dict[str, Tokenizer]:
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    llama3 = train(llama3_pre_tokenizer())
    trim = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    trim_prefix = {**trim, "add_prefix_space": True, "use_regex": True}
    roberta = {
        "type": "RobertaProcessing",
        "sep": ["<|endoftext|>", 0],
        "cls": ["<|begin_of_text|>", 1],
        "trim_offsets": True,
        "add_prefix_space": True,
    }
    return {
        "gpt2": gpt2,
        "llama3": llama3,
        "llama3-trim": edited(llama3, _with_processor(trim)),
        "gpt2-trim-prefix": edited(gpt2, _with_processor(trim_prefix)),
        "roberta-trim": edited(gpt2, _with_processor(roberta)),
        "sequence-trim": edited(
            llama3, _with_processor({"type": "Sequence", "processors": [trim_prefix]})
        ),
        "whitespace-added": _whitespace_added_tokens(edited(llama3, _with_processor(trim_prefix))),
        "nfc": train(llama3_pre_tokenizer(), normalizers.NFC()),
    }


def _texts() -> list[str]:
    texts = multilingual_texts(200, seed=3) + list(ADVERSARIAL)
    texts += [f"<|im_start|>user\n{t[:40]}<|im_end|>\n<|im_start|>assistant\n" for t in texts[:30]]
    texts += ["    code\n\n <tool> x\u3000x", "  " + texts[0] + "   ", "Ġ not a space", ""]
    return texts


def _hf(tok: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    encs = tok.encode_batch(texts, add_special_tokens=False)
    return [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encs]


@pytest.mark.parametrize("mode", ["python", "numba"])
@pytest.mark.parametrize(
    "shape",
    [
        "gpt2",
        "llama3",
        "llama3-trim",
        "gpt2-trim-prefix",
        "roberta-trim",
        "sequence-trim",
        "whitespace-added",
        "nfc",
    ],
)
def test_offsets_from_ids_equal_hf(shapes: dict[str, Tokenizer], shape: str, mode: str) -> None:
    tok = shapes[shape]
    table = ByteOffsets.of(tok)
    assert table is not None
    texts = _texts()
    ids, bounds = HFEncoder(tok)(texts)
    with jit.forced(mode):
        got = table(texts, ids, bounds)
    want = _hf(tok, texts)
    derived = 0
    for text, g, w in zip(texts, got, want, strict=True):
        if g is not None:
            assert np.array_equal(g, w), f"offsets differ on {text[:60]!r}"
            derived += 1
    if shape == "nfc":  # texts NFC changes are not spelled by their tokens: HF does those
        changed = sum(normalizers.NFC().normalize_str(t) != t for t in texts)
        assert changed > 0 and derived == len(texts) - changed
    else:
        assert derived == len(texts)


def test_ids_that_do_not_spell_the_text_give_none(shapes: dict[str, Tokenizer]) -> None:
    tok = shapes["llama3"]
    table = ByteOffsets.of(tok)
    assert table is not None
    texts = ["hello world", "hello world", "abc"]
    ids, bounds = HFEncoder(tok)(texts)
    ids = ids.copy()
    ids[bounds[1]] = tok.token_to_id("<|endoftext|>")  # second text: a wrong first token
    wrong_last = np.concatenate([ids[: bounds[2]], ids[bounds[2] : bounds[3] - 1]])
    got = table(texts, wrong_last, np.array([0, bounds[1], bounds[2], bounds[3] - 1]))
    assert got[0] is not None and got[1] is None and got[2] is None  # a token missing: short
    out_of_vocab = np.array([10**6], dtype=np.int64)
    assert table(["x"], out_of_vocab, np.array([0, 1])) == [None]


def test_tokenizers_whose_tokens_are_not_bytes_have_no_table() -> None:
    assert ByteOffsets.of(wordpiece()) is None
    metaspace = wordpiece()
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()
    assert ByteOffsets.of(metaspace) is None


# ---------------------------------------------------------------------------------------------
# Chat end to end: the same bytes from a fast backend as from HF


def _chat_tokenizer(folder: Path, shapes: dict[str, Tokenizer], shape: str) -> Path:
    tok = Tokenizer.from_str(shapes[shape].to_str())
    tok.add_special_tokens(CHAT_SPECIALS)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def _chat_corpus(path: Path, n: int = 120) -> Path:
    rng = random.Random(5)
    texts = multilingual_texts(4 * n, seed=7) + list(ADVERSARIAL)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            msgs = [{"role": "system", "content": "  be brief  "}] if i % 3 == 0 else []
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "user", "content": rng.choice(texts)[:300]})
                msgs.append({"role": "assistant", "content": " " + rng.choice(texts)[:400]})
            fh.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    return path


CHAT = ["--format", "chat", "--chat-template", "chatml", "--short-len", "256"]
CHAT += ["--long-len", "4096", "-q"]


def _parquet_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.parquet"))}


def _backend(out: Path) -> dict:
    return json.loads((out / "packcli.json").read_text())["run"]["tokenizer_backend"]


@needs_fastokens
@pytest.mark.parametrize("mode", ["python", "numba"])
@pytest.mark.parametrize("shape", ["llama3", "gpt2-trim-prefix", "nfc"])
def test_chat_on_fastokens_writes_hf_bytes(
    shapes: dict[str, Tokenizer], shape: str, mode: str, tmp_path: Path
) -> None:
    tok = _chat_tokenizer(tmp_path / "tok", shapes, shape)
    corpus = _chat_corpus(tmp_path / "chat.jsonl")
    invoke_ok("pack", corpus, "-t", tok, "-o", tmp_path / "hf", *CHAT, "--tokenizer-backend", "hf")
    with jit.forced(mode):
        invoke_ok(
            "pack", corpus, "-t", tok, "-o", tmp_path / "fast", *CHAT,
            "--tokenizer-backend", "fastokens",
        )  # fmt: skip
    assert _parquet_bytes(tmp_path / "fast") == _parquet_bytes(tmp_path / "hf")
    backend = _backend(tmp_path / "fast")
    assert backend["backend"] == "fastokens"
    check = backend["chat_offsets"]
    assert check["mismatch"] is None and check["derived"] > 0
    chat = json.loads((tmp_path / "fast" / "packcli.json").read_text())["report"]["chat"]
    if shape == "nfc":  # NFC rewrites some texts: those dialogues took HF's offsets
        assert chat["hf_offsets"] > 0
    else:
        assert chat["hf_offsets"] == 0
    invoke_ok("verify", tmp_path / "fast")


@needs_fastokens
def test_wrong_offsets_fail_the_check(
    shapes: dict[str, Tokenizer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = _chat_tokenizer(tmp_path / "tok", shapes, "llama3")
    corpus = _chat_corpus(tmp_path / "chat.jsonl", n=30)
    right = ByteOffsets.flat  # what __call__ and the chat path's columnar finish use

    def shifted(
        self: ByteOffsets, texts: list[str], ids: np.ndarray, bounds: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        offsets, spelled = right(self, texts, ids, bounds)
        for i in np.flatnonzero(spelled):
            if bounds[i + 1] - bounds[i] > 1:
                offsets[bounds[i] + 1, 0] += 1  # one token's start off by one character
        return offsets, spelled

    monkeypatch.setattr(ByteOffsets, "flat", shifted)
    code, output = invoke(
        "pack", corpus, "-t", tok, "-o", tmp_path / "named", *CHAT,
        "--tokenizer-backend", "fastokens",
    )  # fmt: skip
    assert code == 1 and "offsets differ from HF's" in output
    big = tmp_path / "big.jsonl"  # auto takes HF for small inputs; make it worth a fast one
    big.write_text(corpus.read_text() * 40)
    invoke_ok("pack", big, "-t", tok, "-o", tmp_path / "auto", *CHAT)
    backend = _backend(tmp_path / "auto")
    assert backend["backend"] == "hf" and "offsets differ" in backend["fallback_reason"]


@needs_fastokens
def test_chat_with_a_tokenizer_that_is_not_byte_level(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    tok = wordpiece()
    tok.add_special_tokens(CHAT_SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    corpus = tmp_path / "chat.jsonl"
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "worlds"}]
    corpus.write_text("".join(json.dumps({"messages": msgs}) + "\n" for _ in range(3000)))
    code, output = invoke(
        "pack", corpus, "-t", folder, "-o", tmp_path / "named", *CHAT, "--eos", "none",
        "--tokenizer-backend", "fastokens",
    )  # fmt: skip
    assert code == 1 and "byte-level BPE" in output
    invoke_ok("pack", corpus, "-t", folder, "-o", tmp_path / "auto", *CHAT, "--eos", "none")
    backend = _backend(tmp_path / "auto")
    assert backend["backend"] == "hf" and "byte-level BPE" in backend["fallback_reason"]


@needs_fastokens
def test_fast_offsets_check_records_what_it_compared(shapes: dict[str, Tokenizer]) -> None:
    from packcli.tokenize.backends import FastokensEncoder

    tok = shapes["llama3-trim"]
    table = ByteOffsets.of(tok)
    assert table is not None
    texts = _texts()
    record = check_offsets(FastOffsets(FastokensEncoder(tok), table), tok, texts)
    assert record.mismatch is None
    assert record.derived == len(texts) and record.tokens > len(texts)


@pytest.mark.parametrize("mode", ["python", "numba"])
def test_token_turns_are_the_tokens_sharing_a_character(mode: str) -> None:
    """Each span's token range is exactly the tokens that share a character with it, for
    offsets that only go forward (binary search) and offsets that go back (every token)."""
    from packcli.chat.offsets import token_turns

    rng = random.Random(0)
    for _ in range(200):
        offsets, spans = [], []
        for _ in range(rng.randint(1, 5)):
            pos, rows = 0, []
            for _ in range(rng.randint(0, 25)):
                a = pos + rng.randint(0, 2)
                b = a + rng.randint(0, 4)
                rows.append((a, b))
                pos = b if rng.random() < 0.9 else max(0, a - 3)
            offsets.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
            spans.append(
                [
                    (a, a + rng.randint(0, 9))
                    for a in sorted(rng.randint(0, pos + 3) for _ in range(3))
                ]
            )
        with jit.forced(mode):
            got = token_turns(offsets, spans)
        for o, s, g in zip(offsets, spans, got, strict=True):
            want = []
            for a, b in s:
                hit = [i for i, (x, y) in enumerate(o.tolist()) if x < b and y > a]
                if hit:
                    want.append([hit[0], hit[-1] + 1])
            assert g.tolist() == want


def test_batch_masks_equal_one_dialogue_at_a_time() -> None:
    """The chat path's masks for a batch (one array, views per dialogue) equal building each
    dialogue's on its own, for every --train-on, with empty dialogues and turnless ones."""
    from packcli.chat.mask import _mask, _masks

    rng = random.Random(1)
    for _ in range(300):
        lengths = [rng.randint(0, 30) for _ in range(rng.randint(1, 6))]
        turns = []
        for n in lengths:
            pos, rows = 0, []
            for _ in range(rng.randint(0, 4)):
                a = rng.randint(pos, n)
                b = rng.randint(a, n)
                if b > a:
                    rows.append((a, b))
                    pos = b
            turns.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
        for train_on in ("assistant", "last", "all"):
            got = _masks(lengths, turns, train_on)
            assert len(got) == len(lengths)
            for n, t, g in zip(lengths, turns, got, strict=True):
                assert np.array_equal(g, _mask(n, t, train_on))
    assert _masks([], [], "assistant") == []


@needs_fastokens
def test_preference_pairs_on_fastokens_write_hf_bytes(
    shapes: dict[str, Tokenizer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preference pairs (strings and messages) through the fast backend's ids and derived
    offsets: the same bytes and report as on HF."""
    tok = _chat_tokenizer(tmp_path / "tok", shapes, "gpt2-trim-prefix")
    texts = multilingual_texts(400, seed=9) + list(ADVERSARIAL)
    rng = random.Random(2)
    corpus = tmp_path / "pairs.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for i in range(150):
            prompt, chosen, rejected = (rng.choice(texts)[:200] for _ in range(3))
            if i % 2:
                pair: dict = {
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            else:
                pair = {"prompt": prompt, "chosen": " " + chosen, "rejected": " " + rejected}
            fh.write(json.dumps(pair, ensure_ascii=False) + "\n")
    args = ["--format", "preference", "--chat-template", "chatml", "--short-len", "512"]
    args += ["--long-len", "4096", "-q"]
    invoke_ok("pack", corpus, "-t", tok, "-o", tmp_path / "hf", *args, "--tokenizer-backend", "hf")
    texts_encoded: list[int] = []
    real = FastOffsets.__call__

    def counted(self: FastOffsets, texts: list[str]) -> list:
        texts_encoded.append(len(texts))
        return real(self, texts)

    monkeypatch.setattr(FastOffsets, "__call__", counted)
    invoke_ok(
        "pack", corpus, "-t", tok, "-o", tmp_path / "fast", *args,
        "--tokenizer-backend", "fastokens",
    )  # fmt: skip
    assert sum(texts_encoded[1:]) >= 3 * 150  # after the check: every prompt and sequence
    assert _parquet_bytes(tmp_path / "fast") == _parquet_bytes(tmp_path / "hf")
    backend = _backend(tmp_path / "fast")
    assert backend["backend"] == "fastokens" and backend["chat_offsets"]["mismatch"] is None
    fast = json.loads((tmp_path / "fast" / "packcli.json").read_text())["report"]
    hf = json.loads((tmp_path / "hf" / "packcli.json").read_text())["report"]
    assert fast["preference"].pop("hf_offsets") == 0
    hf["preference"].pop("hf_offsets")
    assert fast == hf
    invoke_ok("verify", tmp_path / "fast")
