"""Preference pairs end to end: the real CLI on TRL's record forms -> rows where each pair is
two adjacent segments (seq_roles 1, 2; one doc id), labels compared with TRL's tokenization."""

from __future__ import annotations

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
from tokenizers import Tokenizer

from packcli.chat import ChatFormatError, load_chat_template
from packcli.chat.preference import response_cap
from packcli.chat.validate import validate_pair
from packcli.tokenize.shards import sha256_file
from packcli.write import pair_segments

EOT = "<|endoftext|>"
ARGS = ["--format", "preference", "--chat-template", "chatml", "--short-len", "128"]
ARGS += ["--long-len", "512", "-q"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chatml_tokenizer(tmp_path_factory.mktemp("tok_dir"))


@pytest.fixture(scope="module")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def _say(rng: random.Random, words: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def make_pair(rng: random.Random, form: str) -> dict[str, Any]:
    """One record in one of TRL's forms (answers start with a space after string prompts,
    as TRL's own examples do)."""
    if form == "strings":
        return {"prompt": _say(rng), "chosen": " " + _say(rng), "rejected": " " + _say(rng)}
    history = [_msg("user", _say(rng))]
    if rng.random() < 0.5:  # a multi-turn prompt: its assistant turn is context, not trained
        history = [_msg("system", "Be brief."), *history, _msg("assistant", _say(rng))]
        history.append(_msg("user", _say(rng)))
    chosen, rejected = [_msg("assistant", _say(rng))], [_msg("assistant", _say(rng, 20))]
    if form == "messages":
        return {"prompt": history, "chosen": chosen, "rejected": rejected}
    if form == "implicit":
        return {"chosen": history + chosen, "rejected": history + rejected}
    raise ValueError(form)


FORMS = ("strings", "messages", "implicit", "implicit_strings")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    rng = random.Random(0)
    records = []
    for i in range(80):
        form = FORMS[i % 4]
        if form == "implicit_strings":
            shared = _say(rng)
            rec = {"chosen": f"{shared} {_say(rng)}", "rejected": f"{shared} {_say(rng)}"}
        else:
            rec = make_pair(rng, form)
        records.append(rec)
    records[5] = {"prompt": "same", "chosen": " answer", "rejected": " answer"}  # identical
    path = tmp_path_factory.mktemp("pref") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path, records


def trl_extract_prompt(rec: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``extract_prompt`` (trl/data_utils.py), written again for the comparison."""
    if "prompt" in rec:
        return rec
    chosen, rejected = rec["chosen"], rec["rejected"]
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":
                idx -= 1
            break
    return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}


def trl_sequences(
    fast: Any, template: str, rec: dict[str, Any]
) -> list[tuple[list[int], list[int]]] | None:
    """(ids, labels) of prompt+chosen and prompt+rejected as TRL's DPOTrainer tokenizes them
    (``prompt_ids + (prompt+response ids)[len(prompt_ids):]``), with labels -100 on the prompt
    and on template tokens outside the assistant's turn (transformers' assistant mask).
    None when a token crosses the prompt's end (TRL then warns and keeps tokens that do not
    spell the text; packcli tokenizes the response after the prompt's tokens)."""
    rec = trl_extract_prompt(rec)
    out = []
    for side in ("chosen", "rejected"):
        if isinstance(rec[side], str):
            prompt_ids = fast(rec["prompt"], add_special_tokens=False)["input_ids"]
            full = fast(rec["prompt"] + rec[side], add_special_tokens=False)["input_ids"]
            mask = [1] * len(full)
        else:
            prompt_ids = fast.apply_chat_template(
                rec["prompt"],
                tokenize=True,
                return_dict=True,
                add_generation_prompt=True,
                chat_template=template,
            )["input_ids"]
            done = fast.apply_chat_template(
                rec["prompt"] + rec[side],
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                chat_template=template,
            )
            full, mask = done["input_ids"], done["assistant_masks"]
        if full[: len(prompt_ids)] != prompt_ids:
            return None
        n = len(prompt_ids)
        ids = prompt_ids + full[n:]
        labels = [-100] * n + [t if m else -100 for t, m in zip(full[n:], mask[n:], strict=True)]
        labels[0] = -100  # every segment starts without loss
        out.append((ids, labels))
    return out


def segments(row: dict[str, Any]) -> list[tuple[int, int, list[int], list[int]]]:
    """(doc id, role, ids, labels) of each segment of a row."""
    out, start = [], 0
    for doc, n, role in zip(row["doc_ids"], row["seq_lengths"], row["seq_roles"], strict=True):
        end = start + n
        out.append((doc, role, row["input_ids"][start:end], row["labels"][start:end]))
        start = end
    return out


def pairs_of(rows: Any) -> dict[int, list[tuple[int, list[int], list[int]]]]:
    """Per doc id, its segments (role, ids, labels), checking that a pair's two sequences are
    adjacent in one row and that no doc id is in two rows."""
    found: dict[int, list[tuple[int, list[int], list[int]]]] = {}
    for row in rows:
        segs = segments(row)
        docs_here = [s[0] for s in segs]
        for k, (doc, role, ids, labels) in enumerate(segs):
            if role == 1:
                assert k + 1 < len(segs) and segs[k + 1][:2] == (doc, 2)
            if role == 2:
                assert k > 0 and segs[k - 1][:2] == (doc, 1)
            assert doc not in found or docs_here.count(doc) == 2  # never in two rows
            found.setdefault(doc, []).append((role, ids, labels))
    return found


def _pack(corpus_path: Path, tok_dir: Path, out: Path, *extra: object) -> dict[str, Any]:
    code, output = invoke("pack", corpus_path, "-t", tok_dir, "-o", out, *ARGS, *extra)
    assert code == 0, output
    return json.loads((out / "packcli.json").read_text())


def test_every_form_packs_as_adjacent_pairs_with_trl_labels(
    corpus: tuple[Path, list[dict[str, Any]]], tok_dir: Path, tok: Tokenizer, tmp_path: Path
) -> None:
    from transformers import PreTrainedTokenizerFast

    path, records = corpus
    out = tmp_path / "out"
    meta = _pack(path, tok_dir, out)
    report = meta["report"]
    pref = report["preference"]
    assert pref["pairs"] == pref["kept_pairs"] == len(records)
    assert pref["implicit_prompt"] == sum("prompt" not in r for r in records)
    assert pref["conversational"] == sum(isinstance(r["chosen"], list) for r in records)
    assert pref["identical"] == 1
    assert report["tiers"]["long"]["segments"] == 2 * len(records)
    template = load_chat_template(None, "chatml").text
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END)
    for config in ("long", "short"):
        rows = datasets.load_dataset(str(out), config, split="train")
        assert rows.features["seq_roles"].feature.dtype == "int8"
        found = pairs_of(rows)
        if config == "long":
            assert sorted(found) == list(range(len(records)))
        crossing = 0
        for doc, segs in found.items():
            assert [s[0] for s in segs] == [1, 2]
            expected = trl_sequences(fast, template, records[doc])
            if expected is None:  # an implicit prompt of strings ending inside a word
                crossing += 1
                assert "prompt" not in records[doc] and isinstance(records[doc]["chosen"], str)
                continue
            assert [(s[1], s[2]) for s in segs] == expected, doc
        if config == "long":
            assert crossing == pref["prompt_retokenized"] < 5
    code, output = invoke("verify", out)
    assert code == 0, output
    assert "input documents encoded again match" in output
    card = (out / "README.md").read_text()
    assert "segment_logps" in card and "preference_pairs" in card  # the DPO snippet
    training = report["training"]["long"]  # pairs per row: a pair is one planned document
    assert training["samples_per_row"] * report["tiers"]["long"]["rows"] == pytest.approx(
        len(records), abs=1e-3 * len(records)
    )


def test_runs_are_byte_identical(
    corpus: tuple[Path, list[dict[str, Any]]], tok_dir: Path, tmp_path: Path
) -> None:
    path, _ = corpus
    metas = [_pack(path, tok_dir, tmp_path / name) for name in ("a", "b")]
    for name in ("long", "short"):
        a = [f["sha256"] for f in metas[0]["files"][name]]
        assert a == [f["sha256"] for f in metas[1]["files"][name]]
        for f in metas[0]["files"][name]:
            assert (tmp_path / "a" / "data" / name / f["file"]).read_bytes() == (
                tmp_path / "b" / "data" / name / f["file"]
            ).read_bytes()


def _rewrite(out: Path, edit: Any) -> None:
    """Apply ``edit`` to the first long file's columns and fix its hash in packcli.json, so
    that only verify's own checks can catch the change."""
    meta = json.loads((out / "packcli.json").read_text())
    entry = meta["files"]["long"][0]
    pfile = out / "data" / "long" / entry["file"]
    schema = pq.read_schema(pfile)
    table = pq.read_table(pfile).to_pydict()
    edit(table)
    pq.write_table(pq.read_table(pfile).from_pydict(table, schema=schema), pfile)
    entry["sha256"] = sha256_file(pfile)
    (out / "packcli.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("swap_roles", "rejected sequence (role 2) does not follow its chosen one"),
        ("prompt_token", "do not start with the same prompt tokens"),
        ("doc_id", "different doc_ids"),
        ("drop_role", "len(seq_roles) != len(seq_lengths)"),
    ],
)
def test_verify_refuses_a_broken_pair(
    corpus: tuple[Path, list[dict[str, Any]]],
    tok_dir: Path,
    tmp_path: Path,
    tamper: str,
    message: str,
) -> None:
    path, _ = corpus
    out = tmp_path / "out"
    _pack(path, tok_dir, out)

    def edit(table: dict[str, list]) -> None:
        roles = table["seq_roles"][0]
        k = roles.index(1)  # the row's first pair: segments k (chosen) and k + 1 (rejected)
        if tamper == "swap_roles":
            roles[k], roles[k + 1] = 2, 1
        elif tamper == "doc_id":
            table["doc_ids"][0][k + 1] += 1
        elif tamper == "drop_role":
            roles.pop()
        else:  # the rejected sequence's second token (a prompt token, label -100)
            at = sum(table["seq_lengths"][0][: k + 1]) + 1
            ids = table["input_ids"][0]
            ids[at] = (ids[at] + 1) % 400

    _rewrite(out, edit)
    code, output = invoke("verify", out)
    assert code == 1 and message in output, output


