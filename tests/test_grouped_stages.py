"""Planning and writing by groups of shards, end to end: the same bytes whatever the task
count, every token once (verify), resume after a kill, and a write task reads only its
groups' shards."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import datasets
import numpy as np
import pytest
from clirun import data_hashes, invoke_ok, run_pack
from corpora import pack_inputs

from packcli.tokenize.shards import TokenShards

# Shards of ~4k tokens and groups of ~3 shards: a 400-document corpus makes several groups
# and a tail; output files of ~8k tokens, so each group writes a few.
GROUPED = """
read:
  batch_size: 16
tokenize:
  shard_tokens: 4096
plan:
  short_len: 64
  long_len: 1024
  group_tokens: 12000
write:
  shard_tokens: 8192
"""


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path):
    root = tmp_path_factory.mktemp("grouped")
    corpus, cfg = pack_inputs(root, 400, 5, GROUPED)
    ref = root / "ref"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", ref, "-c", cfg, "-q")
    return corpus, cfg, ref, data_hashes(ref)


def _parts(out: Path) -> list[dict]:
    return json.loads((out / ".packcli" / "plan.json").read_text())["parts"]


def test_several_groups_and_a_tail_verify(grouped, toy_tokenizer_path: Path) -> None:
    _, _, ref, hashes = grouped
    parts = _parts(ref)
    groups = [p for p in parts if p["name"] != "tail"]
    assert len(groups) >= 3 and parts[-1]["name"] == "tail" and parts[-1]["tail_pieces"] > 0
    # Groups stride over the shards and hold each shard once.
    shards = sorted(s for p in groups for s in p["shards"])
    assert shards == list(range(len(shards))) and groups[0]["shards"][:2] == [0, len(groups)]
    invoke_ok("verify", ref)  # every document's tokens exactly once, packs whole, figures
    meta = json.loads((ref / "packcli.json").read_text())
    for name in ("long", "short"):
        rows = datasets.load_dataset(str(ref), name, split="train").num_rows
        assert rows == meta["report"]["tiers"][name]["rows"] == sum(p["rows"][name] for p in parts)
    assert len([h for h in hashes if "/long/" in h]) == sum(len(p["files"]["long"]) for p in parts)


def test_the_tail_planner_holds_each_released_piece_once(
    grouped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan driver hands the tail's planner every group's released pieces in one set of
    arrays: a list of the groups' pieces plus their concatenation held each twice (~24 of
    the driver's ~145 B per released piece, which dominate it at ~50k pieces per group)."""
    import packcli.stages.plan as plan_stage

    _, cfg, ref, hashes = grouped
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    seen: list[list[int]] = []
    real = plan_stage.plan_tail

    def spy(tails, config, ballast=None, **kwargs):
        seen.append([t.size for t in tails])
        return real(tails, config, ballast, **kwargs)

    monkeypatch.setattr(plan_stage, "plan_tail", spy)
    invoke_ok("plan", "-o", out, "-c", cfg, "-q")
    released = sum(p["tail_pieces"] for p in _parts(out) if p["name"] != "tail")
    assert seen == [[released]] and released > 0
    invoke_ok("write", "-o", out, "-c", cfg, "-q")
    assert data_hashes(out) == hashes


@pytest.mark.parametrize("num_tasks", [1, 4, 16])
def test_same_bytes_for_any_task_count(
    grouped, toy_tokenizer_path: Path, tmp_path: Path, num_tasks: int
) -> None:
    corpus, cfg, _, hashes = grouped
    out = tmp_path / "out"
    args = ["-o", out, "-c", cfg, "-q"]
    invoke_ok("tokenize", corpus, "-t", toy_tokenizer_path, *args)
    for i in range(num_tasks):  # the groups planned by tasks, then the tail by `plan`
        invoke_ok("plan", *args, "--task-index", i, "--num-tasks", num_tasks)
    records = sorted((out / ".packcli" / "plan").glob("group-*.json"))
    stamps = [p.stat().st_mtime_ns for p in records]
    invoke_ok("plan", *args)
    assert [p.stat().st_mtime_ns for p in records] == stamps  # the groups were reused
    assert len(records) == len(_parts(out)) - 1
    for i in range(num_tasks):
        invoke_ok("write", "-o", out, "-q", "--task-index", i, "--num-tasks", num_tasks)
    invoke_ok("finalize", "-o", out)
    assert data_hashes(out) == hashes


def test_pack_with_tasks_gives_the_same_bytes(grouped, toy_tokenizer_path: Path, tmp_path):
    corpus, cfg, _, hashes = grouped
    out = tmp_path / "out"
    invoke_ok(
        "pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q", "--num-tasks", 3
    )
    assert data_hashes(out) == hashes


