"""Columnar inputs (Parquet, Arrow IPC, save_to_disk folders, Hub datasets): the same
documents give the same Parquet bytes as jsonl, however the files are split into units."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import data_hashes, invoke, invoke_ok, run_process
from corpora import hub_cache, mixed_lengths, random_text
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from packcli.errors import InputError
from packcli.read import (
    BadLineError,
    ReadOptions,
    ReadStats,
    RejectSink,
    group_ranges,
    iter_columnar,
    parse_hub_spec,
    resolve_inputs,
)

CFG = "plan:\n  short_len: 64\n  long_len: 1024\nwrite:\n  shard_tokens: 6000\n"


def documents(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"text": random_text(rng, k), "id": i} for i, k in enumerate(mixed_lengths(n, seed))]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_arrow(path: Path, rows: list[dict[str, Any]], *, stream: bool, per_batch: int) -> None:
    table = pa.Table.from_pylist(rows)
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=per_batch):
            writer.write_batch(batch)


def write_as(kind: str, folder: Path, parts: list[list[dict[str, Any]]]) -> Path:
    """The parts as files of ``kind`` in ``folder`` (several row groups / batches each);
    returns the input spec."""
    folder.mkdir()
    if kind == "hf-disk":
        import datasets

        rows = [row for part in parts for row in part]
        datasets.Dataset.from_list(rows).save_to_disk(str(folder / "ds"), num_shards=3)
        return folder / "ds"
    for i, part in enumerate(parts):
        if kind == "jsonl":
            write_jsonl(folder / f"p{i}.jsonl", part)
        elif kind == "parquet":
            pq.write_table(pa.Table.from_pylist(part), folder / f"p{i}.parquet", row_group_size=9)
        else:
            stream = kind == "arrow-stream"
            write_arrow(folder / f"p{i}.arrow", part, stream=stream, per_batch=9)
    return folder


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(CFG)
    return path


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream", "hf-disk"])
def test_columnar_input_gives_the_jsonl_bytes(
    kind: str, toy_tokenizer_path: Path, tmp_path: Path, cfg: Path
) -> None:
    docs = documents(200, seed=3)
    parts = [docs[0:70], docs[70:71], docs[71:]]
    jsonl = write_as("jsonl", tmp_path / "j", parts)
    other = write_as(kind, tmp_path / "x", parts)
    args = ["-t", toy_tokenizer_path, "-c", cfg, "-q"]
    invoke_ok("pack", jsonl, "-o", tmp_path / "oj", *args)
    invoke_ok("pack", other, "-o", tmp_path / "ox", *args)
    want = data_hashes(tmp_path / "oj")
    assert len(want) > 2 and data_hashes(tmp_path / "ox") == want
    # verify reads the first input file again (Parquet/Arrow here) and encodes it with HF.
    first = 67 if kind == "hf-disk" else 70  # save_to_disk: 200 rows in 3 even shards
    assert f"{first} input documents encoded again match" in invoke_ok("verify", tmp_path / "ox")
    report = json.loads((tmp_path / "ox" / "packcli.json").read_text())["report"]
    longest = max(range(len(docs)), key=lambda i: len(docs[i]["text"].split()))
    assert report["largest_document"]["doc_id"] == longest
    if kind != "hf-disk":  # the longest document's row in its file, counted from 0
        assert report["largest_document"]["row"] == (longest if longest < 70 else longest - 71)


def test_chat_parquet_gives_the_jsonl_bytes(tmp_path: Path) -> None:
    tok = _chat_tokenizer(tmp_path / "tok")
    rng = random.Random(1)
    words = ["the", "answer", "question", "東京", "🙂", "is", "sunny"]

    def say() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))

    rows = []
    for i in range(60):
        turns = [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]
        rows.append({"messages": turns * rng.randint(1, 3), "id": i})
    jsonl = write_as("jsonl", tmp_path / "j", [rows[:25], rows[25:]])
    parquet = write_as("parquet", tmp_path / "p", [rows[:25], rows[25:]])
    args = ["-t", tok, "--format", "chat", "--chat-template", "chatml", "--short-len", "64"]
    args += ["--long-len", "256", "-q"]
    invoke_ok("pack", jsonl, "-o", tmp_path / "oj", *args)
    invoke_ok("pack", parquet, "-o", tmp_path / "op", *args)
    assert data_hashes(tmp_path / "op") == data_hashes(tmp_path / "oj")
    assert "25 input documents encoded again match" in invoke_ok("verify", tmp_path / "op")


def _chat_tokenizer(folder: Path) -> Path:
    folder.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the answer question is sunny user assistant"] * 50, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


@pytest.fixture
def tiny_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Units of any size (real runs refuse --split-bytes under 1 MiB), and no grouping of
    small files, so a few KB of Parquet make several row-group units."""
    monkeypatch.setattr("packcli.config.MIN_SPLIT_BYTES", 1)
    monkeypatch.setattr("packcli.stages.units.GROUP_BYTES", 1)


