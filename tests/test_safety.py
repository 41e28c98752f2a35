"""Other people's files, concurrent runs, damaged outputs and absurd settings (issue 14).

Every refusal is one line on stderr and exit status 1, never a traceback; a finished output
survives a rerun that fails; a folder packcli did not make is never written into.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clirun import data_hashes, run_process
from corpora import mixed_corpus, write_corpus
from typer.testing import CliRunner

from packcli.cli import app
from packcli.errors import PackcliError
from packcli.publish.expected import segment_hashes
from packcli.publish.push import PushError, upload_files
from packcli.stages import lock, plan
from packcli.stages import units as unit_files

runner = CliRunner()
SMALL = ["--short-len", "64", "--long-len", "1024", "-q"]


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def ok(*args: object) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: object) -> str:
    """The command exits 1 with exactly one line, ``error: ...``, and no traceback."""
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_corpus(tmp_path_factory.mktemp("safety") / "corpus.jsonl", 150, 14)


@pytest.fixture(scope="module")
def finished(
    corpus: Path, toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    ok("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *SMALL)
    return out


@pytest.fixture
def out(finished: Path, tmp_path: Path) -> Path:
    """A private copy of the finished output (its work folder travels with it)."""
    copy = tmp_path / "out"
    shutil.copytree(finished, copy)
    return copy


def pack_args(corpus: Path, tok: Path, out: Path) -> list[object]:
    return ["pack", corpus, "-t", tok, "-o", out, *SMALL]


# --------------------------------------------------------------------------- item 6


def test_a_folder_with_a_data_subfolder_is_not_ours(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Someone's Hub dataset clone: README.md and data/*.parquet, no packcli.json."""
    theirs = tmp_path / "theirs"
    (theirs / "data" / "long").mkdir(parents=True)
    (theirs / "README.md").write_text("their card")
    (theirs / "data" / "long" / "train-00000-of-00001.parquet").write_bytes(b"their data")
    before = {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()}
    line = fails(*pack_args(corpus, toy_tokenizer_path, theirs))
    assert "not a packcli output" in line and "--overwrite" in line
    assert {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()} == before


