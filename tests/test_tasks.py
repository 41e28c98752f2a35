"""Cluster tasks: any split of the stages into tasks gives the single-process bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import data_hashes
from clirun import invoke_ok as invoke
from corpora import mixed_lengths, write_corpus
from typer.testing import CliRunner

from packcli.cli import app
from packcli.errors import ConfigError
from packcli.stages.tasks import assign_by_size, resolve_task

runner = CliRunner()
CFG = "plan:\n  short_len: 64\n  long_len: 1024\nwrite:\n  shard_tokens: 6000\n"


def three_files(tmp_path: Path, seed: int) -> tuple[Path, Path]:
    """A 200-document mixed corpus in three files, and the small-tier config."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    counts = mixed_lengths(200, seed=seed)
    for i in range(3):
        write_corpus(corpus / f"p{i}.jsonl", counts[i::3], seed=i)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG)
    return corpus, cfg


def test_assign_by_size_balances_and_is_deterministic() -> None:
    sizes = [100, 10, 60, 50, 40, 5]
    tasks = assign_by_size(sizes, 2)
    assert tasks == assign_by_size(list(sizes), 2)
    loads = [sum(s for s, t in zip(sizes, tasks, strict=True) if t == k) for k in range(2)]
    assert sorted(loads) == [125, 140]  # 100+40 vs 60+50+10+5
    assert assign_by_size(sizes, 1) == [0] * 6
    assert sorted(set(assign_by_size(sizes, 10))) == [0, 1, 2, 3, 4, 5]


def test_resolve_task_from_flags_and_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    assert resolve_task(None, None) == (0, 1)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "5")
    assert resolve_task(None, None) == (2, 4)
    assert resolve_task(1, 3) == (1, 3)  # explicit flags win
    with pytest.raises(ConfigError, match="task-index"):
        resolve_task(3, 3)


def test_split_stages_match_single_process(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    counts = mixed_lengths(500, seed=9)
    for i in range(5):
        write_corpus(corpus / f"part-{i}.jsonl", counts[i * 100 : (i + 1) * 100], seed=i)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG)
    single = tmp_path / "single"
    invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", single, "-c", cfg, "-q")
    # The report traces the longest document back to its file and line across files.
    longest = max(range(500), key=lambda i: counts[i])
    largest = json.loads((single / "packcli.json").read_text())["report"]["largest_document"]
    assert largest["doc_id"] == longest
    assert (Path(largest["file"]).name, largest["line"]) == (
        f"part-{longest // 100}.jsonl",
        longest % 100 + 1,
    )

    out = tmp_path / "split"
    tok_args = ["tokenize", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q"]
    invoke(*tok_args, "--task-index", 2, "--num-tasks", 3)
    result = runner.invoke(app, [str(a) for a in ["plan", "-o", out, "-c", cfg, "-q"]])
    assert result.exit_code == 1 and "tokenize task(s) not finished" in result.output
    invoke(*tok_args, "--task-index", 0, "--num-tasks", 3)
    invoke(*tok_args, "--task-index", 1, "--num-tasks", 3)
    invoke("plan", "-o", out, "-c", cfg, "-q")
    invoke("write", "-o", out, "-c", cfg, "--task-index", 1, "--num-tasks", 2, "-q")
    result = runner.invoke(app, ["finalize", "-o", str(out)])
    assert result.exit_code == 1 and "write task(s) not finished" in result.output
    invoke("write", "-o", out, "-c", cfg, "--task-index", 0, "--num-tasks", 2, "-q")
    invoke("finalize", "-o", out)

    assert len(data_hashes(single)) > 2
    assert data_hashes(out) == data_hashes(single)
    assert "all invariants hold" in invoke("verify", out)


def test_local_executor_with_several_tasks_matches(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus, cfg = three_files(tmp_path, seed=4)
    one, many = tmp_path / "one", tmp_path / "many"
    invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", one, "-c", cfg, "-q")
    invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", many, "-c", cfg, "-q", "--num-tasks", 3)
    assert data_hashes(many) == data_hashes(one)


def test_ray_executor_matches_local(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    import ray  # in the dev extras, so CI always runs this

    corpus, cfg = three_files(tmp_path, seed=6)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", local, "-c", cfg, "-q")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", on_ray, "-c", cfg, "-q"]
        invoke(*args, "--executor", "ray", "--num-tasks", 2)
    finally:
        ray.shutdown()
    assert data_hashes(on_ray) == data_hashes(local)
    assert "all invariants hold" in invoke("verify", on_ray)


def test_adding_a_file_reuses_the_others_and_keeps_provenance(
    toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new input that sorts first shifts every file's index: the other files' shards are
    reused as they are, and the report still names the right file and line. (Files this
    small would share a unit; with a 1-byte group size each file is a unit of its own, as
    files of GROUP_BYTES and more are; groups: tests/test_safety.py.)"""
    monkeypatch.setattr("packcli.stages.units.GROUP_BYTES", 1)
    corpus = tmp_path / "c"
    corpus.mkdir()
    write_corpus(corpus / "b.jsonl", [5, 8, 400, 3], seed=1)  # the longest: b.jsonl line 3
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG)
    out = tmp_path / "out"
    args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q"]
    invoke(*args)
    (success,) = (out / ".packcli/tokens/files").glob("*/_SUCCESS.json")
    before = success.stat().st_mtime_ns
    write_corpus(corpus / "a.jsonl", [4, 6, 9], seed=2)
    invoke(*args)
    assert success.stat().st_mtime_ns == before  # b.jsonl was not tokenized again
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["documents"] == 7
    largest = report["largest_document"]
    assert (Path(largest["file"]).name, largest["line"], largest["doc_id"]) == ("b.jsonl", 3, 5)
