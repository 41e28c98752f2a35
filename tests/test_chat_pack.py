"""Chat end to end: the real CLI on jsonl dialogues -> rows with labels, loadable, verified."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from clirun import invoke
from corpora import CHAT_WORDS as WORDS
from corpora import IM_END, chatml_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from packcli import jit
from packcli.tokenize.shards import sha256_file


def dialogue(rng: random.Random, turns: int, words: int = 8) -> list[dict[str, str]]:
    def say() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))

    msgs = [{"role": "system", "content": "You are helpful."}] if rng.random() < 0.5 else []
    for _ in range(turns):
        msgs += [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]
    return msgs


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chatml_tokenizer(tmp_path_factory.mktemp("chat_tok"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict[str, str]]]]:
    rng = random.Random(0)
    dialogues = [dialogue(rng, rng.randint(1, 4)) for _ in range(150)]
    dialogues[7] = [{"role": "user", "content": "no answer here"}]  # nothing to train
    dialogues[9] = dialogue(rng, 60, words=30)  # far over the long tier
    dialogues[11] = [
        {"role": "user", "content": "emoji?"},
        {"role": "assistant", "content": "yes 🙂 東京 naïve"},
    ]
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, d in enumerate(dialogues):
            fh.write(json.dumps({"messages": d, "id": i}, ensure_ascii=False) + "\n")
    return path, dialogues


ARGS = ["--format", "chat", "--chat-template", "chatml", "--short-len", "128"]
ARGS += ["--long-len", "512", "-q"]


def trained_runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    runs, cur = [], []
    for t, lab in zip(ids, labels, strict=True):
        if lab != -100:
            assert lab == t
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def segments(row: dict[str, Any]) -> list[tuple[int, list[int], list[int]]]:
    out, start = [], 0
    for doc, n in zip(row["doc_ids"], row["seq_lengths"], strict=True):
        out.append((doc, row["input_ids"][start : start + n], row["labels"][start : start + n]))
        start += n
    return out


@pytest.mark.parametrize("train_on", ["assistant", "last"])
def test_chat_pack_trains_only_assistant_turns(
    chat_tok: Path, corpus: tuple[Path, list], tmp_path: Path, train_on: str
) -> None:
    path, dialogues = corpus
    out = tmp_path / "out"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", out, *ARGS, "--train-on", train_on)
    assert code == 0, output
    meta = json.loads((out / "packcli.json").read_text())
    report = meta["report"]
    # Loss masks need character offsets: the fast backend's are derived from its ids and
    # were compared with HF's before use (tests/test_offsets.py), so the labels below are
    # checked on the fast path.
    backend = meta["run"]["tokenizer_backend"]
    assert backend["backend"] == "fastokens" and backend["chat_offsets"]["mismatch"] is None
    assert report["chat"]["no_trainable"] == 1
    assert report["policy"]["dropped_docs"] == 1  # the overlong dialogue, dropped by default
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    long = datasets.load_dataset(str(out), "long", split="train")
    assert "labels" in long.features
    seen: set[int] = set()
    for row in long:
        for doc, ids, labels in segments(row):
            assert doc not in seen  # a dialogue is never in two rows, nor split
            seen.add(doc)
            assert labels[0] == -100
            runs = [tok.decode(r, skip_special_tokens=False) for r in trained_runs(ids, labels)]
            turns = [m["content"] for m in dialogues[doc] if m["role"] == "assistant"]
            expected = turns[-1:] if train_on == "last" else turns
            assert [r.lstrip("\n") for r in runs] == [t + IM_END for t in expected]
    assert seen == set(range(len(dialogues))) - {7, 9}
    code, output = invoke("verify", out)
    assert code == 0, output


def test_chat_truncate_cuts_at_a_turn_and_verify_checks_labels(
    chat_tok: Path, corpus: tuple[Path, list], tmp_path: Path
) -> None:
    path, _ = corpus
    out = tmp_path / "out"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", out, *ARGS, "--overlong", "truncate")
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["chat"]["truncated"] == 1 and report["chat"]["truncated_tokens"] > 0
    # One account (issue 29 item 13): the policy counts the dialogue the encoder cut.
    pol = report["policy"]
    assert (pol["truncated_docs"], pol["truncated_tokens"]) == (
        report["chat"]["truncated"],
        report["chat"]["truncated_tokens"],
    )
    kept = report["input"]["tokens"] - pol["truncated_tokens"] - pol["dropped_tokens"]
    assert report["tiers"]["long"]["tokens"] == kept
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    long = datasets.load_dataset(str(out), "long", split="train")
    row = next(r for r in long if 9 in r["doc_ids"])
    ids = next(s[1] for s in segments(row) if s[0] == 9)
    assert len(ids) <= 512
    assert tok.decode(ids, skip_special_tokens=False).endswith(IM_END)  # ends after a turn
    # Forge a label at a segment start: verify must refuse it even with a matching hash.
    meta = json.loads((out / "packcli.json").read_text())
    entry = meta["files"]["long"][0]
    pfile = out / "data" / "long" / entry["file"]
    table = pq.read_table(pfile).to_pydict()
    table["labels"][0][0] = table["input_ids"][0][0]
    pq.write_table(pq.read_table(pfile).from_pydict(table, schema=pq.read_schema(pfile)), pfile)
    entry["sha256"] = sha256_file(pfile)
    (out / "packcli.json").write_text(json.dumps(meta))
    code, output = invoke("verify", out)
    assert code == 1 and "first token has a label" in output


def test_bad_dialogue_errors_or_is_quarantined(chat_tok: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}
    lines = [json.dumps(good), json.dumps(bad), json.dumps(good)]
    path.write_text("\n".join(lines) + "\n")
    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "o1", *ARGS)
    assert code == 1 and f"{path}:2" in output and "unknown role 'bot'" in output
    out = tmp_path / "o2"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", out, *ARGS, "--on-bad-line", "skip")
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["rejected"] == {"bad_record": 1} and report["input"]["documents"] == 2
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [(2, "bad_record")]
    assert base64.b64decode(rejected[0]["raw_b64"]).decode().strip() == lines[1]
    long = datasets.load_dataset(str(out), "long", split="train")
    assert sorted(d for r in long for d in r["doc_ids"]) == [0, 1]
    assert np.all(np.array(long[0]["labels"]) >= -100)


def test_template_failures_follow_the_bad_line_policy(chat_tok: Path, tmp_path: Path) -> None:
    from packcli.chat import load_chat_template

    chatml = load_chat_template(None, "chatml").text
    template = tmp_path / "picky.jinja"
    template.write_text(
        "{% if messages | length > 2 %}{{ raise_exception('at most one exchange') }}{% endif %}"
        + chatml
    )
    one = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"messages": m}) for m in (one, one * 2, one)) + "\n")
    args = ["--format", "chat", "--chat-template", template, "--short-len", "64"]
    args += ["--long-len", "256", "-q"]
    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "e", *args)
    assert code == 1 and f"{path}:2" in output and "at most one exchange" in output
    out = tmp_path / "s"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", out, *args, "--on-bad-line", "skip")
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["rejected"] == {"template_error": 1}
    assert report["documents_by_length"]["empty"] == 1  # kept as an empty document, not packed
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [(2, "template_error")]
    code, output = invoke("verify", out)
    assert code == 0, output


def _rows_by_doc(out: Path) -> dict[int, tuple[list[int], list[int]]]:
    long = datasets.load_dataset(str(out), "long", split="train")
    return {doc: (ids, labels) for row in long for doc, ids, labels in segments(row)}


def test_chat_bos_and_eos_are_applied(chat_tok: Path, tmp_path: Path) -> None:
    """--bos goes first with label -100; --eos goes last, trained when the dialogue ends
    with an assistant turn (the model learns to stop there), not after a user turn."""
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    bos, eos = tok.token_to_id("<|endoftext|>"), tok.token_to_id(IM_END)
    path = tmp_path / "c.jsonl"
    answered = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    unanswered = [*answered, {"role": "user", "content": "bye"}]
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (answered, unanswered)))
    plain, added = tmp_path / "plain", tmp_path / "added"
    assert invoke("pack", path, "-t", chat_tok, "-o", plain, *ARGS)[0] == 0
    separators = ["--bos", "<|endoftext|>", "--eos", IM_END]  # ChatML ends with "\n"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", added, *ARGS, *separators)
    assert code == 0, output
    before, after = _rows_by_doc(plain), _rows_by_doc(added)
    for doc, trained in ((0, True), (1, False)):
        ids, labels = after[doc]
        assert ids == [bos, *before[doc][0], eos]
        assert labels == [-100, *before[doc][1], eos if trained else -100]
    meta = json.loads((added / "packcli.json").read_text())
    chat = meta["report"]["chat"]
    assert (chat["bos_added"], chat["eos_added"], chat["eos_trained"]) == (2, 2, 1)
    assert chat["bos_in_template"] == chat["eos_in_template"] == 0
    assert (meta["run"]["tokenizer"]["bos_id"], meta["run"]["tokenizer"]["eos_id"]) == (bos, eos)
    code, output = invoke("verify", added)
    assert code == 0, output


def test_chat_bos_and_eos_rendered_by_the_template_are_not_doubled(
    chat_tok: Path, tmp_path: Path
) -> None:
    """A template that writes BOS first and EOS last (Llama-3, Phi-3 do one or the other)
    keeps its own: the ids are exactly the rendered dialogue's, and the report says so."""
    template = tmp_path / "own.jinja"
    template.write_text(
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{{ eos_token }}"
    )
    (chat_tok / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<|im_start|>"})
    )
    try:
        path = tmp_path / "c.jsonl"
        answered = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        path.write_text(json.dumps({"messages": answered}) + "\n")
        args = ["--format", "chat", "--chat-template", template, "--short-len", "64", "-q"]
        plain, added = tmp_path / "plain", tmp_path / "added"
        assert invoke("pack", path, "-t", chat_tok, "-o", plain, *args)[0] == 0
        more = ["--bos", "<|im_start|>", "--eos", "<|endoftext|>"]
        assert invoke("pack", path, "-t", chat_tok, "-o", added, *args, *more)[0] == 0
    finally:
        (chat_tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": IM_END}))
    assert _rows_by_doc(added) == _rows_by_doc(plain)
    ids = _rows_by_doc(added)[0][0]
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|endoftext|>")
    assert ids[1] == tok.token_to_id("<|im_start|>")  # the template's first turn follows
    chat = json.loads((added / "packcli.json").read_text())["report"]["chat"]
    assert (chat["bos_added"], chat["bos_in_template"]) == (0, 1)
    assert (chat["eos_added"], chat["eos_in_template"]) == (0, 1)


def test_chat_encoder_truncates_with_room_for_the_separators(chat_tok: Path) -> None:
    from packcli.chat import encode_dialogue, load_chat_template
    from packcli.chat.encoder import ChatEncoder

    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    chatml = load_chat_template(None, "chatml")
    # One id for both: the toy vocabulary's other control tokens are ChatML's own markers,
    # which turns already start or end with (they would not be added again).
    bos = eos = tok.token_to_id("<|endoftext|>")
    turns = [("user", "the question"), ("assistant", "the answer"), ("user", "tool token")]
    turns += [("assistant", "packing is sunny"), ("user", "of")]
    messages = [{"role": r, "content": c} for r, c in turns]
    full = encode_dialogue(tok, chatml, messages)
    first, second = (int(end) for end in full.turns[:, 1])

    def encode(long_len: int, train_on: str = "assistant") -> tuple[list[int], list[int]]:
        encoder = ChatEncoder(
            tok, chatml, train_on=train_on, special_tokens={}, long_len=long_len,
            overlong="truncate", bos=bos, eos=eos,
        )  # fmt: skip
        encoded = encoder([messages])
        ids = encoded.ids
        assert not encoded.failures and int(encoded.lengths[0]) == len(ids) <= long_len
        return ids.tolist(), encoded.labels.tolist()

    # Room for BOS + two turns + EOS: cut after the second turn, its EOS trained.
    ids, labels = encode(second + 2)
    assert ids == [bos, *full.ids[:second].tolist(), eos]
    assert labels == [-100, *full.labels()[:second].tolist(), eos]
    # One token less: the EOS would not fit after the second turn, so the first is kept.
    ids, labels = encode(second + 1)
    assert ids == [bos, *full.ids[:first].tolist(), eos] and labels[-1] == eos
    # Whole dialogue, which ends with a user turn: EOS untrained, except with --train-on all.
    ids, labels = encode(len(full.ids) + 2)
    assert ids == [bos, *full.ids.tolist(), eos] and labels[-1] == -100
    ids, labels = encode(len(full.ids) + 2, "all")
    assert labels == [-100, *full.ids.tolist(), eos]


def test_rendering_on_worker_processes_gives_the_same_bytes(
    chat_tok: Path, corpus: tuple[Path, list], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large chat inputs render on spawned workers (packcli/chat/render_pool.py): same Parquet
    bytes and report as rendering in the task's process; a template failure on a worker is
    still a `file:line` error or a quarantined line, and a hostile template's error still
    stops the run with its message."""
    from packcli.chat import load_chat_template, render_pool

    path, _ = corpus
    invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "one", *ARGS, "--num-proc", "2")
    monkeypatch.setattr(render_pool, "MIN_POOL_BYTES", 0)
    started: list[int] = []
    real_init = render_pool.RenderPool.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(args[-1] if args else kwargs["workers"])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(render_pool.RenderPool, "__init__", init)
    code, output = invoke(
        "pack", path, "-t", chat_tok, "-o", tmp_path / "pool", *ARGS, "--num-proc", "2",
        "--batch-size", "16",
    )  # fmt: skip
    assert code == 0, output
    assert started == [2]
    # And with the fast backend: its tokens of the next batch on a thread while this one is
    # masked (packcli.chat.batches).
    code, output = invoke(
        "pack", path, "-t", chat_tok, "-o", tmp_path / "fast", *ARGS, "--num-proc", "2",
        "--batch-size", "16", "--tokenizer-backend", "fastokens",
    )  # fmt: skip
    assert code == 0, output
    assert started == [2, 2]
    parquet = sorted((tmp_path / "one").rglob("*.parquet"))
    assert parquet and all(
        p.read_bytes() == (tmp_path / run / p.relative_to(tmp_path / "one")).read_bytes()
        for p in parquet
        for run in ("pool", "fast")
    )
    one = json.loads((tmp_path / "one" / "packcli.json").read_text())["report"]
    pool = json.loads((tmp_path / "pool" / "packcli.json").read_text())["report"]
    assert one == pool
    chatml = load_chat_template(None, "chatml").text
    picky = tmp_path / "picky.jinja"
    picky.write_text(
        "{% if messages | length > 4 %}{{ raise_exception('at most two exchanges') }}{% endif %}"
        + chatml
    )
    args = ["--format", "chat", "--chat-template", picky, "--short-len", "128", "--long-len", "512"]
    args += ["--num-proc", "2", "-q"]
    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "e", *args)
    assert code == 1 and "at most two exchanges" in output and f"{path}:" in output
    out = tmp_path / "s"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", out, *args, "--on-bad-line", "skip")
    assert code == 0, output
    rejected = json.loads((out / "packcli.json").read_text())["report"]["input"]["rejected"]
    assert rejected["template_error"] > 0
    hostile = tmp_path / "hostile.jinja"
    hostile.write_text("{% for i in range(10**9) %}{{ i }}{% endfor %}")
    args[args.index(picky)] = hostile
    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "h", *args)
    assert code == 1 and "chat template" in output


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=st.lists(
        st.lists(st.sampled_from(["user", "assistant", "system", "bogus"]), max_size=4),
        max_size=12,
    ),
    seed=st.integers(0, 2**16),
    train_on=st.sampled_from(["assistant", "last", "all"]),
    fast=st.booleans(),
)
def test_batch_finish_equals_the_per_dialogue_loop(
    chat_tok: Path, shapes: list[list[str]], seed: int, train_on: str, fast: bool
) -> None:
    """Without separators or truncation a batch is finished by whole-batch array operations;
    they give the per-dialogue loop's ids, labels, lengths and counts exactly: dialogues with
    nothing to train (dropped as empty documents), ones the template refuses, empty ones."""
    from packcli.chat import encoder as chat_encoder
    from packcli.chat import load_chat_template
    from packcli.chat.encoder import ChatEncoder
    from packcli.chat.offsets import ByteOffsets, FastOffsets
    from packcli.tokenize.backends import FastokensEncoder

    rng = random.Random(seed)
    dialogues = [
        [{"role": r, "content": " ".join(rng.choices(WORDS, k=rng.randint(0, 6)))} for r in roles]
        for roles in shapes
    ]
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    chatml = load_chat_template(None, "chatml")
    encoder = ChatEncoder(
        tok, chatml, train_on=train_on, special_tokens={}, long_len=1 << 17, overlong="drop",
        bos=None, eos=None,
    )  # fmt: skip
    if fast:
        encoder.fast = FastOffsets(FastokensEncoder(tok, tok.to_str()), ByteOffsets.of(tok))
    batch = encoder(dialogues)
    real = chat_encoder._kept_flat
    try:
        chat_encoder._kept_flat = lambda *args: None  # the per-dialogue loop
        loop = encoder(dialogues)
    finally:
        chat_encoder._kept_flat = real
    for name in ("ids", "labels", "lengths"):
        got, want = getattr(batch, name), getattr(loop, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert batch.stats == loop.stats and batch.failures == loop.failures
    # As a rendering worker hands the batch back (columns), finished from the fast
    # backend's whole-batch arrays (or, without one or with --eos, by the same loop).
    from packcli.chat.columns import RenderedColumns

    ends = np.array([bool(d) and d[-1]["role"] == "assistant" for d in dialogues], np.bool_)
    for eos in (None, 7):
        encoder.eos = eos
        rendered, failures = encoder.render(dialogues)
        want_records = encoder.finish(dialogues, rendered, encoder.tokens(rendered), failures)
        columns = RenderedColumns.of(rendered, failures)
        for mode in ("python", "numba"):  # the labelling kernel, as Python and compiled
            with jit.forced(mode):
                tokens = encoder.tokens_columns(columns)
            got_records = encoder.finish_columns(len(dialogues), columns, tokens, ends)
            for name in ("ids", "labels", "lengths"):
                got, want = getattr(got_records, name), getattr(want_records, name)
                assert got.dtype == want.dtype and np.array_equal(got, want), (name, eos)
            assert got_records.stats == want_records.stats
            assert got_records.failures == want_records.failures


@pytest.mark.parametrize("mode", ["python", "numba"])
def test_a_text_its_fast_ids_do_not_spell_is_encoded_by_hf(chat_tok: Path, mode: str) -> None:
    """When the fast backend's ids of one rendered text do not spell it, the batch is not
    labelled from them: that text goes to HF and the records equal HF's own."""
    from packcli.chat import load_chat_template
    from packcli.chat.columns import RenderedColumns
    from packcli.chat.encoder import ChatEncoder
    from packcli.chat.offsets import ByteOffsets, FastOffsets, FlatTokens
    from packcli.tokenize.backends import FastokensEncoder

    rng = random.Random(5)
    dialogues = [dialogue(rng, rng.randint(1, 3)) for _ in range(30)]
    tok = Tokenizer.from_file(str(chat_tok / "tokenizer.json"))
    encoder = ChatEncoder(
        tok, load_chat_template(None, "chatml"), train_on="assistant", special_tokens={},
        long_len=1 << 17, overlong="drop", bos=None, eos=None,
    )  # fmt: skip
    hf = encoder(dialogues)
    fast = FastokensEncoder(tok, tok.to_str())

    def wrong_on_text_3(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, bounds = fast(texts)
        ids = ids.copy()
        ids[bounds[3]] = tok.token_to_id(IM_END)  # the text starts with <|im_start|>
        return ids, bounds

    encoder.fast = FastOffsets(fast, ByteOffsets.of(tok))
    encoder.fast.encoder = wrong_on_text_3
    rendered, failures = encoder.render(dialogues)
    columns = RenderedColumns.of(rendered, failures)
    with jit.forced(mode):
        tokens = encoder.tokens_columns(columns)
    assert isinstance(tokens, FlatTokens) and tokens.spelled.tolist().count(False) == 1
    ends = np.array([d[-1]["role"] == "assistant" for d in dialogues], np.bool_)
    got = encoder.finish_columns(len(dialogues), columns, tokens, ends)
    for name in ("ids", "labels", "lengths"):
        assert np.array_equal(getattr(got, name), getattr(hf, name)), name
    assert got.stats.hf_offsets == 1


def _untidy_chat(path: Path, rng: random.Random, n: int) -> None:
    """Dialogues with what the reader and the template refuse: a BOM, blank lines, cut
    JSON, a bad role, dialogues the picky template below rejects, no final newline."""
    with open(path, "wb") as fh:
        fh.write(b"\xef\xbb\xbf")
        for i in range(n):
            record = {"messages": dialogue(rng, rng.randint(1, 4)), "id": i}
            fh.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
            if i % 17 == 3:
                fh.write(b"\n  \n")
            if i % 23 == 5:
                fh.write(b'{"messages": [\n')
            if i % 29 == 7:
                bad = {"messages": [{"role": "bot", "content": "beep"}]}
                fh.write(json.dumps(bad).encode() + b"\n")
        fh.write(json.dumps({"messages": dialogue(rng, 1)}).encode())


def test_workers_reading_spans_give_the_same_output(
    chat_tok: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large plain jsonl unit is read, validated and rendered by the workers in byte
    spans (packcli/chat/render_pool.py ``submit_span``): the same Parquet bytes, report and
    quarantine as this process reading it, with bad lines, template failures, a BOM and
    units that are spans of the file; under ``error`` the same first ``file:line``."""
    from packcli import config
    from packcli.chat import load_chat_template, render_pool

    path = tmp_path / "untidy.jsonl"
    _untidy_chat(path, random.Random(4), 300)
    picky = tmp_path / "picky.jinja"
    picky.write_text(
        "{% if messages | length > 7 %}{{ raise_exception('at most three exchanges') }}"
        "{% endif %}" + load_chat_template(None, "chatml").text
    )
    args = ["--format", "chat", "--chat-template", picky, "--short-len", "128"]
    args += ["--long-len", "512", "-q", "--num-proc", "2", "--batch-size", "16"]
    skip = [*args, "--on-bad-line", "skip"]

    def outputs(out: Path) -> tuple[dict[str, bytes], Any, list[Any]]:
        parquet = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*.parquet")}
        report = json.loads((out / "packcli.json").read_text())["report"]
        rejects = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
        return parquet, report, sorted(rejects, key=lambda r: (r["line"], r["reason"]))

    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "one", *skip)
    assert code == 0, output
    want = outputs(tmp_path / "one")
    reasons = {r["reason"] for r in want[2]}
    assert reasons == {"invalid_json", "bad_record", "template_error"}, reasons
    monkeypatch.setattr(render_pool, "MIN_POOL_BYTES", 0)
    monkeypatch.setattr(render_pool, "SPAN_BYTES", 700)  # many spans, a few lines each
    monkeypatch.setattr(render_pool, "READ_AHEAD", 3)
    code, output = invoke("pack", path, "-t", chat_tok, "-o", tmp_path / "spans", *skip)
    assert code == 0, output
    assert outputs(tmp_path / "spans") == want
    monkeypatch.setattr(config, "MIN_SPLIT_BYTES", 1)  # units that are spans of the file
    units = tmp_path / "units"
    code, output = invoke("pack", path, "-t", chat_tok, "-o", units, *skip, "--split-bytes", "9000")
    assert code == 0, output
    assert len(json.loads((units / ".packcli/tokens/stage.json").read_text())["units"]) > 3
    assert outputs(units) == want
    # Under error: the first bad line stops the run, named by the file's own line.
    for late in ('{"messages": [', json.dumps({"messages": dialogue(random.Random(1), 5)})):
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        good = [x for x in lines if x.strip() and "bot" not in x and x != '{"messages": [']
        good = [x for x in good if len(json.loads(x)["messages"]) <= 7]
        assert len(good) > 150
        good.insert(150, late)
        strict = tmp_path / "strict.jsonl"
        strict.write_text("\n".join(good) + "\n")
        messages = []
        for pool_bytes in (1 << 40, 0):
            monkeypatch.setattr(render_pool, "MIN_POOL_BYTES", pool_bytes)
            code, output = invoke("pack", strict, "-t", chat_tok, "-o", tmp_path / "e", *args)
            assert code == 1 and f"{strict}:151" in output, output
            messages.append(output)
        assert messages[0] == messages[1]
