"""``verify`` (and ``push``, through the same checks) on outputs that are wrong without being
damaged: a shard edited in place, a figure of ``packcli.json`` that does not describe the data,
and outputs on object storage (tests/s3local.py), whose messages must name the URL."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from corpora import mixed_corpus, write_corpus
from s3local import cfg, local_hashes, upload

from packcli import fs as packfs
from packcli.tokenize.shards import sha256_file

SMALL = ["--short-len", "64", "--long-len", "1024", "-q"]
FILE_KEYS = ("bytes", "file", "rows", "sha256", "tokens")


def pack_args(corpus: Path, tok: Path, out: Path | str, *more: str) -> list[Any]:
    return ["pack", corpus, "-t", tok, "-o", out, *SMALL, *more]


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_corpus(tmp_path_factory.mktemp("corpus") / "c.jsonl", 250, 3)


@pytest.fixture(scope="module")
def packed(
    text_corpus: Path, toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("packed") / "out"
    invoke_ok(*pack_args(text_corpus, toy_tokenizer_path, out))
    return out


@pytest.fixture
def out(packed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(packed, copy)
    return copy


def flip_token(data: bytes, *, at: float = 0.5) -> bytes:
    """The shard's bytes with one token id changed (another valid id), the file otherwise
    untouched: still valid Arrow, the same size."""
    raw = bytearray(data)
    buf = pa.py_buffer(raw)
    batch = pa.ipc.open_file(pa.BufferReader(buf)).get_batch(0)
    values = batch.column("input_ids").values
    start = values.buffers()[1].address - buf.address + 4 * values.offset
    k = int(len(values) * at)
    pos = start + 4 * k
    token = int.from_bytes(raw[pos : pos + 4], "little")
    raw[pos : pos + 4] = (token + 1 if token < 100 else token - 1).to_bytes(4, "little")
    assert len(raw) == len(data) and raw != data
    pa.ipc.open_file(pa.BufferReader(pa.py_buffer(bytes(raw)))).read_all().validate(full=True)
    return bytes(raw)


# --------------------------------------------------------------------------- item 4: shards


def test_a_shard_edited_in_place_is_named_by_verify_and_tokenized_again(
    out: Path, text_corpus: Path, toy_tokenizer_path: Path
) -> None:
    before = local_hashes(out)
    (shard,) = (out / ".packcli" / "tokens" / "files").glob("*/shard-*.arrow")
    original = shard.read_bytes()
    shard.write_bytes(flip_token(original))
    code, output = invoke("verify", out)
    assert code == 1, output
    assert str(shard) in output and "tokenized shard changed since it was written" in output
    # The rerun does not reuse it: its unit is tokenized again, so the Parquet files written
    # again (here: deleted first) hold the original tokens, not the edited ones.
    for parquet in (out / "data").rglob("*.parquet"):
        parquet.unlink()
    again = invoke_ok(*pack_args(text_corpus, toy_tokenizer_path, out)[:-1])
    assert "reused tokenized shards" not in again
    assert shard.read_bytes() == original
    assert local_hashes(out) == before
    assert "against the tokenized shards" in invoke_ok("verify", out)


# --------------------------------------------------------------------------- item 16: messages


def test_verify_no_shards_says_they_were_skipped_not_absent(out: Path) -> None:
    output = invoke_ok("verify", out, "--no-shards")
    assert "not present" not in output
    assert "skipped on request" in output and "--no-shards" in output
    shutil.rmtree(out / ".packcli")
    output = invoke_ok("verify", out)
    assert "tokenized shards not present" in output


# --------------------------------------------------------------------------- object storage


@pytest.fixture
def on_store(
    s3: dict[str, str], corpus: Path, toy_tokenizer_path: Path, bucket: str
) -> tuple[str, str]:
    """An output and its work folder, both on the store (s3local's corpus, one file)."""
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    out, work = f"s3://{bucket}/out", f"s3://{bucket}/work"
    invoke_ok(
        "pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, "--work-dir", work,
        *cfg(corpus),
    )  # fmt: skip
    return out, work


def test_remote_verify_names_the_edited_shard_and_the_urls(on_store: tuple[str, str]) -> None:
    """The work folder on the store: verify fetches the shards and checks each one's sha256;
    every message, OK or not, names the output's and the work folder's URLs."""
    out, work = on_store
    output = invoke_ok("verify", out)
    assert f"output {out};" in output and f"in {work}/tokens" in output
    assert "packcli-verify-" not in output  # the temp copies are never named
    summary = json.loads(invoke_ok("verify", out, "--json"))
    assert "packcli-verify-" not in json.dumps(summary) and work in summary["shards"]
    fs, prefix = packfs.locate(work)
    shard = sorted(p for p in fs.find(f"{prefix}/tokens") if p.endswith(".arrow"))[0]
    fs.pipe_file(shard, flip_token(bytes(fs.cat_file(shard))))
    code, output = invoke("verify", out)
    assert code == 1, output
    assert f"s3://{shard}: tokenized shard changed since it was written" in output, output
    assert "packcli-verify-" not in output
    output = invoke_ok("verify", out, "--no-shards")
    assert "skipped on request" in output and f"output {out};" in output


# --------------------------------------------------------------------------- item 11: push


def fix_up(out: Path, config: str, path: Path) -> None:
    """Make packcli.json vouch for ``path`` as it is now (sha256 and size): a forgery that
    only the data's own checks can see through."""
    meta = json.loads((out / "packcli.json").read_text())
    entry = next(f for f in meta["files"][config] if f["file"] == path.name)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))