@pytest.mark.usefixtures("tiny_units")
@pytest.mark.parametrize("kind", ["parquet", "arrow-stream", "arrow-file"])
def test_row_group_units_across_tasks_give_identical_bytes(
    kind: str, toy_tokenizer_path: Path, tmp_path: Path, cfg: Path
) -> None:
    docs = documents(300, seed=8)
    parts = [docs[:120], docs[120:130], docs[130:]]
    jsonl = write_as("jsonl", tmp_path / "j", parts)
    parquet = write_as(kind, tmp_path / "p", parts)
    args = ["-t", toy_tokenizer_path, "-c", cfg, "-q"]
    invoke_ok("pack", jsonl, "-o", tmp_path / "ref", *args)
    out = tmp_path / "split"
    invoke_ok("pack", parquet, "-o", out, *args, "--split-bytes", 4000, "--num-tasks", 3)
    units = json.loads((out / ".packcli/tokens/stage.json").read_text())["units"]
    ranges = [u["row_groups"] for u in units if u["row_groups"]]
    fmt = "parquet" if kind == "parquet" else "arrow"
    assert len(ranges) >= 4 and all(u["format"] == fmt for u in units)
    assert data_hashes(out) == data_hashes(tmp_path / "ref")
    # As separate tokenize tasks, then the other stages: the same bytes again.
    tasks = tmp_path / "tasks"
    tok_args = ["tokenize", parquet, "-o", tasks, *args, "--split-bytes", 4000]
    for index in (2, 0, 1):
        invoke_ok(*tok_args, "--task-index", index, "--num-tasks", 3)
    invoke_ok("plan", "-o", tasks, "-c", cfg, "-q")
    invoke_ok("write", "-o", tasks, "-c", cfg, "-q")
    invoke_ok("finalize", "-o", tasks)
    assert data_hashes(tasks) == data_hashes(tmp_path / "ref")
    # Provenance across units: the longest document's row in its file.
    longest = max(range(len(docs)), key=lambda i: len(docs[i]["text"].split()))
    largest = json.loads((out / "packcli.json").read_text())["report"]["largest_document"]
    file_start = 0 if longest < 120 else 120 if longest < 130 else 130
    suffix = ".parquet" if kind == "parquet" else ".arrow"
    assert (Path(largest["file"]).name, largest["row"]) == (
        f"p{[0, 120, 130].index(file_start)}{suffix}",
        longest - file_start,
    )


def _bad_parquet(path: Path) -> list[Any]:
    """Rows 0..39, bad at 5 (null), 17 (empty), 33 (null): row groups of 8 rows."""
    texts: list[Any] = [f"document number {i}" for i in range(40)]
    texts[5] = texts[33] = None
    texts[17] = ""
    pq.write_table(pa.table({"text": texts, "n": list(range(40))}), path, row_group_size=8)
    return texts


def test_bad_records_name_file_and_row(toy_tokenizer_path: Path, tmp_path: Path, cfg: Path) -> None:
    path = tmp_path / "in" / "bad.parquet"
    path.parent.mkdir()
    _bad_parquet(path)
    args = ["pack", path, "-t", toy_tokenizer_path, "-c", cfg, "-q"]
    code, output = invoke(*args, "-o", tmp_path / "o1")
    assert code == 1
    assert output.strip() == (f"error: {path}: row 5: field 'text' is not a string (got null)"), (
        output
    )
    out = tmp_path / "o2"
    invoke_ok(*args, "-o", out, "--on-bad-line", "skip")
    report = json.loads((out / "packcli.json").read_text())["report"]["input"]
    assert report["documents"] == 37
    assert report["rejected"] == {"empty_text": 1, "not_string": 2}
    rejects = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"], r["reason"]) for r in rejects] == [
        (str(path), 5, "not_string"),
        (str(path), 17, "empty_text"),
        (str(path), 33, "not_string"),
    ]
    assert json.loads(base64.b64decode(rejects[1]["raw_b64"])) == {"text": ""}