def overlong_pairs(rng: random.Random) -> list[dict[str, Any]]:
    """One pair of each kind the length limit sees: one that fits, one whose rejected answer
    is too long, one whose prompt alone is, one whose two answers are."""
    prompt = [_msg("user", "What is packing?")]
    short_answer = [_msg("assistant", "the answer")]
    long_answer = [_msg("assistant", " ".join(rng.choice(WORDS) for _ in range(700)))]
    huge_prompt = [_msg("user", " ".join(rng.choice(WORDS) for _ in range(400)))]
    return [
        make_pair(rng, "messages"),
        {"prompt": prompt, "chosen": short_answer, "rejected": long_answer},
        {"prompt": huge_prompt, "chosen": short_answer, "rejected": short_answer},
        {"prompt": prompt, "chosen": long_answer, "rejected": long_answer},
    ]


def test_overlong_pairs_are_dropped_or_truncated_and_counted(
    tok_dir: Path, tok: Tokenizer, tmp_path: Path
) -> None:
    records = overlong_pairs(random.Random(1))
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))

    meta = _pack(path, tok_dir, tmp_path / "drop")
    assert meta["report"]["policy"]["dropped_docs"] == 3
    assert (
        json.loads((tmp_path / "drop" / "packcli.json").read_text())["report"]["preference"][
            "kept_pairs"
        ]
        == 1
    )
    assert invoke("verify", tmp_path / "drop")[0] == 0

    meta = _pack(path, tok_dir, tmp_path / "cut", "--overlong", "truncate")
    pref = meta["report"]["preference"]
    assert pref["truncated"] == 2 and pref["truncate_dropped"] == 1  # the huge prompt
    assert pref["truncated_tokens"] > 0 and pref["kept_pairs"] == 3
    found = pairs_of(datasets.load_dataset(str(tmp_path / "cut"), "long", split="train"))
    template = load_chat_template(None, "chatml").text
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END)
    full_prompt = len(
        fast.apply_chat_template(
            records[1]["prompt"],
            tokenize=True,
            return_dict=True,
            add_generation_prompt=True,
            chat_template=template,
        )["input_ids"]
    )
    for doc in (1, 3):
        (_, c_ids, c_labels), (_, r_ids, r_labels) = found[doc]
        whole = trl_sequences(fast, template, records[doc])
        assert whole is not None
        assert len(c_ids) + len(r_ids) <= 512
        assert c_ids[:full_prompt] == r_ids[:full_prompt] == whole[0][0][:full_prompt]
        for (ids, labels), (w_ids, w_labels) in zip(
            ((c_ids, c_labels), (r_ids, r_labels)), whole, strict=True
        ):
            assert ids == w_ids[: len(ids)] and labels == w_labels[: len(ids)]  # responses cut
    # The short answer keeps all of it, the long one takes the rest of the row exactly.
    (_, c_ids, _), (_, r_ids, _) = found[1]
    assert c_ids == trl_sequences(fast, template, records[1])[0][0]  # type: ignore[index]
    assert len(c_ids) + len(r_ids) == 512
    # Both long answers are cut to the same budget.
    (_, c_ids, _), (_, r_ids, _) = found[3]
    assert len(c_ids) == len(r_ids) == 256
    assert invoke("verify", tmp_path / "cut")[0] == 0