def test_a_foreign_dot_packcli_folder_or_packcli_json_is_not_ours(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    theirs = tmp_path / "theirs"
    (theirs / ".packcli").mkdir(parents=True)
    (theirs / ".packcli" / "notes.txt").write_text("mine")
    assert "not a packcli output" in fails(*pack_args(corpus, toy_tokenizer_path, theirs))
    other = tmp_path / "other"
    other.mkdir()
    (other / "packcli.json").write_text('{"something": "else"}')
    assert "not a packcli output" in fails(*pack_args(corpus, toy_tokenizer_path, other))


def _theirs(folder: Path) -> dict[Path, bytes]:
    """Another team's files, some where packcli writes (issue 29 item 6)."""
    files = {
        "data/long/mine.parquet": b"their long data",
        "data/short/other-team.parquet": b"their short data",
        "rejected.jsonl": b'{"their": "rejects"}\n',
        "notes.txt": b"their notes",
    }
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_overwrite_never_deletes_or_replaces_other_peoples_files(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """``--overwrite`` on a shared folder: the files where packcli writes are refused by
    name (they would be deleted, or read as part of the dataset); once they are moved,
    the others stay as they were."""
    shared = tmp_path / "shared"
    before = _theirs(shared)
    line = fails(*pack_args(corpus, toy_tokenizer_path, shared), "--overwrite")
    for rel in ("data/long/mine.parquet", "data/short/other-team.parquet", "rejected.jsonl"):
        assert rel in line, line
    assert "notes.txt" not in line and "move them out" in line
    assert {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()} == before
    for rel in ("data/long/mine.parquet", "data/short/other-team.parquet", "rejected.jsonl"):
        (shared / rel).unlink()
    ok(*pack_args(corpus, toy_tokenizer_path, shared), "--overwrite")
    assert (shared / "notes.txt").read_bytes() == b"their notes"
    assert "all invariants hold" in ok("verify", shared)


def test_a_foreign_parquet_file_dropped_into_an_output_is_refused_not_deleted(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    """A packcli output another team added a Parquet file to: a rerun with other settings
    (which replaces the output's files) refuses it by name instead of deleting it."""
    theirs = out / "data" / "long" / "mine.parquet"
    before = data_hashes(out)
    theirs.write_bytes(b"their data")
    args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", out, "--short-len", "32", "-q"]
    line = fails(*args, "--long-len", "512")
    assert "data/long/mine.parquet" in line and "packcli did not write" in line
    assert fails(*args, "--long-len", "512", "--overwrite") == line
    assert theirs.read_bytes() == b"their data"
    theirs.unlink()  # the finished output is untouched
    assert data_hashes(out) == before and (out / "packcli.json").is_file()


def test_files_of_an_earlier_output_are_packcli_s_after_a_kill_without_a_work_folder(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    """A finished output whose work folder was deleted, repacked with another plan and
    killed mid-write (its packcli.json is gone by then): the rerun still knows the old
    Parquet files as packcli's (kept from the old packcli.json when the run began), deletes
    them, and ends with exactly the files the new packcli.json lists."""
    shutil.rmtree(out / ".packcli")
    old = set(data_hashes(out))
    small_files = out.parent / "small-files.yaml"  # other file names: several files a config
    small_files.write_text("write:\n  shard_tokens: 2048\n")
    args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", small_files, *SMALL]
    killed = run_process(args, crash="write:long:0")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "packcli.json").exists()
    ok(*args)
    meta = json.loads((out / "packcli.json").read_text())
    listed = {f"data/{n}/{f['file']}" for n in ("long", "short") for f in meta["files"][n]}
    assert set(data_hashes(out)) == listed
    assert not old & listed  # every old file was deleted, none is left beside the new ones
    assert "all invariants hold" in ok("verify", out)


def test_own_outputs_are_recognised(
    out: Path, corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """A finished output without its work folder (safe to delete), and an unfinished one
    whose work folder lives elsewhere (only the marker there names the output)."""
    shutil.rmtree(out / ".packcli")
    ok(*pack_args(corpus, toy_tokenizer_path, out))
    elsewhere, work = tmp_path / "o2", tmp_path / "work"
    ok("tokenize", corpus, "-t", toy_tokenizer_path, "-o", elsewhere, "--work-dir", work, "-q")
    ok("plan", "-o", elsewhere, "--work-dir", work, *SMALL)
    ok("write", "-o", elsewhere, "--work-dir", work, "-q")
    assert (elsewhere / "data").is_dir() and not (elsewhere / "packcli.json").exists()
    ok(*pack_args(corpus, toy_tokenizer_path, elsewhere), "--work-dir", work)
    assert "all invariants hold" in ok("verify", elsewhere)
    # The same work folder does not make another non-empty folder ours.
    third = tmp_path / "third"
    third.mkdir()
    (third / "thesis.tex").write_text("x")
    line = fails(*pack_args(corpus, toy_tokenizer_path, third), "--work-dir", work)
    assert "not a packcli output" in line


# --------------------------------------------------------------------------- item 7


def test_a_failed_rerun_leaves_the_finished_output_complete(
    out: Path, corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    bad_input = tmp_path / "bad.jsonl"
    bad_input.write_text('{"text": "fine"}\n{"text": broken}\n')
    hashes = data_hashes(out)
    args = pack_args(corpus, toy_tokenizer_path, out)
    attempts = [
        (pack_args(tmp_path / "corpsu.jsonl", toy_tokenizer_path, out), "corpsu.jsonl"),
        ([*args, "--eos", "<|no such token|>"], "no such token"),
        ([*args, "--seed", "-1"], "seed"),
        ([*args, "--chat-template", tmp_path / "nope.jinja", "--format", "chat"], "nope"),
        # Other inputs, failing on their second line: the finished output's shards stay.
        (pack_args(bad_input, toy_tokenizer_path, out), f"{bad_input}:2"),
    ]
    for attempt, needle in attempts:
        assert needle in fails(*attempt)
        assert (out / "packcli.json").is_file(), attempt
    assert data_hashes(out) == hashes
    assert "against the tokenized shards" in ok("verify", out)
    ok(*args)  # and the right command still finishes, reusing its shards
    assert data_hashes(out) == hashes
    assert "against the tokenized shards" in ok("verify", out)


def test_a_rerun_that_changes_nothing_never_uncompletes(
    out: Path, corpus: Path, toy_tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same command, failing after tokenizing (everything reused): still complete."""

    def boom(*args: object, **kwargs: object) -> None:
        raise PackcliError("planner failed")

    monkeypatch.setattr(plan, "_save_plan", boom)  # the groups' plans are reused: fail later
    assert "planner failed" in fails(*pack_args(corpus, toy_tokenizer_path, out))
    assert (out / "packcli.json").is_file()
    assert "against the tokenized shards" in ok("verify", out)


# --------------------------------------------------------------------------- item 8


def test_a_second_run_is_refused_and_told_who_holds_the_lock(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    with lock.hold(out, out / ".packcli"):
        line = fails(*pack_args(corpus, toy_tokenizer_path, out))
        assert "in use by another packcli process" in line
        assert f"pid {os.getpid()} on " in line and "since " in line
        tokenize = ["tokenize", corpus, "-t", toy_tokenizer_path, "-o", out, "-q"]
        assert "in use" in fails(*tokenize)
        assert "in use" in fails("finalize", "-o", out)
    ok(*pack_args(corpus, toy_tokenizer_path, out))  # released


def test_the_output_lock_is_the_file_earlier_packcli_versions_lock(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    """The lock file's name is part of the output's on-disk format: a run of an older
    packcli holding ``OUT/.packcli.lock`` must still keep this one out."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".packcli.lock", "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert "in use by another packcli process" in fails(
            *pack_args(corpus, toy_tokenizer_path, out)
        )
    ok(*pack_args(corpus, toy_tokenizer_path, out))


def test_a_shared_work_dir_is_locked_too(
    out: Path, corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Two outputs, one --work-dir: the second run must not rewrite the first's shards."""
    work = tmp_path / "work"
    work.mkdir()
    other = tmp_path / "other"
    with lock.hold(out, work):
        line = fails(*pack_args(corpus, toy_tokenizer_path, other), "--work-dir", work)
        assert f"work folder {work} is in use" in line


def test_task_commands_share_the_lock_but_not_their_task(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    """Tokenize tasks of one array run side by side; the same task index twice does not,
    and neither does a whole-job command while tasks run."""
    tokenize = ["tokenize", corpus, "-t", toy_tokenizer_path, "-o", out, "-q", "--num-tasks", 2]
    with lock.hold(out, out / ".packcli", shared=True, task=("tokenize", 0)):
        ok(*tokenize, "--task-index", 1)
        line = fails(*tokenize, "--task-index", 0)
        assert "tokenize task 0" in line and "in use" in line
        assert "in use" in fails(*pack_args(corpus, toy_tokenizer_path, out))
        assert "in use" in fails("plan", "-o", out, *SMALL)


def test_a_killed_holder_leaves_no_stale_lock(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from packcli.stages.lock import hold\n"
            "with hold(Path(sys.argv[1]), Path(sys.argv[1]) / '.packcli'):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert f"pid {holder.pid} on" in fails(*pack_args(corpus, toy_tokenizer_path, out))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    ok(*pack_args(corpus, toy_tokenizer_path, out))


# --------------------------------------------------------------------------- item 10


def test_push_refuses_symlinks_and_files_outside(out: Path, tmp_path: Path) -> None:
    secret = tmp_path / "credentials"
    secret.write_text("token=hf_secret")
    card = out / "README.md"
    card.unlink()
    card.symlink_to(secret)
    with pytest.raises(PushError, match=r"README\.md is a symbolic link"):
        upload_files(out)
    assert "symbolic link" in fails("push", out, "me/corpus", "--dry-run")
    card.unlink()
    card.write_text("card")
    # A data folder that is a link to somewhere else.
    data = out / "data" / "short"
    moved = tmp_path / "short"
    shutil.move(data, moved)
    data.symlink_to(moved, target_is_directory=True)
    with pytest.raises(PushError, match="symbolic link"):
        upload_files(out)


def test_push_of_a_linked_output_folder_is_fine(out: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    assert {f.path for f in upload_files(link)} == {f.path for f in upload_files(out)}


# --------------------------------------------------------------------------- item 12


def test_segment_hashes_of_empty_segments() -> None:
    tokens = np.array([5, 6, 7], dtype=np.int32)
    got = segment_hashes(tokens, np.array([2, 0, 1, 0]))
    want = segment_hashes(tokens, np.array([2, 1]))
    assert got.tolist() == [want[0], 0, want[1], 0]


def test_verify_chat_output_whose_last_dialogue_trains_nothing(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "chat.jsonl"
    with open(path, "w") as fh:
        for i in range(4):
            turns = [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "ok"}]
            fh.write(json.dumps({"messages": turns}) + "\n")
        fh.write(json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n")
    out = tmp_path / "out"
    ok(
        "pack",
        path,
        "-t",
        toy_tokenizer_path,
        "-o",
        out,
        "--format",
        "chat",
        "--chat-template",
        "chatml",
    )
    assert "against the tokenized shards" in ok("verify", out)


def test_a_truncated_token_shard_is_named_by_verify_and_rebuilt_by_pack(
    out: Path, corpus: Path, toy_tokenizer_path: Path
) -> None:
    (shard,) = (out / ".packcli" / "tokens" / "files").glob("*/shard-*.arrow")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    line = fails("verify", out)
    assert str(shard) in line and "damaged tokenized shard" in line
    ok(*pack_args(corpus, toy_tokenizer_path, out))
    assert shard.read_bytes() == data
    assert "against the tokenized shards" in ok("verify", out)


def test_a_damaged_plan_is_one_line(out: Path) -> None:
    plan = out / ".packcli" / "plan" / "group-00000.npz"
    plan.write_bytes(plan.read_bytes()[:100])
    for f in (out / "data" / "long").glob("*.parquet"):  # a file to write from that plan
        f.unlink()
    line = fails("write", "-o", out, "-q")
    assert str(plan) in line and "packcli plan" in line
    ok("plan", "-o", out, *SMALL)
    ok("write", "-o", out, "-q")
    ok("finalize", "-o", out)
    assert "against the tokenized shards" in ok("verify", out)


def _damage(meta: dict, how: str) -> object:
    if how == "empty":
        return {}
    if how == "list":
        return [1, 2]
    if how == "no tiers":
        del meta["report"]["tiers"]
    if how == "files not a list":
        meta["files"]["long"] = "train.parquet"
    if how == "file outside":
        meta["files"]["long"][0]["file"] = "../../README.md"
    if how == "rows a string":
        meta["files"]["short"][0]["rows"] = "12"
    return meta


@pytest.mark.parametrize(
    "how",
    ["truncated", "empty", "list", "no tiers", "files not a list", "file outside", "rows a string"],
)
def test_a_damaged_packcli_json_is_one_line_for_every_reader(out: Path, how: str) -> None:
    marker = out / "packcli.json"
    if how == "truncated":
        marker.write_bytes(marker.read_bytes()[:300])
    else:
        marker.write_text(json.dumps(_damage(json.loads(marker.read_text()), how)))
    for command in (
        ["verify", out],
        ["stats", out, "--json", "--no-plots"],
        ["push", out, "me/corpus", "--dry-run"],
    ):
        assert "packcli.json" in fails(*command), command


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ('plan:\n  seed: "abc"\n', "seed must be an integer, got 'abc'"),
        ("plan:\n  seed: -1\n", "plan.seed must be in 0.."),
        ("plan:\n  short_len: 512.5\n", "short_len must be an integer, got 512.5"),
        ("plan:\n  long_len: true\n", "long_len must be an integer, got True"),
        ("read:\n  text_field: 3\n", "text_field must be a string, got 3"),
        ("chat:\n  chat_template: [a]\n", "chat_template must be a string or null"),
        ("write:\n  compression_level: high\n", "compression_level must be an integer"),
    ],
)
def test_config_values_of_the_wrong_type(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path, yaml: str, message: str
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml)
    line = fails("pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "o", "-c", cfg)
    assert message in line
    assert not (tmp_path / "o").exists()


def test_negative_seed_flag(corpus: Path, toy_tokenizer_path: Path, tmp_path: Path) -> None:
    args = pack_args(corpus, toy_tokenizer_path, tmp_path / "o")
    assert "plan.seed must be in 0.." in fails(*args, "--seed", "-1")


# --------------------------------------------------------------------------- item 13


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--split-bytes", "1", "split_bytes must be 0 (never split) or at least 1048576"),
        ("--split-bytes", "1048575", "split_bytes must be 0 (never split) or at least 1048576"),
        ("--long-len", "2147483647", "long_len must be at most 16777216"),
        ("--long-len", "16777217", "long_len must be at most 16777216"),
    ],
)
def test_absurd_settings_are_refused(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path, flag: str, value: str, message: str
) -> None:
    args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "o", flag, value]
    assert message in fails(*args)


def test_sane_limits_are_accepted() -> None:
    from packcli.config import PlanConfig, ReadConfig

    assert ReadConfig(split_bytes=0).split_bytes == 0
    assert ReadConfig(split_bytes=1 << 20).split_bytes == 1 << 20
    assert PlanConfig(long_len=1 << 24).long_len == 1 << 24


def tiny_files(folder: Path, n: int) -> list[Path]:
    """``n`` small files; file 7 holds the longest document (its line 2), file 11 a bad line."""
    folder.mkdir()
    paths = []
    for i in range(n):
        path = folder / f"f{i:03d}.jsonl"
        write_corpus(path, [3 + i % 5, 200 if i == 7 else 4], seed=i)
        if i == 11:
            with open(path, "a") as fh:
                fh.write('{"text": 5}\n')
        paths.append(path)
    return paths


def test_tiny_files_share_units_and_shards(
    toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 tiny files make one unit and one shard, not 60, and the same dataset, report and
    quarantine as one unit per file (provenance names each document's own file and line)."""
    paths = tiny_files(tmp_path / "tiny", 60)
    grouped, single = tmp_path / "grouped", tmp_path / "single"
    args = [tmp_path / "tiny", "-t", toy_tokenizer_path, *SMALL, "--on-bad-line", "skip"]
    ok("pack", *args, "-o", grouped)
    tokens = grouped / ".packcli" / "tokens"
    units = json.loads((tokens / "stage.json").read_text())["units"]
    assert len(units) == 1 and len(units[0]["paths"]) == 60
    assert len(list(tokens.glob("files/*/shard-*.arrow"))) == 1
    report = json.loads((grouped / "packcli.json").read_text())["report"]
    assert Path(report["largest_document"]["file"]) == paths[7].resolve()
    assert report["largest_document"]["line"] == 2
    (reject,) = (grouped / "rejected.jsonl").read_text().splitlines()
    assert (Path(json.loads(reject)["file"]), json.loads(reject)["line"]) == (paths[11], 3)

    monkeypatch.setattr(unit_files, "GROUP_BYTES", 1)  # every file a unit of its own
    ok("pack", *args, "-o", single)
    assert len(json.loads((single / ".packcli/tokens/stage.json").read_text())["units"]) == 60
    assert data_hashes(grouped) == data_hashes(single)
    assert json.loads((single / "packcli.json").read_text())["report"] == report
    assert (single / "rejected.jsonl").read_text() == (grouped / "rejected.jsonl").read_text()
    assert "against the tokenized shards" in ok("verify", grouped)


def test_adding_a_small_file_redoes_only_its_group(
    toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group boundaries depend on each file alone: one file more changes one group."""
    monkeypatch.setattr(unit_files, "GROUP_BYTES", 400)  # several groups of these files
    tiny_files(tmp_path / "tiny", 40)
    out = tmp_path / "out"
    args = ["pack", tmp_path / "tiny", "-t", toy_tokenizer_path, "-o", out, *SMALL]
    ok(*args, "--on-bad-line", "skip")
    stage = out / ".packcli" / "tokens" / "stage.json"
    units = json.loads(stage.read_text())["units"]
    before = {u["key"] for u in units}
    # What the test needs: files grouped, in more than one group. Each file starts a group
    # with probability size / 400 (~1/4 here), decided by its path's hash: one group of all
    # 40 files or none of several has a chance under 1e-4 whatever the temporary folder is.
    assert len(units) > 1 and any(len(u.get("paths", ())) > 1 for u in units)
    write_corpus(tmp_path / "tiny" / "f020b.jsonl", [6, 6], seed=99)
    ok(*args, "--on-bad-line", "skip")
    after = {u["key"] for u in json.loads(stage.read_text())["units"]}
    assert len(before - after) <= 1 and len(after - before) <= 2


def test_small_file_groups_average_group_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each small file starts a group with probability size / GROUP_BYTES, so the number of
    groups is near the files' bytes over GROUP_BYTES: here ~100 (sd ~10), whatever the
    temporary folder's name is that the draws hash."""
    monkeypatch.setattr(unit_files, "GROUP_BYTES", 2000)
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate(rng.integers(50, 350, 2000)):
        path = tmp_path / f"f{i:04d}.jsonl"
        path.write_text(json.dumps({"text": "x" * (size - 12)}) + "\n")
        paths.append(path)
    _, units = unit_files.input_units(paths, split_bytes=1 << 30, stage_fp="test")
    expected = 1 + sum(path.stat().st_size for path in paths[1:]) / 2000
    assert expected / 2 < len(units) < 2 * expected
    assert sum(len(unit_files.unit_paths(u)) for u in units) == len(paths)


def test_an_output_or_work_folder_that_cannot_be_made_fails_before_any_work(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """A parent that is a file (or a read-only one): one line naming the folder before any
    input is read (here the input does not even exist: the output is checked first)."""
    (tmp_path / "afile").write_text("x")
    nowhere = tmp_path / "afile" / "out"
    line = fails("pack", tmp_path / "missing.jsonl", "-t", toy_tokenizer_path, "-o", nowhere)
    assert f"output folder {nowhere} cannot be created or written" in line
    assert "rerun the same command" not in line
    out = tmp_path / "out"
    line = fails(*pack_args(corpus, toy_tokenizer_path, out), "--work-dir", nowhere)
    assert f"work folder {nowhere} cannot be created or written" in line
    assert not out.exists()
    if os.geteuid() != 0:  # root writes into read-only folders
        (tmp_path / "ro").mkdir(mode=0o555)
        line = fails(*pack_args(corpus, toy_tokenizer_path, tmp_path / "ro" / "out"))
        assert "cannot be created or written" in line