@pytest.mark.usefixtures("tiny_units")
def test_bad_record_in_a_later_row_group_unit_names_the_files_row(
    toy_tokenizer_path: Path, tmp_path: Path, cfg: Path
) -> None:
    path = tmp_path / "in" / "bad.parquet"
    path.parent.mkdir()
    _bad_parquet(path)
    args = ["pack", path, "-t", toy_tokenizer_path, "-c", cfg, "-q", "--split-bytes", 1]
    code, output = invoke(*args, "-o", tmp_path / "o1", "--num-tasks", 2)
    # Whichever unit a task reaches first, the row is the file's own (5, 17 or 33), never
    # one counted from the unit's start.
    assert code == 1 and re.search(rf"{re.escape(str(path))}: row (5|17|33):", output), output
    out = tmp_path / "o2"
    invoke_ok(*args, "-o", out, "--on-bad-line", "skip")
    assert len(json.loads((out / ".packcli/tokens/stage.json").read_text())["units"]) == 5
    rejects = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [5, 17, 33]


def test_reader_counts_rows_and_batches_like_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    texts = _bad_parquet(path)
    stats = ReadStats()
    with RejectSink(tmp_path / "rejected.jsonl") as sink:
        batches = list(
            iter_columnar(
                [path], "parquet", "text", ReadOptions(10, on_bad_line="skip", rejects=sink), stats
            )
        )
    assert [len(b.texts) for b in batches] == [10, 10, 10, 7]
    got = [(int(r), t) for b in batches for r, t in zip(b.position, b.texts, strict=True)]
    assert got == [(i, t) for i, t in enumerate(texts) if t]
    assert (stats.documents, stats.lines, stats.files) == (37, 40, 1)
    # A range of row groups: rows count from the range, errors name the file's row.
    stats = ReadStats()
    batches = list(iter_columnar([path], "parquet", "text", ReadOptions(100), stats, groups=(1, 2)))
    assert stats.rows_before == 8 and batches[0].position.tolist() == list(range(8))
    assert batches[0].texts == texts[8:16]
    with pytest.raises(BadLineError, match=r"row 33: field 'text'") as info:
        list(iter_columnar([path], "parquet", "text", ReadOptions(100), groups=(4, 5)))
    assert (info.value.line, info.value.reason) == (33, "not_string")