def test_split_is_refused(corpus: tuple[Path, list], tok_dir: Path, tmp_path: Path) -> None:
    code, output = invoke(
        "pack", corpus[0], "-t", tok_dir, "-o", tmp_path / "o", *ARGS, "--overlong", "split"
    )
    assert code == 1 and "a preference pair is never split" in output
    code, output = invoke(
        "pack", corpus[0], "-t", tok_dir, "-o", tmp_path / "o", *ARGS, "--train-on", "all"
    )
    assert code == 1 and "does not apply to preference pairs" in output


BAD = [
    ({"prompt": "p", "chosen": " a"}, "field 'rejected' is missing"),
    ({"prompt": "p", "chosen": [_msg("assistant", "a")], "rejected": " b"}, "all strings or all"),
    ({"prompt": "p", "chosen": "", "rejected": " b"}, "field 'chosen' is empty"),
    ({"prompt": [_msg("user", "q")], "chosen": [], "rejected": [_msg("assistant", "b")]}, "empty"),
    (
        {"prompt": [_msg("user", "q")], "chosen": [_msg("user", "a")], "rejected": []},
        "field 'rejected' is empty",
    ),
    (
        {
            "prompt": [_msg("user", "q")],
            "chosen": [_msg("user", "a")],
            "rejected": [_msg("assistant", "b")],
        },
        "field 'chosen' starts with a user message",
    ),
    (
        {
            "prompt": [_msg("user", "q"), _msg("assistant", "a")],
            "chosen": [_msg("assistant", "b")],
            "rejected": [_msg("assistant", "c")],
        },
        "prompt ends with an assistant message",
    ),
    (
        {
            "chosen": [_msg("user", "q"), _msg("assistant", "a")],
            "rejected": [_msg("user", "Q"), _msg("assistant", "a")],
        },
        "share no prompt",
    ),
    (
        {
            "chosen": [_msg("user", "q"), _msg("assistant", "a"), _msg("user", "x")],
            "rejected": [_msg("user", "q"), _msg("assistant", "a"), _msg("user", "y")],
        },
        "differ at message 3, which in chosen is a user message",
    ),
    (
        {
            "prompt": [_msg("user", "q")],
            "chosen": [_msg("bot", "a")],
            "rejected": [_msg("assistant", "b")],
        },
        "field 'chosen': message 1 has unknown role 'bot'",
    ),
    (["not", "an", "object"], "not a JSON object"),
]


