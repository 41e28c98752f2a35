"""Crash safety: SIGKILL a real ``packcli pack`` at each stage, rerun, get identical bytes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import data_hashes, run_pack, run_process
from corpora import pack_inputs

CONFIG = """
read:
  batch_size: 16
tokenize:
  shard_tokens: 4096
plan:
  short_len: 64
  long_len: 1024
write:
  shard_tokens: 8192
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path):
    root = tmp_path_factory.mktemp("resume")
    corpus, cfg = pack_inputs(root, 400, 5, CONFIG)
    ref = root / "ref"
    result = run_pack(corpus, toy_tokenizer_path, ref, cfg)
    assert result.returncode == 0, result.stderr
    hashes = data_hashes(ref)
    assert len([h for h in hashes if "/long/" in h]) >= 3  # several files, so mid-write kills
    return corpus, cfg, ref, hashes


@pytest.mark.parametrize(
    ("point", "resumed"),
    [
        ("tokenize:3", "after 3 completed shard(s)"),
        ("plan", "reusing tokenized shards"),
        ("write:long:1", "reusing tokenized shards"),
        ("write:short:0", "reusing tokenized shards"),
        ("finalize", "reusing tokenized shards"),
    ],
)
def test_killed_run_resumes_to_identical_output(
    setup, toy_tokenizer_path: Path, tmp_path: Path, point: str, resumed: str
) -> None:
    corpus, cfg, ref, ref_hashes = setup
    out = tmp_path / "out"
    killed = run_pack(corpus, toy_tokenizer_path, out, cfg, crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "packcli.json").exists()  # never marked complete
    again = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert again.returncode == 0, again.stderr
    assert resumed in again.stderr
    assert data_hashes(out) == ref_hashes
    assert not list(out.rglob(".*.tmp-*"))
    ref_meta = json.loads((ref / "packcli.json").read_text())
    meta = json.loads((out / "packcli.json").read_text())
    assert meta["report"] == ref_meta["report"] and meta["files"] == ref_meta["files"]
    check = subprocess.run(
        [sys.executable, "-m", "packcli", "verify", str(out)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_changed_input_invalidates_tokenized_shards(
    setup, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus, cfg, _, _ = setup
    copy = tmp_path / "corpus.jsonl"
    copy.write_bytes(corpus.read_bytes())
    out = tmp_path / "out"
    assert run_pack(copy, toy_tokenizer_path, out, cfg).returncode == 0
    with open(copy, "a", encoding="utf-8") as fh:
        fh.write('{"text": "one more document"}\n')
    again = run_pack(copy, toy_tokenizer_path, out, cfg)
    assert again.returncode == 0, again.stderr
    assert "reusing tokenized shards" not in again.stderr
    meta = json.loads((out / "packcli.json").read_text())
    assert meta["report"]["input"]["documents"] == 401


def test_killed_run_over_byte_spans_resumes_to_identical_output(
    setup, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """The corpus tokenized as byte spans of one file, killed inside a later span: the
    rerun finishes only what is missing and matches the whole-file reference."""
    corpus, cfg, ref, ref_hashes = setup
    split = tmp_path / "cfg.yaml"
    split.write_text(cfg.read_text().replace("read:\n", "read:\n  split_bytes: 40000\n"))
    out = tmp_path / "out"
    killed = run_pack(corpus, toy_tokenizer_path, out, split, crash="tokenize:3", spans=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    units = json.loads((out / ".packcli/tokens/stage.json").read_text())["units"]
    assert len(units) >= 3
    done = [(out / ".packcli/tokens/files" / u["key"] / "_SUCCESS.json").exists() for u in units]
    assert done[0] and not all(done)  # killed after the first span, before the last
    again = run_pack(corpus, toy_tokenizer_path, out, split, spans=True)
    assert again.returncode == 0, again.stderr
    assert "after " in again.stderr and "completed shard(s)" in again.stderr
    assert data_hashes(out) == ref_hashes
    ref_report = json.loads((ref / "packcli.json").read_text())["report"]
    assert json.loads((out / "packcli.json").read_text())["report"] == ref_report


# ``packcli`` with shards cut from 1,024 tokens on (``MIN_CUT_TOKENS``), so a test corpus
# is cut into about four shards written behind.
SMALL_CUTS = (
    "import packcli.stages.tokenize as t; t.MIN_CUT_TOKENS = 1024; "
    "from packcli.cli import main; main()"
)


def test_shards_written_behind_resume_to_the_same_bytes(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """A unit expected to fit in a few shards is cut into smaller ones, each written on a
    thread while the next fills (``stages/tokenize.py`` ``_shard_writer``): the same bytes
    as one shard written in line, and, killed once the first is on disk (the second being
    written), the rerun resumes from it to those bytes again."""
    corpus, cfg = pack_inputs(tmp_path, 2000, 6, CONFIG.replace("4096", "1000000"))
    ref = tmp_path / "ref"
    assert run_pack(corpus, toy_tokenizer_path, ref, cfg).returncode == 0

    def pack(out: Path, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        args = ["-v", "pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q"]
        return run_process(args, crash=crash, entry=SMALL_CUTS)

    whole = tmp_path / "whole"
    assert pack(whole).returncode == 0
    shards = sorted((whole / ".packcli/tokens/files").rglob("shard-*.arrow"))
    assert len(shards) >= 3 and data_hashes(whole) == data_hashes(ref)
    out = tmp_path / "out"
    killed = pack(out, crash="tokenize:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    again = pack(out)
    assert again.returncode == 0, again.stderr
    assert "after 1 completed shard(s)" in again.stderr
    assert data_hashes(out) == data_hashes(ref)
    assert not list(out.rglob(".*.tmp-*"))