def test_parquet_is_streamed_not_loaded(tmp_path: Path) -> None:
    """One row group of 48 MB of text (uncompressed): reading it holds about a page and a
    batch (8 MB measured), not the column chunk (pyarrow's defaults hold all of it)."""
    path = tmp_path / "big.parquet"
    texts = [f"{i:08d} " + "x" * 3000 for i in range(16000)]
    pq.write_table(pa.table({"text": texts}), path, compression="none", row_group_size=10**6)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    peak = n = 0
    for batch in iter_columnar([path], "parquet", "text", ReadOptions(256)):
        peak = max(peak, pa.total_allocated_bytes())
        assert batch.texts[0] == texts[n]
        n += len(batch.texts)
    assert n == len(texts) and peak < 12 << 20


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream"])
def test_missing_column_lists_the_columns(
    kind: str, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    folder = write_as(kind, tmp_path / "in", [[{"content": "x", "url": "u"}]])
    code, output = invoke("pack", folder, "-t", toy_tokenizer_path, "-o", tmp_path / "out")
    name = "p0.parquet" if kind == "parquet" else "p0.arrow"
    assert code == 1
    assert output.strip() == (
        f"error: {folder / name}: no column 'text' (its columns: content, url); "
        "pass --text-field COLUMN"
    )
    assert not (tmp_path / "out").exists()  # refused before anything was written
    code, output = invoke(
        "pack", folder, "-t", toy_tokenizer_path, "-o", tmp_path / "out", "--format", "chat"
    )
    assert code == 1 and "no column 'messages'" in output and "--messages-field" in output


def test_group_ranges() -> None:
    groups = [(10, 400), (10, 400), (10, 900), (10, 2000), (10, 100), (10, 100)]
    assert group_ranges(groups, 1000) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert group_ranges(groups, 10**9) == [(0, 6)]
    assert group_ranges([], 5) == [(0, 0)]


def test_parse_hub_spec() -> None:
    spec = parse_hub_spec("hf-dataset:HuggingFaceFW/fineweb-edu/sample/10BT")
    assert (spec.repo_id, spec.revision, spec.path) == (
        "HuggingFaceFW/fineweb-edu",
        None,
        "sample/10BT",
    )
    spec = parse_hub_spec("o/n@refs/convert/parquet/default/train/*.parquet")
    assert (spec.repo_id, spec.revision, spec.path) == (
        "o/n",
        "refs/convert/parquet",
        "default/train/*.parquet",
    )
    assert parse_hub_spec("hf-dataset:o/n@v1.0").revision == "v1.0"
    for bad in ("hf-dataset:onlyname", "hf-dataset:/n", "o/n@", "hf-dataset:o/"):
        with pytest.raises(InputError, match="OWNER/NAME"):
            parse_hub_spec(bad)


def test_resolve_formats_and_saved_datasets(tmp_path: Path) -> None:
    import datasets

    (tmp_path / "mix").mkdir()
    (tmp_path / "j").mkdir()
    write_jsonl(tmp_path / "mix" / "a.jsonl", [{"text": "x"}])
    write_jsonl(tmp_path / "j" / "a.jsonl", [{"text": "x"}])
    pq.write_table(pa.table({"text": ["y"]}), tmp_path / "mix" / "b.parquet")
    (tmp_path / "mix" / "c.bin").write_bytes(b"")
    (tmp_path / "mix" / "state.json").write_text('{"step": 3}')  # not a saved dataset
    names = lambda paths: [p.name for p in paths]  # noqa: E731
    assert names(resolve_inputs([str(tmp_path / "mix")])) == ["a.jsonl", "b.parquet"]
    assert names(resolve_inputs([str(tmp_path / "mix")], input_format="parquet")) == ["b.parquet"]
    assert names(resolve_inputs([str(tmp_path / "mix")], input_format="jsonl")) == ["a.jsonl"]
    forced = resolve_inputs([str(tmp_path / "mix" / "c.bin")], input_format="parquet")
    assert names(forced) == ["c.bin"]
    with pytest.raises(InputError, match=r"c\.bin.*\.parquet.*--input-format"):
        resolve_inputs([str(tmp_path / "mix" / "c.bin")])

    # A save_to_disk folder: its files as state.json orders them, not by name.
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": [str(i) for i in range(30)]}).save_to_disk(
        str(saved), num_shards=3
    )
    state = json.loads((saved / "state.json").read_text())
    state["_data_files"].reverse()
    (saved / "state.json").write_text(json.dumps(state))
    want = [f["filename"] for f in state["_data_files"]]
    assert names(resolve_inputs([str(saved)])) == want
    assert names(resolve_inputs([str(saved)], input_format="hf-disk")) == want
    with pytest.raises(InputError, match=r"mix/state\.json: not a datasets state\.json"):
        resolve_inputs([str(tmp_path / "mix")], input_format="hf-disk")
    with pytest.raises(InputError, match=r"not a datasets save_to_disk folder \(no state\.json"):
        resolve_inputs([str(tmp_path / "j")], input_format="hf-disk")
    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a"]}),
            "test": datasets.Dataset.from_dict({"text": ["b"]}),
        }
    ).save_to_disk(str(dd))
    with pytest.raises(InputError, match=r"DatasetDict \(splits: train, test\).*dd/train"):
        resolve_inputs([str(dd)])


# --------------------------------------------------------------------------- Hub datasets


