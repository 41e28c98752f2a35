"""``packcli inspect``: any row, across files and row groups, equals the row in the Parquet data."""

from __future__ import annotations

import json
import shutil
import unicodedata
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from corpora import mixed_corpus, packed_string_pairs, write_corpus
from tokenizers import Tokenizer
from typer.testing import CliRunner

from packcli.cli import app as main_app
from packcli.cli.examine import INSPECT_EPILOG, inspect_command
from packcli.errors import ConfigError
from packcli.publish.rowview import inspect_row, masked_spans

runner = CliRunner()
app = typer.Typer(add_completion=False, rich_markup_mode=None)
app.command("inspect", epilog=INSPECT_EPILOG)(inspect_command)
app.command("noop")(lambda: None)  # two commands, so "inspect" stays a subcommand

# Several files per config and several row groups per file, so locating a row is exercised.
CONFIG = "write:\n  shard_tokens: 1500\n  row_group_tokens: 300\n"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("rowview")
    mixed_corpus(root / "corpus.jsonl", 200, 11)
    (root / "cfg.yaml").write_text(CONFIG)
    out = root / "out"
    args = ["pack", str(root / "corpus.jsonl"), "-t", str(toy_tokenizer_path), "-o", str(out)]
    args += ["-c", str(root / "cfg.yaml"), "--short-len", "64", "--long-len", "1024", "-q"]
    result = runner.invoke(main_app, args)
    assert result.exit_code == 0, result.output
    for name in ("long", "short"):
        files = sorted((out / "data" / name).glob("*.parquet"))
        assert len(files) >= 2
        assert pq.ParquetFile(files[0]).num_row_groups >= 2
    return out