@pytest.mark.parametrize(("record", "reason"), BAD)
def test_bad_records_say_why(record: Any, reason: str) -> None:
    with pytest.raises(ChatFormatError, match=None) as info:
        validate_pair(record)
    assert reason in str(info.value)


def test_forms_validate_as_trl_reads_them() -> None:
    prompt, answer = [_msg("user", "q")], [_msg("assistant", "a")]
    implicit = validate_pair(
        {"chosen": prompt + answer, "rejected": [*prompt, _msg("assistant", "b")]}
    )
    assert implicit == {
        "prompt": prompt,
        "chosen": answer,
        "rejected": [_msg("assistant", "b")],
        "implicit": True,
    }
    # Identical dialogues: the last message is each side's answer (TRL's extract_prompt).
    same = validate_pair({"chosen": prompt + answer, "rejected": prompt + answer})
    assert same["prompt"] == prompt and same["chosen"] == same["rejected"] == answer
    text = validate_pair({"chosen": "The sky is blue.", "rejected": "The sky is green."})
    assert (text["prompt"], text["chosen"], text["rejected"]) == ("The sky is", " blue.", " green.")
    for rec in (
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "ab", "rejected": "ab"},
    ):
        got = validate_pair(rec)
        assert {k: got[k] for k in ("prompt", "chosen", "rejected")} == trl_extract_prompt(rec)