def test_hub_dataset_from_the_offline_cache(
    toy_tokenizer_path: Path, tmp_path: Path, cfg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    docs = documents(120, seed=5)
    parts = [docs[:50], docs[50:]]
    jsonl = write_as("jsonl", tmp_path / "j", parts)
    parquet = write_as("parquet", tmp_path / "p", parts)
    files = {f"data/p{i}.parquet": (parquet / f"p{i}.parquet").read_bytes() for i in range(2)}
    files["README.md"] = b"---\nlicense: mit\n---\n"
    files["other/notes.parquet"] = files["data/p0.parquet"]
    files.update({f"json/p{i}.jsonl": (jsonl / f"p{i}.jsonl").read_bytes() for i in range(2)})
    cache = tmp_path / "hub"
    commit = hub_cache(cache, "datasets", "packcli/tiny", files)
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # conftest: never the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    args = ["-t", toy_tokenizer_path, "-c", cfg, "-q"]
    invoke_ok("pack", jsonl, "-o", tmp_path / "ref", *args)
    out = tmp_path / "hub-out"
    invoke_ok("pack", "hf-dataset:packcli/tiny/data", "-o", out, *args)
    assert data_hashes(out) == data_hashes(tmp_path / "ref")
    inputs = json.loads((out / "packcli.json").read_text())["run"]["inputs"]
    # Provenance names the snapshot's files, not the cache's content-addressed blobs.
    snapshot = cache / "datasets--packcli--tiny" / "snapshots" / commit
    assert [i["path"] for i in inputs] == [str(snapshot / f"data/p{i}.parquet") for i in range(2)]
    assert "50 input documents encoded again match" in invoke_ok("verify", out)
    # --input-format hub takes the id without the prefix; the same bytes.
    out2 = tmp_path / "hub-out2"
    invoke_ok("pack", "packcli/tiny@main/data", "--input-format", "hub", "-o", out2, *args)
    assert data_hashes(out2) == data_hashes(out)
    # jsonl files of a Hub dataset: read by their names, not their blobs' (no suffix).
    out3 = tmp_path / "hub-jsonl"
    invoke_ok("pack", "hf-dataset:packcli/tiny/json", "-o", out3, *args)
    assert data_hashes(out3) == data_hashes(out)
    code, output = invoke("pack", "hf-dataset:packcli/absent", "-o", tmp_path / "o3", *args)
    assert code == 1 and output.startswith("error: Hub dataset 'packcli/absent': ")


# --------------------------------------------------------------------------- crash safety

TINY_UNITS = (
    "import sys, packcli.config as c, packcli.stages.units as p; c.MIN_SPLIT_BYTES = 1; "
    "p.GROUP_BYTES = 1; from packcli.cli import main; main()"
)


def test_killed_run_over_row_group_units_resumes_to_identical_output(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    docs = documents(400, seed=5)
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(docs), parquet, row_group_size=20)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "read:\n  batch_size: 16\n  split_bytes: 30000\ntokenize:\n  shard_tokens: 4096\n" + CFG
    )

    def run(out: Path, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        args = ["-v", "pack", parquet, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q"]
        return run_process(args, crash=crash, entry=TINY_UNITS)

    assert run(tmp_path / "ref").returncode == 0
    out = tmp_path / "out"
    killed = run(out, crash="tokenize:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    units = json.loads((out / ".packcli/tokens/stage.json").read_text())["units"]
    done = [(out / ".packcli/tokens/files" / u["key"] / "_SUCCESS.json").exists() for u in units]
    assert len(units) >= 3 and done[0] and not all(done)
    again = run(out)
    assert again.returncode == 0, again.stderr
    assert data_hashes(out) == data_hashes(tmp_path / "ref")
    ref = json.loads((tmp_path / "ref" / "packcli.json").read_text())["report"]
    assert json.loads((out / "packcli.json").read_text())["report"] == ref
    # An input changed since: its units are tokenized again.
    pq.write_table(pa.Table.from_pylist(docs[:-1]), parquet, row_group_size=20)
    again = run(out)
    assert again.returncode == 0, again.stderr
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["documents"] == 399


@pytest.mark.usefixtures("tiny_units")
def test_bad_dialogues_name_the_files_row(tmp_path: Path) -> None:
    """A malformed dialogue (``bad_record``) and one the template refuses (``template_error``,
    found while tokenizing, after reading) both name the file's own row, in a later unit."""
    from packcli.chat import load_chat_template

    tok = _chat_tokenizer(tmp_path / "tok")
    template = tmp_path / "picky.jinja"
    template.write_text(
        "{% if messages | length > 2 %}{{ raise_exception('at most one exchange') }}{% endif %}"
        + load_chat_template(None, "chatml").text
    )
    one = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rows: list[Any] = [one] * 20
    rows[9] = one * 2  # the template refuses it
    rows[14] = [{"role": "robot", "content": "beep"}]  # not a dialogue
    path = tmp_path / "in" / "c.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"messages": rows}), path, row_group_size=4)
    args = ["pack", path, "-t", tok, "--format", "chat", "--chat-template", template, "-q"]
    args += ["--short-len", "64", "--long-len", "256", "--split-bytes", 1]
    code, output = invoke(*args, "-o", tmp_path / "e")
    assert code == 1 and f"{path}: row 9: " in output and "at most one exchange" in output
    out = tmp_path / "s"
    invoke_ok(*args, "-o", out, "--on-bad-line", "skip")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [
        (9, "template_error"),
        (14, "bad_record"),
    ]
    assert "unknown role 'robot'" in rejected[1]["detail"]


def test_unknown_input_format_is_refused() -> None:
    from packcli.config import ReadConfig
    from packcli.errors import ConfigError

    with pytest.raises(ConfigError, match=r"read\.input_format must be one of auto, jsonl"):
        ReadConfig(input_format="csv")