def alter_a_long_document(out: Path, short_len: int = 64) -> Path:
    """One token changed inside a long document of the long config (not in a short pack, so
    the configs still agree), the file's entry in packcli.json fixed up."""
    path = sorted((out / "data" / "long").glob("*.parquet"))[0]
    table = pq.read_table(path)
    data = table.to_pydict()
    row, seg = next(
        (r, i)
        for r, lens in enumerate(data["seq_lengths"])
        for i, n in enumerate(lens)
        if n > short_len
    )
    at = sum(data["seq_lengths"][row][:seg]) + 5
    data["input_ids"][row][at] = (data["input_ids"][row][at] + 1) % 300
    pq.write_table(pa.Table.from_pydict(data, schema=table.schema), path)
    fix_up(out, "long", path)
    return path


def test_push_refuses_what_verify_refuses(
    text_corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "c.jsonl"
    shutil.copy(text_corpus, corpus)
    out = tmp_path / "out"
    invoke_ok(*pack_args(corpus, toy_tokenizer_path, out))
    alter_a_long_document(out)
    os.utime(corpus, (1, 1))  # the input changed since: verify cannot encode it again
    code, output = invoke("verify", out)
    assert code == 1 and "differ from the tokenized shards" in output, output
    code, output = invoke("push", out, "me/packed", "--dry-run")
    assert code == 1, output
    assert "refusing to push" in output and "differ from the tokenized shards" in output


# --------------------------------------------------------------------------- item 14: URLs


def test_stats_and_inspect_read_an_output_on_the_store(
    s3: dict[str, str], corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    url = f"s3://{bucket}/out/wc"
    local = tmp_path / "local"
    for out in (url, local):
        invoke_ok("pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus))
    numbers = json.loads(invoke_ok("stats", url, "--json"))
    assert numbers == json.loads(invoke_ok("stats", local, "--json", "--no-plots"))
    assert "plots: not written for" in invoke_ok("stats", url)
    listed = packfs.locate(url)[0].find(f"{bucket}/out/wc")
    assert not any("/stats/" in p for p in listed)  # the store is only read
    for config, row in (("long", 0), ("short", 3)):
        args = ["--config", config, "--row", row, "--json"]
        assert invoke_ok("inspect", url, *args) == invoke_ok("inspect", local, *args)
    code, output = invoke("stats", f"s3://{bucket}/out/nothing")
    assert code == 1 and f"s3://{bucket}/out/nothing: no packcli.json" in output, output
    code, output = invoke("inspect", f"s3://{bucket}/out/nothing", "--row", 0)
    assert code == 1 and f"s3://{bucket}/out/nothing: no packcli.json" in output, output
    code, output = invoke("inspect", url, "--row", 10**6)
    assert code == 1 and "row 1000000 does not exist" in output


# --------------------------------------------------------------------------- item 12: figures

# Every figure the text output's packcli.json states (``files`` and ``report``) but those that
# no data determines (``figures.UNCHECKED``): each one edited alone must fail verify.
POLICY = "dropped_docs dropped_tokens empty_docs split_docs split_pieces split_tokens"
TIER = "capacity efficiency lower_bound_rows max_row_tokens rows rows_over_bound segments tokens"
TRAINING = (
    "documents_per_step rows_per_step samples_per_row steps_per_epoch tokens_per_row "
    "unpacked_batch_size unpacked_steps_per_epoch"
)
TEXT_FIGURES = [
    *(f"files.{c}[0].{k}" for c in ("long", "short") for k in FILE_KEYS),
    "report.chat",
    *(f"report.documents_by_length.{k}" for k in ("empty", "long", "overlong", "short")),
    *(
        f"report.input.{k}"
        for k in ("blank_lines", "bytes", "documents", "files", "rejected", "rejected_lines")
    ),
    "report.input.tokens",
    *(f"report.largest_document.{k}" for k in ("doc_id", "file", "line", "tokens")),
    *(f"report.policy.{k}" for k in [*POLICY.split(), "truncated_docs", "truncated_tokens"]),
    "report.tiers.long.attention_balance.ratio",
    *(f"report.tiers.{c}.{k}" for c in ("long", "short") for k in TIER.split()),
    "report.tokenizer.special_strings.by_token",
    "report.tokenizer.special_strings.occurrences",
    *(f"report.training.{c}.{k}" for c in ("long", "short") for k in TRAINING.split()),
]


def _edited(value: Any) -> Any:
    """Another value of the same kind (packcli.json stays valid)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.01 + 0.01
    if isinstance(value, str):
        return value + "0"
    if value is None or value == {}:
        return {"x": 1}
    raise AssertionError(f"no edit for {value!r}")


def _at(meta: dict[str, Any], key: str) -> tuple[Any, str]:
    """The container holding ``key`` (dotted, ``[i]`` for list items) and its last part."""
    parts = key.replace("[", ".[").split(".")
    node: Any = meta
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    return node, parts[-1]


def test_every_figure_is_checked_or_listed_as_unchecked(packed: Path) -> None:
    from packcli.publish.figures import flatten, unchecked

    meta = json.loads((packed / "packcli.json").read_text())
    stated = [k for k, _ in flatten({k: meta[k] for k in ("files", "report")})]
    assert sorted(k for k in stated if not unchecked(k, with_shards=True)) == sorted(TEXT_FIGURES)


@pytest.mark.parametrize("key", TEXT_FIGURES)
def test_verify_names_each_figure_of_packcli_json_that_the_data_does_not_give(
    out: Path, key: str
) -> None:
    meta = json.loads((out / "packcli.json").read_text())
    node, last = _at(meta, key)
    node[last] = _edited(node[last])
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))
    code, output = invoke("verify", out)
    assert code == 1, output
    assert key in output, output


def test_the_quarantine_counts_are_checked_against_rejected_jsonl(
    s3: dict[str, str], toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    corpus = tmp_path / "in" / "c.jsonl"
    corpus.parent.mkdir()
    write_corpus(corpus, [5, 80, 7, 30] * 20, seed=4)
    with open(corpus, "a") as fh:
        fh.write('{"text": 3}\nnot json\n{"id": 1}\n')
    args = ["--on-bad-line", "skip"]
    local = tmp_path / "out"
    invoke_ok(*pack_args(corpus, toy_tokenizer_path, local, *args))
    url = f"s3://{bucket}/out"
    invoke_ok(*pack_args(corpus, toy_tokenizer_path, url, *args))
    for out in (local, url):  # a remote verify reads the quarantine too
        assert "all invariants hold" in invoke_ok("verify", out)
    rejected = local / "rejected.jsonl"
    lines = rejected.read_text().splitlines(keepends=True)
    assert len(lines) == 3
    rejected.write_text("".join(lines[:2]))
    code, output = invoke("verify", local)
    assert code == 1 and "report.input.rejected" in output, output
    # Without the quarantine, the counts are checked against the tokenize stage's index.
    rejected.unlink()
    assert "all invariants hold" in invoke_ok("verify", local)
    meta = json.loads((local / "packcli.json").read_text())
    meta["report"]["input"]["rejected_lines"] -= 1
    (local / "packcli.json").write_text(json.dumps(meta))
    code, output = invoke("verify", local)
    assert code == 1 and "report.input.rejected_lines" in output, output


def _uncovered(out: Path) -> list[str]:
    """Figures the output's packcli.json states that verify neither checked nor lists as
    unchecked."""
    from packcli.publish.figures import flatten, unchecked

    meta = json.loads((out / "packcli.json").read_text())
    checked = set(json.loads(invoke_ok("verify", out, "--json"))["figures_checked"])
    return [
        k
        for k, _ in flatten({k: meta[k] for k in ("files", "report")})
        if k not in checked and not unchecked(k, with_shards=True)
    ]


@pytest.mark.parametrize("form", ["chat", "preference"])
def test_chat_and_preference_figures_are_all_checked(
    form: str, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "in.jsonl"
    with open(path, "w") as fh:
        for i in range(12):
            if form == "chat":
                turns = [
                    {"role": "user", "content": f"question {i} " * (1 + i % 5)},
                    {"role": "assistant", "content": "an answer " * (1 + i * 7 % 40)},
                ]
                fh.write(json.dumps({"messages": turns}) + "\n")
            else:
                pair = {"prompt": f"say {i}", "chosen": "yes " * (1 + i % 9), "rejected": "no"}
                fh.write(json.dumps(pair) + "\n")
    out = tmp_path / "out"
    more = ["--chat-template", "chatml"] if form == "chat" else []
    invoke_ok(*pack_args(path, toy_tokenizer_path, out, "--format", form, *more))
    assert _uncovered(out) == []
    meta = json.loads((out / "packcli.json").read_text())
    key = "report.chat.dialogues" if form == "chat" else "report.preference.kept_pairs"
    node, last = _at(meta, key)
    node[last] += 1
    (out / "packcli.json").write_text(json.dumps(meta))
    code, output = invoke("verify", out)
    assert code == 1 and key in output, output