def test_bad_lines_name_file_and_line_or_are_quarantined(tok_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(2)
    good = [make_pair(rng, "messages") for _ in range(3)]
    lines = [good[0], BAD[0][0], good[1], BAD[6][0], good[2]]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, output = invoke("pack", path, "-t", tok_dir, "-o", tmp_path / "e", *ARGS)
    assert code == 1 and f"{path}:2: field 'rejected' is missing" in output
    out = tmp_path / "s"
    meta = _pack(path, tok_dir, out, "--on-bad-line", "skip")
    assert meta["report"]["input"]["rejected"] == {"bad_record": 2}
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [(2, "bad_record"), (4, "bad_record")]
    assert sorted(pairs_of(datasets.load_dataset(str(out), "long", split="train"))) == [0, 1, 2]
    assert invoke("verify", out)[0] == 0


def test_template_that_cannot_separate_the_prompt_follows_the_policy(
    tok_dir: Path, tmp_path: Path
) -> None:
    """A template whose generation prompt is not how it writes the assistant's turn (here it
    opens a think block) cannot tell prompt from response: that pair is a template_error."""
    chatml = load_chat_template(None, "chatml").text
    odd = chatml.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"
    )
    assert odd != chatml
    template = tmp_path / "odd.jinja"
    template.write_text(odd)
    rng = random.Random(3)
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps(make_pair(rng, "strings")) + "\n" + json.dumps(make_pair(rng, "messages")) + "\n"
    )
    args = [a if a != "chatml" else str(template) for a in ARGS]
    code, output = invoke("pack", path, "-t", tok_dir, "-o", tmp_path / "e", *args)
    assert code == 1 and f"{path}:2: the chat template's rendering of prompt + chosen" in output
    out = tmp_path / "s"
    code, output = invoke("pack", path, "-t", tok_dir, "-o", out, *args, "--on-bad-line", "skip")
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["rejected"] == {"template_error": 1}
    assert report["preference"]["kept_pairs"] == 1  # the pair of strings needs no template
    assert invoke("verify", out)[0] == 0


