"""The work folder on object storage (``--work-dir s3://...``): tasks on machines that share
no disk, against a real local S3 server (tests/s3local.py). A "machine" here is a packcli
process with its own cache folder (``PACKCLI_CACHE_DIR``), where its mirror lives; nothing
else is shared but the store. The Ray test starts a head and a worker node as separate
``ray start`` processes, each with its own temp and cache folders."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from clirun import invoke, invoke_ok, run_process
from corpora import mixed_corpus
from s3count import RequestLog
from s3local import cfg, local_hashes, remote_files, remote_hashes, remote_pack, upload

from packcli import fs as packfs
from packcli.read import iter_batches


def _env(s3: dict[str, str], cache: Path, **more: str) -> dict[str, str]:
    env = {**os.environ, **s3, "PACKCLI_CACHE_DIR": str(cache), **more}
    env.pop("PACKCLI_CRASH_AT", None)
    return env


def _ok(args: list[Any], env: dict[str, str]) -> str:
    done = run_process(args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _left_in(cache: Path) -> list[str]:
    """Files a process left in its mirrors (held lock files aside): none, once it is done."""
    root = cache / "mirrors"
    locks = {".packcli.lock", "lock"}
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.name not in locks and "locks" not in p.parts
    )


def _etags(url: str) -> dict[str, str]:
    fs, prefix = packfs.locate(url)
    fs.invalidate_cache()
    return {p: str(i.get("ETag")) for p, i in fs.find(prefix, detail=True).items()}


@dataclass
class Job:
    """A pack whose input, output and work folder are all on the store (a fresh bucket)."""

    s3: dict[str, str]
    bucket: str
    reference: dict[str, str]  # the Parquet hashes of the same corpus packed locally
    out: str
    args: list[Any]  # ``pack`` with its input, output and work folder URLs

    def env(self, cache: Path, **more: str) -> dict[str, str]:
        return _env(self.s3, cache, **more)


@pytest.fixture
def job(
    s3: dict[str, str],
    corpus: Path,
    reference: dict[str, str],
    toy_tokenizer_path: Path,
    bucket: str,
) -> Job:
    out, args = remote_pack(corpus, bucket, toy_tokenizer_path, f"s3://{bucket}/work")
    return Job(s3, bucket, reference, out, args)


# --------------------------------------------------------------------------- cluster commands


def test_stage_commands_on_machines_sharing_only_the_store(
    s3: dict[str, str],
    corpus: Path,
    reference: dict[str, str],
    toy_tokenizer_path: Path,
    bucket: str,
    tmp_path: Path,
) -> None:
    """A Slurm array without a shared disk: each task a process with its own disk; the
    tokenized shards, the plan and the records travel only through the store."""
    upload(corpus, f"s3://{bucket}/in", "*.jsonl.zst")
    out, work = f"s3://{bucket}/out", f"s3://{bucket}/work"
    inputs = [f"s3://{bucket}/in/*.jsonl.zst", "-t", toy_tokenizer_path]
    common = ["-o", out, "--work-dir", work, "-q"]
    config = ["-c", corpus / "cfg.yaml"]
    machines = [tmp_path / f"machine-{i}" for i in range(3)]
    env = [_env(s3, m) for m in machines]
    for i in range(2):
        _ok(["tokenize", *inputs, *common, *config, "--task-index", i, "--num-tasks", 2], env[i])
    _ok(["plan", *common, *config, "--short-len", 64, "--long-len", 1024], env[2])
    for i in range(2):
        _ok(["write", *common, *config, "--task-index", i, "--num-tasks", 2], env[1 - i])
    _ok(["finalize", *common[:-1]], env[2])

    assert remote_hashes(out) == reference
    stored = remote_files(work)
    assert any(f.startswith("tokens/files/") and f.endswith(".arrow") for f in stored)
    assert {"plan/group-00000.npz", "plan.json", "tokens/_SUCCESS.json"} <= stored
    assert "packcli-work.json" in stored
    assert {"packcli.json", "README.md", packfs.REMOTE_MARKER} <= remote_files(out)
    for machine in machines:  # every machine cleaned up after itself
        assert _left_in(machine) == []
    meta = json.loads(packfs.locate(out)[0].cat_file(f"{bucket}/out/packcli.json"))
    assert meta["run"]["work_dir"] == work
    # verify finds the work folder the output names, on the store, and checks every
    # document's tokens in the shards against the rows.
    verified = invoke_ok("verify", out)
    assert "all invariants hold" in verified and "against the tokenized shards" in verified
    fs = packfs.locate(work)[0]
    shard = sorted(p for p in fs.find(f"{bucket}/work/tokens") if p.endswith(".arrow"))[0]
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0x01  # a token id changed in a shard: verify must see it
    fs.pipe_file(shard, bytes(data))
    code, output = invoke("verify", out)
    assert code == 1 and f"s3://{shard}: tokenized shard changed" in output, output


def test_pack_with_the_work_folder_on_the_store_reuses_everything_on_a_rerun(
    job: Job, tmp_path: Path
) -> None:
    out, args, bucket = job.out, job.args, job.bucket
    env = job.env(tmp_path / "cache")
    _ok(args, env)
    assert remote_hashes(out) == job.reference
    shards_and_parquet = {
        p: e for p, e in _etags(f"s3://{bucket}").items() if p.endswith((".arrow", ".parquet"))
    }
    again = _ok([a for a in args if a != "-q"], env)
    assert "reused tokenized shards" in again
    after = _etags(f"s3://{bucket}")
    assert {p: after[p] for p in shards_and_parquet} == shards_and_parquet  # nothing put again
    assert remote_hashes(out) == job.reference
    assert _left_in(tmp_path / "cache") == []


def test_files_replaced_on_the_store_at_the_same_size_are_not_reused(
    job: Job, tmp_path: Path
) -> None:
    """A shard and a Parquet file replaced by others of the same size (one byte changed):
    the rerun compares each with the store's version recorded when it was put (not its size),
    tokenizes that unit again and writes that file again (issue 29 item 5)."""
    out, args, bucket = job.out, job.args, job.bucket
    env = job.env(tmp_path / "cache")
    _ok(args, env)
    fs, _ = packfs.locate(out)
    shard = sorted(p for p in fs.find(f"{bucket}/work/tokens") if p.endswith(".arrow"))[0]
    parquet = sorted(p for p in fs.find(f"{bucket}/out/data") if p.endswith(".parquet"))[0]
    originals = {}
    for path in (shard, parquet):
        originals[path] = data = bytes(fs.cat_file(path))
        changed = bytearray(data)
        changed[len(changed) // 2] ^= 0xFF
        fs.pipe_file(path, bytes(changed))
    fs.invalidate_cache()
    again = _ok([a for a in args if a != "-q"], env)
    assert "reused tokenized shards" not in again
    fs.invalidate_cache()
    assert {p: bytes(fs.cat_file(p)) for p in originals} == originals
    assert remote_hashes(out) == job.reference
    assert invoke("verify", out)[0] == 0


def test_a_damaged_list_of_store_versions_vouches_for_no_shard(job: Job, tmp_path: Path) -> None:
    """A unit's ``_STORED.json`` with a version of the wrong type: its shards are not known
    to be those put, so the rerun tokenizes it again (to the same bytes), never misreads it."""
    out, args, bucket = job.out, job.args, job.bucket
    env = job.env(tmp_path / "cache")
    _ok(args, env)
    fs, _ = packfs.locate(out)
    stored = sorted(p for p in fs.find(f"{bucket}/work/tokens") if p.endswith("_STORED.json"))
    versions = json.loads(fs.cat_file(stored[0]))
    fs.pipe_file(stored[0], json.dumps({name: "etag" for name in versions}).encode())
    fs.invalidate_cache()
    again = _ok([a for a in args if a != "-q"], env)
    assert "reused tokenized shards" not in again
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(stored[0])).keys() == versions.keys()  # written again
    assert remote_hashes(out) == job.reference


def test_foreign_parquet_under_the_output_is_refused_with_the_work_folder_on_the_store(
    job: Job, tmp_path: Path
) -> None:
    """Another team's Parquet file under ``--out``'s ``data/long/``: refused by name before
    any work, ``--overwrite`` or not, and left there (issue 29 item 6)."""
    fs, _ = packfs.locate(job.out)
    fs.pipe_file(f"{job.bucket}/out/data/long/mine.parquet", b"their data")
    done = run_process([*job.args, "--overwrite"], env=job.env(tmp_path / "cache"))
    assert done.returncode == 1, done.stderr
    assert "data/long/mine.parquet" in done.stderr and "packcli did not write" in done.stderr
    assert remote_files(job.out) == {"data/long/mine.parquet"}
    assert not remote_files(f"s3://{job.bucket}/work")


@pytest.mark.parametrize("point", ["tokenize:2", "plan", "write:long:0", "finalize"])
def test_killed_run_with_the_work_folder_on_the_store_resumes_to_identical_bytes(
    job: Job, tmp_path: Path, point: str
) -> None:
    out, args = job.out, job.args
    killed = run_process(args, env=job.env(tmp_path / "first"), crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "packcli.json" not in remote_files(out)
    # The rerun is another machine: all it finds is on the store.
    _ok(args, job.env(tmp_path / "second"))
    assert remote_hashes(out) == job.reference
    assert invoke("verify", out)[0] == 0


def test_work_folder_url_refusals(
    s3: dict[str, str], corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    inputs = [f"s3://{bucket}/in/", "-t", toy_tokenizer_path, *cfg(corpus)]
    code, output = invoke("pack", *inputs, "-o", tmp_path / "out", "--work-dir", f"s3://{bucket}/w")
    assert code == 1
    assert f"--work-dir s3://{bucket}/w is on object storage, so --out must be too" in output
    fs, _ = packfs.locate(f"s3://{bucket}")
    fs.pipe_file(f"{bucket}/theirs/notes.txt", b"not packcli's")
    out = f"s3://{bucket}/out"
    code, output = invoke("pack", *inputs, "-o", out, "--work-dir", f"s3://{bucket}/theirs")
    assert code == 1
    assert f"work folder s3://{bucket}/theirs is not empty and is not packcli's" in output
    assert remote_files(f"s3://{bucket}/theirs") == {"notes.txt"}
    assert not remote_files(out)


# --------------------------------------------------------------------------- Ray, two nodes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``ray start --block`` in a session of its own: its whole process group (raylet, GCS,
    workers) is stopped at the end, and nothing else on the machine is touched."""
    ray = Path(sys.executable).with_name("ray")
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [str(ray), "start", "--block", "--disable-usage-stats", *args],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(node: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            return
        try:
            node.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait  # the group's other processes
        while time.monotonic() < deadline:
            try:
                os.killpg(node.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.fixture
def two_node_cluster(
    s3: dict[str, str], tmp_path: Path
) -> Iterator[tuple[str, dict[str, str], list[Path]]]:
    """A Ray head and a worker node, one CPU each, with separate temp folders and caches;
    the S3 endpoint reaches their tasks through the nodes' environment."""
    pytest.importorskip("ray")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    home = tmp_path / "home"
    home.mkdir()
    # Ray's sockets live in its temp folder, and a socket path has at most 107 bytes.
    short = Path(tempfile.mkdtemp(prefix="pk-ray-", dir="/tmp"))
    # Ray 2.5x turns token auth on in a process that started a local cluster (an earlier
    # test's ray.init), and keeps the token under HOME: this cluster is plain and private.
    isolated = {"HOME": str(home), "RAY_AUTH_MODE": "disabled"}
    caches = [tmp_path / "head-cache", tmp_path / "worker-cache"]
    nodes: list[subprocess.Popen[bytes]] = []
    common = ["--num-cpus", "1"]
    try:
        head_env = _env(s3, caches[0], **isolated)
        nodes.append(
            _ray_node(
                ["--head", "--port", str(port), "--include-dashboard", "false",
                 "--temp-dir", str(short / "head"), *common],
                head_env, tmp_path / "head.log",
            )
        )  # fmt: skip
        _wait_for_nodes(address, 1, head_env, nodes[0], tmp_path / "head.log")
        worker_env = _env(s3, caches[1], **isolated)
        nodes.append(
            _ray_node(
                ["--address", address, "--temp-dir", str(short / "worker"),
                 "--dashboard-agent-listen-port", "0", *common],
                worker_env, tmp_path / "worker.log",
            )
        )  # fmt: skip
        _wait_for_nodes(address, 2, head_env, nodes[1], tmp_path / "worker.log")
        yield address, _env(s3, tmp_path / "driver-cache", **isolated), caches
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(short, ignore_errors=True)


def _wait_for_nodes(
    address: str, count: int, env: dict[str, str], node: subprocess.Popen[bytes], log: Path
) -> None:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + 180
    time.sleep(3)
    while time.monotonic() < deadline:
        assert node.poll() is None, log.read_text(errors="replace")[-3000:]
        try:  # a connection made while the node is starting may hang: give up and retry
            done = subprocess.run(
                [sys.executable, "-c", probe, address],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            continue
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1)
    raise AssertionError(f"Ray cluster not up with {count} node(s): {log.read_text()[-3000:]}")


def test_ray_on_two_nodes_sharing_only_the_store(
    two_node_cluster: tuple[str, dict[str, str], list[Path]], job: Job
) -> None:
    """``--executor ray`` on a head and a worker node whose disks are apart: the tokenize and
    write tasks run on both nodes, and the Parquet bytes equal a local one-process run."""
    address, driver_env, caches = two_node_cluster
    out = job.out
    args = [*job.args, "--executor", "ray", "--ray-address", address, "--num-tasks", 2]
    _ok(args, driver_env)
    assert remote_hashes(out) == job.reference
    for cache in caches:  # both nodes ran tasks (each made its mirror), and left no files
        assert list((cache / "mirrors").glob("*/*")), cache
        assert _left_in(cache) == []
    assert "all invariants hold" in invoke_ok("verify", out)


def _moved(args: list[Any], bucket: str, name: str) -> list[Any]:
    """``args`` with the output and work folder under ``s3://BUCKET/NAME``."""
    args = list(args)
    args[args.index("-o") + 1] = f"s3://{bucket}/{name}/out"
    args[args.index("--work-dir") + 1] = f"s3://{bucket}/{name}/work"
    return args


def test_ray_retries_a_write_task_whose_worker_was_killed(
    two_node_cluster: tuple[str, dict[str, str], list[Path]], job: Job, tmp_path: Path
) -> None:
    """SIGKILL the Ray worker running a write task in the middle of the write stage (after
    its first files are up): Ray runs the task again, the retry resumes from the records, and
    the Parquet bytes equal a local run's. Several groups, so both nodes write."""
    address, driver_env, _ = two_node_cluster
    grouped = [*job.args, "--group-tokens", 6000]
    local = _moved(grouped, job.bucket, "local")
    _ok(local, driver_env)
    reference = remote_hashes(f"s3://{job.bucket}/local/out")
    assert len([k for k in reference if "/long/" in k]) >= 3
    marker = tmp_path / "killed-once"
    env = {**driver_env, "PACKCLI_CRASH_AT": "write:long:1", "PACKCLI_CRASH_ONCE": str(marker)}
    ray = _moved(grouped, job.bucket, "ray")
    ray += ["--executor", "ray", "--ray-address", address, "--num-tasks", 2]
    done = subprocess.run(
        [sys.executable, "-m", "packcli", *map(str, ray)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert marker.exists()  # a worker was killed at that point
    assert remote_hashes(f"s3://{job.bucket}/ray/out") == reference
    # verify as tasks on the same cluster: each worker reads its parts' files and shards.
    on_ray = ["verify", f"s3://{job.bucket}/ray/out", "--executor", "ray", "--ray-address"]
    said = _ok([*on_ray, address, "--num-tasks", 2], driver_env)
    assert "all invariants hold" in said and "in 2 task(s)" in said, said


@pytest.mark.parametrize("num_tasks", [1, 8])
def test_write_tasks_fetch_each_shard_about_once(
    s3: dict[str, str],
    s3_log: RequestLog,
    corpus: Path,
    toy_tokenizer_path: Path,
    bucket: str,
    tmp_path: Path,
    num_tasks: int,
) -> None:
    """Write tasks as separate machines on the store: together they fetch at most 1.1x the
    token shards' bytes (each shard once, by the task writing its group), whatever their
    number, counted by the S3 server itself."""
    upload(corpus, f"s3://{bucket}/in", "*.jsonl.zst")
    out, work = f"s3://{bucket}/out", f"s3://{bucket}/work"
    common = ["-o", out, "--work-dir", work, "-q", "-c", corpus / "cfg.yaml"]
    plan = ["--short-len", 64, "--long-len", 1024, "--group-tokens", 6000]
    env = _env(s3, tmp_path / "driver")
    _ok(["tokenize", f"s3://{bucket}/in/*.jsonl.zst", "-t", toy_tokenizer_path, *common], env)
    _ok(["plan", *common, *plan], env)
    fs = packfs.locate(work)[0]
    shards = {p: fs.size(p) for p in fs.find(f"{bucket}/work/tokens") if p.endswith(".arrow")}
    parts = json.loads(fs.cat_file(f"{bucket}/work/plan.json"))["parts"]
    assert len(shards) >= 4 and len(parts) >= 4  # groups (and a tail) to spread over tasks
    s3_log.take()
    for i in range(num_tasks):
        _ok(
            ["write", *common, "--task-index", i, "--num-tasks", num_tasks],
            _env(s3, tmp_path / f"m{i}"),
        )
    gets = [r for r in s3_log.take() if r.op == "GET"]
    fetched = sum(r.sent for r in gets if f"{r.bucket}/{r.key}" in shards)
    assert fetched <= 1.1 * sum(shards.values()), (fetched, sum(shards.values()))
    _ok(["finalize", "-o", out, "--work-dir", work], env)
    gets += [r for r in s3_log.take() if r.op == "GET"]
    # The tail's own shards (the released pieces' tokens): put once, and fetched once by
    # finalize, which writes the tail's files after separate write tasks; never by a single
    # write task, which cut them itself and writes the tail's files from its own copies.
    fs.invalidate_cache()
    tails = {p: fs.size(p) for p in fs.find(f"{bucket}/work/write") if p.endswith(".arrow")}
    assert tails and len(tails) == len(parts) - 1
    fetched = sum(r.sent for r in gets if f"{r.bucket}/{r.key}" in tails)
    allowed = 0.0 if num_tasks == 1 else 1.1
    assert fetched <= allowed * sum(tails.values()), (fetched, sum(tails.values()))
    # verify, as tasks, fetches each data file and each shard about once (no whole copy).
    data = {p: fs.size(p) for p in fs.find(f"{bucket}/out/data") if p.endswith(".parquet")}
    s3_log.take()
    said = _ok(["verify", out, "--num-tasks", num_tasks], _env(s3, tmp_path / "verify"))
    assert "all invariants hold" in said, said
    gets = [r for r in s3_log.take() if r.op == "GET"]
    for files in (data, shards):
        fetched = sum(r.sent for r in gets if f"{r.bucket}/{r.key}" in files)
        assert fetched <= 1.1 * sum(files.values()), (fetched, sum(files.values()))


def test_byte_spans_of_a_remote_file_fetch_about_their_bytes(
    s3: dict[str, str], s3_log: RequestLog, bucket: str, tmp_path: Path
) -> None:
    """Reading a remote jsonl as 1 MiB byte spans (the smallest allowed) fetches about two
    spans' bytes per span (the span, its last line and one read-ahead block), not a store's
    whole read-ahead (s3fs: 50 MiB, from each span to the end: ~6x this file's bytes); at
    the default 1 GiB spans that overshoot is ~0.5%. Every document is read once."""
    corpus = mixed_corpus(tmp_path / "big.jsonl", 36000, 4)
    size = corpus.stat().st_size
    assert size > 10 << 20
    upload(tmp_path, f"s3://{bucket}/in", "big.jsonl")
    url = f"s3://{bucket}/in/big.jsonl"
    s3_log.take()
    docs = 0
    for lo in range(0, size, 1 << 20):
        span = (lo, min(size, lo + (1 << 20)))
        docs += sum(len(b.texts) for b in iter_batches([url], span=span))  # type: ignore[list-item]
    assert docs == 36000
    read = sum(r.sent for r in s3_log.take() if r.op == "GET" and r.key == "in/big.jsonl")
    assert size <= read <= 2.5 * size, (read, size)


MIXTURE = """sources:
  - name: web
    inputs: [{web}]
    weight: 1.5
  - name: books
    inputs: [{books}]
    weight: 0.5
plan:
  short_len: 64
  long_len: 512
  group_tokens: 6000
"""


def test_grouped_mixture_tasks_on_machines_sharing_only_the_store(
    s3: dict[str, str], toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """A grouped mixture (one file per source, so groups cut inside shards) as stage
    commands on machines sharing only the store: plan tasks on two machines read the cut
    one of them saved (``plan/groups.json``, pushed to the store), the second pass and the
    write tasks elsewhere; the bytes are a local pack's, and verify checks the parts' runs
    against the shards on the store."""
    import random

    rng = random.Random(3)
    files = {}
    for name, (lo, hi, n) in {"web": (1, 30, 300), "books": (60, 240, 60)}.items():
        files[name] = tmp_path / f"{name}.jsonl"
        lines = (
            " ".join(rng.choice("abcde") for _ in range(rng.randint(lo, hi))) for _ in range(n)
        )
        files[name].write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
        upload(tmp_path, f"s3://{bucket}/in", f"{name}.jsonl")
    local_cfg = tmp_path / "local.yaml"
    local_cfg.write_text(MIXTURE.format(**files))
    remote = {k: f"s3://{bucket}/in/{p.name}" for k, p in files.items()}
    remote_cfg = tmp_path / "remote.yaml"
    remote_cfg.write_text(MIXTURE.format(**remote))
    ref = tmp_path / "ref"
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", ref, "-c", local_cfg, "-q")
    out, work = f"s3://{bucket}/out", f"s3://{bucket}/work"
    common = ["-o", out, "--work-dir", work, "-q", "-c", remote_cfg]
    env = [_env(s3, tmp_path / f"machine-{i}") for i in range(3)]
    _ok(["tokenize", "-t", toy_tokenizer_path, *common], env[0])
    for i in range(2):
        _ok(["plan", *common, "--task-index", i, "--num-tasks", 2], env[i])
    _ok(["plan", *common], env[2])
    for i in range(2):
        _ok(["write", *common, "--task-index", i, "--num-tasks", 2], env[1 - i])
    _ok(["finalize", *common[:-3]], env[2])
    assert remote_hashes(out) == local_hashes(ref)
    assert "plan/groups.json" in remote_files(work)
    meta = json.loads(packfs.locate(out)[0].cat_file(f"{bucket}/out/packcli.json"))
    groups = [p for p in meta["parts"] if p["name"] != "tail"]
    assert len(groups) >= 3 and all(p.get("slices") for p in groups)
    assert any(a > 0 for p in groups for _, a, _ in p["slices"])  # a shard cut inside
    verified = invoke_ok("verify", out)
    assert "all invariants hold" in verified and "against the tokenized shards" in verified