def all_rows(out: Path, config: str) -> list[dict[str, Any]]:
    files = sorted((out / "data" / config).glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def run(*args: str) -> Any:
    return runner.invoke(app, ["inspect", *args])


@pytest.mark.parametrize("config", ["long", "short"])
def test_every_row_matches_the_parquet_data(packed: Path, config: str) -> None:
    rows = all_rows(packed, config)
    for i in sorted({0, 1, len(rows) // 2, len(rows) - 2, len(rows) - 1}):
        view = inspect_row(packed, config, i, decode=False)
        row = rows[i]
        assert view["num_tokens"] == row["num_tokens"]
        assert [s["doc_id"] for s in view["segments"]] == row["doc_ids"]
        assert [s["length"] for s in view["segments"]] == row["seq_lengths"]
        starts = np.cumsum([0, *row["seq_lengths"]]).tolist()
        assert [(s["start"], s["end"]) for s in view["segments"]] == list(pairwise(starts))
        seg_ids = [s["index"] for s in view["segments"] for _ in range(s["length"])]
        assert seg_ids == row["segment_ids"]


def test_json_previews_are_the_decoded_segment_ends(packed: Path, toy_tokenizer_path: Path) -> None:
    result = run(str(packed), "--row", "1", "--json")
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    row = all_rows(packed, "long")[1]
    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    assert len(view["segments"]) == len(row["seq_lengths"]) >= 2
    assert view["has_labels"] is False and "masked_spans" not in view["segments"][0]
    for seg in view["segments"]:
        text = tok.decode(row["input_ids"][seg["start"] : seg["end"]], skip_special_tokens=False)
        assert text.startswith(seg["head"]) and text.endswith(seg["tail"])
        assert len(seg["head"]) == len(seg["tail"]) == min(40, len(text))
        assert seg["tail"].endswith("<|endoftext|>")  # the EOS packcli appended


def test_terminal_view_shows_segments_and_boundaries(packed: Path) -> None:
    result = run(str(packed), "--config", "short", "--row", "0", "--chars", "12")
    assert result.exit_code == 0, result.output
    for text in ("segment", "doc id", "(row start)", "(row end)", "|", "endoftext"):
        assert text in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--row", "100000"], "row 100000 does not exist: config long has"),
        (["--row", "-1"], "row -1 does not exist"),
        (["--row", "0", "--config", "medium"], "--config must be one of long, short"),
    ],
)
def test_bad_rows_are_clear_errors(packed: Path, args: list[str], message: str) -> None:
    result = run(str(packed), *args)
    assert isinstance(result.exception, ConfigError)
    assert message in str(result.exception)


def test_tokenizer_is_overridable_and_a_missing_one_says_how(
    packed: Path, tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out, ignore=shutil.ignore_patterns(".packcli"))
    meta = json.loads((out / "packcli.json").read_text())
    meta["run"]["tokenizer"]["source"] = str(tmp_path / "gone" / "tokenizer.json")
    (out / "packcli.json").write_text(json.dumps(meta))
    result = run(str(out), "--row", "0")
    assert isinstance(result.exception, ConfigError)
    assert "--tokenizer" in str(result.exception)
    result = run(str(out), "--row", "0", "--json", "--tokenizer", str(toy_tokenizer_path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["segments"][0]["head"]


def test_loss_masked_spans_from_a_labels_column(
    packed: Path, tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out, ignore=shutil.ignore_patterns(".packcli"))
    path = sorted((out / "data" / "short").glob("*.parquet"))[0]
    table = pq.read_table(path)
    labels = []
    for ids, lens in zip(
        table.column("input_ids").to_pylist(), table.column("seq_lengths").to_pylist(), strict=True
    ):
        lab = list(ids)
        start = 0
        for n in lens:  # the first half of every segment carries no loss (a "prompt")
            lab[start : start + n // 2] = [-100] * (n // 2)
            start += n
        labels.append(lab)
    table = table.append_column("labels", pa.array(labels, type=pa.list_(pa.int32())))
    pq.write_table(table, path, row_group_size=3)
    view = inspect_row(out, "short", 4, tokenizer=str(toy_tokenizer_path))
    assert view["has_labels"]
    for seg in view["segments"]:
        half = seg["length"] // 2
        assert seg["masked_spans"] == ([[seg["start"], seg["start"] + half]] if half else [])
    result = run(str(out), "--config", "short", "--row", "4")
    assert result.exit_code == 0, result.output
    assert "no-loss spans" in result.output


def test_masked_spans() -> None:
    lab = np.array([-100, -100, 5, 6, -100, 7, -100])
    assert masked_spans(lab) == [(0, 2), (4, 5), (6, 7)]
    assert masked_spans(lab, start=10) == [(10, 12), (14, 15), (16, 17)]
    assert masked_spans(np.array([1, 2])) == []


def test_a_relative_tokenizer_path_resolves_from_the_pack_directory(
    packed: Path, tmp_path: Path, toy_tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "project"  # pack ran here: `packcli pack ... -t tok/... -o runs/out`
    out = root / "runs" / "out"
    shutil.copytree(packed, out, ignore=shutil.ignore_patterns(".packcli"))
    (root / "tok").mkdir()
    shutil.copy(toy_tokenizer_path, root / "tok" / "tokenizer.json")
    meta = json.loads((out / "packcli.json").read_text())
    meta["run"]["tokenizer"]["source"] = "tok/tokenizer.json"
    meta["config"]["out"] = "runs/out"
    (out / "packcli.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)  # somewhere else
    view = inspect_row(out, "long", 0)
    assert view["tokenizer"] == str(root.resolve() / "tok" / "tokenizer.json")
    assert view["segments"][0]["head"]


# --- control characters, seq_roles, doc id -> file:line (issue 25) ---------------------------

HOSTILE = "red \x1b[31mALERT\x1b[0m bell\x07 del\x7f nel\x85 csi\x9b2J tab\there\nnext line"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    """Two jsonl inputs (blank lines in the second), one document full of control bytes."""
    root = tmp_path_factory.mktemp("hostile")
    write_corpus(root / "a.jsonl", [5 + (7 * i) % 30 for i in range(12)], seed=2)
    lines = [json.dumps({"text": HOSTILE})]
    lines += ["", json.dumps({"text": "after a blank line"}), "", json.dumps({"text": "last"})]
    (root / "b.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = root / "out"
    args = ["pack", str(root / "a.jsonl"), str(root / "b.jsonl"), "-t", str(toy_tokenizer_path)]
    result = runner.invoke(main_app, [*args, "-o", str(out), "--short-len", "64", "-q"])
    assert result.exit_code == 0, result.output
    return out


def row_of(out: Path, config: str, text: str, tok: Tokenizer) -> int:
    """The row whose decoded tokens hold ``text``."""
    for i, row in enumerate(all_rows(out, config)):
        if text in tok.decode(row["input_ids"], skip_special_tokens=False):
            return i
    raise AssertionError(f"{text!r} is in no row")


def test_control_characters_are_escaped(hostile: Path, toy_tokenizer_path: Path) -> None:
    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    i = row_of(hostile, "long", HOSTILE, tok)
    wide = {"COLUMNS": "1000"}  # no folding of the previews across lines
    result = runner.invoke(
        app, ["inspect", str(hostile), "--row", str(i), "--chars", "200"], env=wide
    )
    assert result.exit_code == 0, result.output
    raw = [c for c in result.output if unicodedata.category(c) == "Cc" and c != "\n"]
    assert raw == []  # no ESC, BEL, DEL, C1 reaches the terminal
    for shown in (r"\x1b[31mALERT\x1b[0m", r"bell\x07", r"del\x7f", r"nel\x85", r"csi\x9b2J"):
        assert shown in result.output
    assert r"tab\there\nnext line" in result.output  # newlines and tabs stay readable
    result = run(str(hostile), "--row", str(i), "--chars", "200", "--json")
    assert not any(0x80 <= ord(c) < 0xA0 or c == "\x1b" for c in result.output)
    heads = [s["head"] for s in json.loads(result.output)["segments"]]
    assert any(h.startswith(HOSTILE) for h in heads)  # the JSON keeps the exact text


def test_doc_id_names_its_source_file_and_line(hostile: Path, toy_tokenizer_path: Path) -> None:
    """The oracle: the named line of the named input file, encoded, is the document's tokens."""
    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    tokens: dict[int, list[int]] = {}
    for row in all_rows(hostile, "long"):
        starts = np.cumsum([0, *row["seq_lengths"]]).tolist()
        for d, (a, b) in zip(row["doc_ids"], pairwise(starts), strict=True):
            tokens[d] = row["input_ids"][a:b]
    assert len(tokens) == 15
    for doc in (0, 5, 11, 12, 13, 14):
        result = run(str(hostile), "--doc", str(doc), "--json")
        assert result.exit_code == 0, result.output
        found = json.loads(result.output)
        path = Path(found["file"])
        assert path.name == ("a.jsonl" if doc < 12 else "b.jsonl")
        line = path.read_text(encoding="utf-8").split("\n")[found["line"] - 1]
        assert tokens[doc][:-1] == tok.encode(json.loads(line)["text"]).ids  # then the EOS
    assert [json.loads(run(str(hostile), "--doc", str(d), "--json").output)["line"]
            for d in (12, 13, 14)] == [1, 3, 5]  # fmt: skip
    result = run(str(hostile), "--doc", "13")
    assert "b.jsonl line 3" in result.output
    assert "does not exist" in str(run(str(hostile), "--doc", "15").exception)
    assert "one of --row ROW or --doc" in str(run(str(hostile)).exception)


def test_preference_rows_show_seq_roles(tmp_path: Path, toy_tokenizer_path: Path) -> None:
    out = packed_string_pairs(tmp_path, toy_tokenizer_path, 6, seed=1)
    view = json.loads(run(str(out), "--row", "0", "--json").output)
    roles = [s["role"] for s in view["segments"]]
    want = pq.read_table(sorted((out / "data" / "long").glob("*.parquet"))[0])
    names = {0: "document", 1: "chosen", 2: "rejected"}
    assert roles == [names[r] for r in want.column("seq_roles")[0].as_py()]
    assert roles[:2] == ["chosen", "rejected"] and view["has_roles"]
    result = run(str(out), "--row", "0")
    assert "seq_roles" in result.output and "chosen" in result.output
    assert "rejected" in result.output