def test_a_token_across_the_prompt_end_keeps_the_prompt_tokens(
    tok_dir: Path, tok: Tokenizer, tmp_path: Path
) -> None:
    """ "tok" + "en" tokenizes as one token: the response is tokenized after the prompt's
    own tokens, so both sides start with them and no character is lost."""
    prompt_ids = tok.encode("tok", add_special_tokens=False).ids
    joint = tok.encode("token", add_special_tokens=False).ids
    assert joint[: len(prompt_ids)] != prompt_ids  # the case under test
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "tok", "chosen": "en", "rejected": " the"}) + "\n")
    out = tmp_path / "o"
    meta = _pack(path, tok_dir, out)
    assert meta["report"]["preference"]["prompt_retokenized"] == 1
    ((_, c_ids, c_labels), (_, r_ids, _)) = pairs_of(
        datasets.load_dataset(str(out), "long", split="train")
    )[0]
    n = len(prompt_ids)
    assert c_ids[:n] == r_ids[:n] == prompt_ids
    assert tok.decode(c_ids) == "token" and tok.decode(r_ids) == "tok the"
    assert c_labels[:n] == [-100] * n and all(x != -100 for x in c_labels[n:])
    assert invoke("verify", out)[0] == 0


def test_bos_and_eos_frame_each_sequence(tok_dir: Path, tok: Tokenizer, tmp_path: Path) -> None:
    """Plain-string pairs with --eos end each response with EOS as TRL adds it (trained);
    --bos starts both sequences (part of the prompt, no loss)."""
    rec = {"prompt": "the weather", "chosen": " is sunny", "rejected": " is 東京"}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    out = tmp_path / "o"
    meta = _pack(path, tok_dir, out, "--eos", EOT, "--bos", "<|im_start|>")
    assert meta["report"]["preference"]["eos_added"] == 2
    assert meta["report"]["preference"]["bos_added"] == 2
    eot, bos = tok.token_to_id(EOT), tok.token_to_id("<|im_start|>")
    ((_, c_ids, c_labels), (_, r_ids, r_labels)) = pairs_of(
        datasets.load_dataset(str(out), "long", split="train")
    )[0]
    for ids, labels, answer in (
        (c_ids, c_labels, rec["chosen"]),
        (r_ids, r_labels, rec["rejected"]),
    ):
        trl = tok.encode(rec["prompt"] + answer + EOT, add_special_tokens=False).ids
        assert ids == [bos, *trl] and ids[-1] == eot
        n_prompt = 1 + len(tok.encode(rec["prompt"], add_special_tokens=False).ids)
        assert labels == [-100] * n_prompt + ids[n_prompt:]
    assert invoke("verify", out)[0] == 0