def test_a_write_task_reads_only_its_groups_shards(
    grouped, toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus, cfg, _, hashes = grouped
    out = tmp_path / "out"
    invoke_ok("tokenize", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q")
    invoke_ok("plan", "-o", out, "-c", cfg, "-q")
    loaded: list[tuple[int, int]] = []  # (task, shard) for every shard a write task loads
    task = {"i": -1}
    real = TokenShards.shard

    def shard(self: TokenShards, index: int):
        loaded.append((task["i"], index))
        return real(self, index)

    monkeypatch.setattr(TokenShards, "shard", shard)
    n = 4
    for i in range(n):
        task["i"] = i
        invoke_ok("write", "-o", out, "-q", "--task-index", i, "--num-tasks", n)
    task["i"] = n
    invoke_ok("finalize", "-o", out)
    assert data_hashes(out) == hashes
    groups = {p["name"]: p["shards"] for p in _parts(out) if p["name"] != "tail"}
    n_shards = sum(len(s) for s in groups.values())
    shards = [s for _, s in loaded]
    assert sorted(shards) == list(range(n_shards))  # each shard loaded once, by one task
    # ... and finalize (which writes the tail here) reads no shard's tokens
    assert all(t < n for t, _ in loaded)
    for t in range(n):  # a task's shards are exactly its groups' shards
        mine = {s for tt, s in loaded if tt == t}
        assert any(
            mine == set().union(*[set(groups[g]) for g in names]) for names in _subsets(groups)
        )


def _subsets(groups: dict[str, list[int]]) -> list[list[str]]:
    names = sorted(groups)
    return [[n for k, n in enumerate(names) if m >> k & 1] for m in range(1 << len(names))]


@pytest.mark.parametrize("point", ["plan", "write:long:1", "write:short:2", "finalize"])
def test_killed_grouped_run_resumes_to_identical_bytes(
    grouped, toy_tokenizer_path: Path, tmp_path: Path, point: str
) -> None:
    corpus, cfg, _, hashes = grouped
    out = tmp_path / "out"
    killed = run_pack(corpus, toy_tokenizer_path, out, cfg, crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    again = run_pack(corpus, toy_tokenizer_path, out, cfg)
    assert again.returncode == 0, again.stderr
    assert data_hashes(out) == hashes
    invoke_ok("verify", out)


def test_killed_in_the_tail_resumes(grouped, toy_tokenizer_path: Path, tmp_path: Path) -> None:
    corpus, cfg, _, hashes = grouped
    last = len([h for h in hashes if "/long/" in h]) - 1  # the tail's files come last
    out = tmp_path / "out"
    killed = run_pack(corpus, toy_tokenizer_path, out, cfg, crash=f"write:long:{last}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert run_pack(corpus, toy_tokenizer_path, out, cfg).returncode == 0
    assert data_hashes(out) == hashes


def _segments(out: Path) -> dict[str, list[tuple]]:
    """Per config, every segment as (doc id, role, its tokens, its labels), sorted: what the
    rows hold, whatever rows they are in."""
    import pyarrow.parquet as pq

    found: dict[str, list[tuple]] = {}
    for name in ("long", "short"):
        segs = []
        for f in sorted((out / "data" / name).glob("*.parquet")):
            for row in pq.read_table(f).to_pylist():
                ends = np.cumsum(row["seq_lengths"]).tolist()
                roles = row.get("seq_roles") or [0] * len(ends)
                labels = row.get("labels") or row["input_ids"]
                for i, (end, doc) in enumerate(zip(ends, row["doc_ids"], strict=True)):
                    start = ends[i - 1] if i else 0
                    lab = list(labels[start + 1 : end])  # the first label is -100 in any row
                    segs.append((doc, roles[i], tuple(row["input_ids"][start:end]), tuple(lab)))
        found[name] = sorted(segs)
    return found


@pytest.mark.parametrize("fmt", ["chat", "preference"])
def test_chat_and_pairs_by_groups_hold_the_same_segments(tmp_path: Path, fmt: str) -> None:
    """Dialogues (labels) and preference pairs (two sequences, one doc id) through groups and
    the tail: every segment, with its labels and role, is the one the global plan writes;
    verify holds."""
    import random

    from corpora import chatml_tokenizer, random_text

    tok = chatml_tokenizer(tmp_path / "tok")
    rng = random.Random(3)
    corpus = tmp_path / "in.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for _ in range(300):
            prompt = [{"role": "user", "content": random_text(rng, rng.randint(2, 30))}]
            answer = [{"role": "assistant", "content": random_text(rng, rng.randint(1, 40))}]
            if fmt == "chat":
                record = {"messages": prompt + answer}
            else:
                other = [{"role": "assistant", "content": random_text(rng, rng.randint(1, 9))}]
                record = {"prompt": prompt, "chosen": answer, "rejected": other}
            fh.write(json.dumps(record) + "\n")
    args = ["--format", fmt, "--chat-template", "chatml", "--short-len", 128, "--long-len", 512]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("read:\n  batch_size: 16\ntokenize:\n  shard_tokens: 4096\n")
    whole, grouped = tmp_path / "whole", tmp_path / "grouped"
    invoke_ok("pack", corpus, "-t", tok, "-o", whole, "-c", cfg, *args, "-q")
    invoke_ok("pack", corpus, "-t", tok, "-o", grouped, "-c", cfg, *args, "-q",
              "--group-tokens", 5000)  # fmt: skip
    parts = _parts(grouped)
    assert len(parts) >= 4 and parts[-1]["name"] == "tail" and parts[-1]["tail_pieces"] > 0
    assert _segments(grouped) == _segments(whole)
    invoke_ok("verify", grouped)


def test_a_part_is_loaded_reading_each_array_once(grouped, monkeypatch) -> None:
    """``load_part`` builds the plan and its digest from one read of each npz array (reading
    ``z[k]`` again for the digest held every part's plan twice: write tasks and finalize)."""
    from collections import Counter

    from packcli.stages.plan import load_part, load_plan

    _, _, ref, _ = grouped
    work = ref / ".packcli"
    planset = load_plan(work, TokenShards(work / "tokens"))
    reads: Counter[str] = Counter()
    real = np.lib.npyio.NpzFile.__getitem__

    def counted(self, key):
        reads[f"{self.fid.name}:{key}"] += 1
        return real(self, key)

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", counted)
    for part in planset.parts:
        plan, _ = load_part(work, planset, part)
        assert plan.long is not None and plan.long.num_rows == part.rows["long"]
    assert reads and set(reads.values()) == {1}