def test_other_formats_get_no_seq_roles(tok_dir: Path, tmp_path: Path) -> None:
    """Only preference outputs carry the column: chat and text outputs keep their bytes."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [_msg("user", "q"), _msg("assistant", "a")]}) + "\n")
    args = ["--chat-template", "chatml", "-q", "--short-len", "64", "--long-len", "128"]
    code, output = invoke(
        "pack", path, "-t", tok_dir, "-o", tmp_path / "c", "--format", "chat", *args
    )
    assert code == 0, output
    names = pq.read_schema(next((tmp_path / "c" / "data" / "long").glob("*.parquet"))).names
    assert "labels" in names and "seq_roles" not in names
    assert "preference" not in json.loads((tmp_path / "c" / "packcli.json").read_text())["report"]


def test_response_cap_is_the_largest_that_fits() -> None:
    for budget in range(2, 24):
        for rc in range(1, 24):
            for rr in range(1, 24):
                cap = response_cap(budget, rc, rr)

                def used(b: int, rc: int = rc, rr: int = rr) -> int:
                    return min(rc, b) + min(rr, b)

                assert used(cap) <= budget and cap >= 1
                assert used(cap + 1) > budget or cap >= max(rc, rr)


def test_pair_segments_expands_pairs_in_place() -> None:
    docs = np.array([4, 7, 9], dtype=np.int64)
    starts = np.zeros(3, dtype=np.int64)
    lens = np.array([10, 3, 8], dtype=np.int64)
    seg_offsets = np.array([0, 2, 3], dtype=np.int64)  # rows: [4, 7], [9]
    chosen = np.array([6, 0, 5], dtype=np.int64)  # 4 and 9 are pairs, 7 a document
    d, s, n, offs, roles = pair_segments(docs, starts, lens, seg_offsets, chosen)
    assert d.tolist() == [4, 4, 7, 9, 9]
    assert s.tolist() == [0, 6, 0, 0, 5]
    assert n.tolist() == [6, 4, 3, 5, 3]
    assert offs.tolist() == [0, 3, 5]
    assert roles.tolist() == [1, 2, 0, 1, 2]
    with pytest.raises(ValueError, match="not whole"):
        pair_segments(docs, np.array([0, 0, 2]), lens, seg_offsets, chosen)


def test_card_sizes_and_features_match_the_files(
    corpus: tuple[Path, list[dict[str, Any]]], tok_dir: Path, tmp_path: Path
) -> None:
    """The card's ``dataset_info`` counts the ``seq_roles`` column: its bytes are the Arrow
    size of the data (offsets and values; the Parquet reader adds validity bitmaps that the
    data does not need), and ``datasets`` loads the files with the card's features."""
    from packcli.publish.card import _arrow_bytes
    from packcli.publish.marker import TierCounts

    out = tmp_path / "out"
    meta = _pack(corpus[0], tok_dir, out)
    for name in ("long", "short"):
        table = pq.read_table(out / "data" / name).combine_chunks()
        data = 0
        for column in table.columns:
            buffers = column.chunk(0).buffers()  # [validity, offsets, child validity, values]
            data += sum(b.size for k, b in enumerate(buffers) if b is not None and k % 2)
        tier = TierCounts.from_json(meta["report"]["tiers"][name], "packcli.json")
        assert _arrow_bytes(tier, True, True) == data
    card = (out / "README.md").read_text()
    assert "name: seq_roles" in card and "`seq_roles` | list<int8>" in card


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_overlong_pairs_have_one_account_in_policy_and_preference(
    tok_dir: Path, tok: Tokenizer, tmp_path: Path, overlong: str
) -> None:
    """The report's ``policy`` section, its ``preference`` section and the printed lines
    agree on the pairs the length limit cut or dropped, and match a count made here from
    TRL's own tokenization (issue 29 item 13: the policy said 0 / 0 under truncate)."""
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(3)
    records = [*overlong_pairs(rng), make_pair(rng, "messages")]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    code, printed = invoke("pack", path, "-t", tok_dir, "-o", out, *ARGS, "--overlong", overlong)
    assert code == 0, printed
    report = json.loads((out / "packcli.json").read_text())["report"]
    pol, pref = report["policy"], report["preference"]

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END)
    template = load_chat_template(None, "chatml").text
    sizes = []
    for rec in records:
        whole = trl_sequences(fast, template, rec)
        assert whole is not None
        sizes.append(sum(len(ids) for ids, _ in whole))
    over = [n for n in sizes if n > 512]
    written = report["tiers"]["long"]["tokens"]
    assert report["input"]["tokens"] == sum(sizes)  # whatever the policy did to them
    assert pol["truncated_tokens"] + pol["dropped_tokens"] == sum(sizes) - written
    if overlong == "drop":
        assert (pol["dropped_docs"], pol["dropped_tokens"]) == (len(over), sum(over))
        assert pol["truncated_docs"] == 0
    else:  # the huge prompt leaves no room for any response: dropped; the others cut
        assert (pol["dropped_docs"], pol["dropped_tokens"]) == (1, sizes[2])
        assert pol["truncated_docs"] == len(over) - 1 == pref["truncated"]
        assert pol["truncated_tokens"] == pref["truncated_tokens"]
        assert pol["dropped_tokens"] == pref["truncate_dropped_tokens"]
    assert pol["empty_docs"] == 0
    assert pref["kept_pairs"] == len(records) - pol["dropped_docs"] - pref["no_trainable"]
    assert (
        f"{pol['dropped_docs']:,} too long ({pol['dropped_tokens']:,} tokens); "
        f"truncated {pol['truncated_docs']:,} ({pol['truncated_tokens']:,} tokens removed)"
    ) in printed
    assert f"truncated {pol['truncated_docs']:,} documents" in printed
    assert invoke("verify", out)[0] == 0
