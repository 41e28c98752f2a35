"""Inputs and outputs on object storage, against a real local S3 server (moto in server mode:
the S3 HTTP API, driven by the real s3fs / botocore clients), started once for the module."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import zstandard
from clirun import invoke, invoke_ok, run_process
from corpora import mixed_corpus, write_corpus
from s3local import (
    ARGS,
    CONFIG,
    cfg,
    local_hashes,
    remote_files,
    remote_hashes,
    remote_pack,
    upload,
)

from packcli import fs as packfs
from packcli.errors import ConfigError

# --------------------------------------------------------------------------- s3 -> s3


def test_pack_from_s3_to_s3_verifies_and_matches_local_bytes(
    corpus: Path, reference: dict[str, str], toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    work = tmp_path / "stage"
    out, args = remote_pack(corpus, bucket, toy_tokenizer_path, work)
    output = invoke_ok(*args)
    assert f"wrote     {out}" in output
    assert remote_hashes(out) == reference
    files = remote_files(out)
    assert {"packcli.json", "README.md", packfs.REMOTE_MARKER} <= files
    assert not any(f.startswith(".packcli/tokens") for f in files)  # the work folder stays local
    meta = json.loads(packfs.locate(out)[0].cat_file(f"{bucket}/out/packcli.json"))
    inputs = meta["run"]["inputs"]
    assert [i["path"] for i in inputs] == [f"s3://{bucket}/in/part-{i}.jsonl.zst" for i in range(3)]
    # A remote file's identity: its size and the store's version fields (ETag, mtime).
    assert all(i["version"]["etag"] and i["version"]["mtime"] for i in inputs)
    assert meta["config"]["out"] == out and meta["run"]["work_dir"] == ".packcli"

    verified = invoke_ok("verify", out)
    # The shards are in --work-dir, which verify is not told: checked without them.
    assert "OK: all invariants hold (tokenized shards not present" in verified
    assert "input documents encoded again match the output" in verified

    # A rerun uploads nothing: every file is in the upload log and still there.
    log = work / ".packcli" / packfs.UPLOAD_LOG
    before = log.read_text()
    invoke_ok(*args)
    assert log.read_text() == before


def test_verify_names_the_url_when_a_remote_file_is_damaged(
    corpus: Path, toy_tokenizer_path: Path, bucket: str
) -> None:
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    out = f"s3://{bucket}/out"
    invoke_ok("pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus))
    fs, _ = packfs.locate(out)
    victim = sorted(p for p in fs.find(f"{bucket}/out/data/long") if p.endswith(".parquet"))[0]
    data = bytearray(fs.cat_file(victim))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(victim, bytes(data))
    code, output = invoke("verify", out)
    assert code == 1
    assert "content hash differs from packcli.json" in output
    assert "packcli-verify-" not in output  # the temp copy is never named
    code, output = invoke("verify", f"s3://{bucket}/nothing")
    assert code == 1
    missing = "no packcli.json, so the output is missing or incomplete"
    assert output == f"error: s3://{bucket}/nothing: {missing}\n"


def test_parquet_input_from_s3_gives_the_local_bytes(
    corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    local = tmp_path / "pq"
    local.mkdir()
    for i in range(2):
        rows = [json.loads(line) for line in _lines(corpus / f"part-{i}.jsonl.zst")]
        pq.write_table(pa.Table.from_pylist(rows), local / f"p{i}.parquet", row_group_size=7)
    ref = tmp_path / "ref"
    invoke_ok("pack", local, "-t", toy_tokenizer_path, "-o", ref, *cfg(corpus))
    upload(local, f"s3://{bucket}/pq")
    # Row-group units across two tasks: ranged reads of the remote footer and column chunks.
    out = tmp_path / "out"
    invoke_ok(
        "pack", f"s3://{bucket}/pq/*.parquet", "-t", toy_tokenizer_path, "-o", out,
        "--num-tasks", "2", "--split-bytes", "1048576", *cfg(corpus),
    )  # fmt: skip
    assert local_hashes(out) == local_hashes(ref)


def _lines(path: Path) -> list[bytes]:
    return zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()).splitlines()


def test_changed_remote_input_is_tokenized_again(
    corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """Same name, same size, other bytes: the ETag differs, so the shards are not reused."""
    src = tmp_path / "a.jsonl"
    write_corpus(src, [5] * 40, seed=1)
    url = f"s3://{bucket}/in/a.jsonl"
    fs, _ = packfs.locate(url)
    fs.put_file(str(src), f"{bucket}/in/a.jsonl")
    out = tmp_path / "out"
    run = ["pack", url, "-t", toy_tokenizer_path, "-o", out, *cfg(corpus)]
    invoke_ok(*run)
    first = local_hashes(out)
    data = src.read_bytes()
    swapped = data.replace(b'"text": "', b'"text": "X', 1).replace(b'"id": 0', b'"id":0', 1)
    assert len(swapped) == len(data) and swapped != data
    fs.pipe_file(f"{bucket}/in/a.jsonl", swapped)
    src.write_bytes(swapped)
    invoke_ok(*run)
    ref = tmp_path / "ref"
    invoke_ok("pack", src, "-t", toy_tokenizer_path, "-o", ref, *cfg(corpus))
    assert local_hashes(out) == local_hashes(ref) != first


def test_byte_spans_and_damaged_streams_read_remotely_as_locally(
    corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Spans of a plain file (seek, ranged reads) and a damaged .zst under skip: the same
    bytes, the same quarantine as the local files give."""
    import packcli.config

    monkeypatch.setattr(packcli.config, "MIN_SPLIT_BYTES", 1)
    local = tmp_path / "in"
    local.mkdir()
    mixed_corpus(local / "big.jsonl", 150, 4)
    damaged = bytearray((corpus / "part-1.jsonl.zst").read_bytes())
    damaged[-40] ^= 0xFF  # inside the second frame: its checksum fails
    (local / "bad.jsonl.zst").write_bytes(bytes(damaged))
    upload(local, f"s3://{bucket}/in")
    opts = ["--split-bytes", "4000", "--on-bad-line", "skip", *cfg(corpus)]
    ref, out = tmp_path / "ref", tmp_path / "out"
    invoke_ok("pack", local, "-t", toy_tokenizer_path, "-o", ref, *opts)
    invoke_ok("pack", f"s3://{bucket}/in", "-t", toy_tokenizer_path, "-o", out, *opts)
    assert local_hashes(out) == local_hashes(ref)
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (ref / "rejected.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejected] == ["corrupt_stream"]
    assert rejected[0]["line"] == expected[0]["line"]
    assert rejected[0]["file"] == f"s3://{bucket}/in/bad.jsonl.zst"


# --------------------------------------------------------------------------- kills


@pytest.mark.parametrize("point", ["write:long:0", "write:long:1", "upload:1"])
def test_killed_remote_run_resumes_to_identical_bytes(
    s3: dict[str, str],
    corpus: Path,
    reference: dict[str, str],
    toy_tokenizer_path: Path,
    bucket: str,
    tmp_path: Path,
    point: str,
) -> None:
    out, args = remote_pack(corpus, bucket, toy_tokenizer_path, tmp_path / "stage")
    killed = run_process(["-v", *args], env=s3, crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "packcli.json" not in remote_files(out)  # nothing vouches for a partial output
    log = tmp_path / "stage" / ".packcli" / packfs.UPLOAD_LOG
    put_before = [json.loads(line) for line in log.read_text().splitlines()]
    # Each Parquet file went up as soon as it was written (uploads overlap writing), so the
    # kill in the write stage leaves some up already; finalize then puts the rest, the card
    # first (upload:1 is right after it) and packcli.json last.
    names = [p["file"] for p in put_before]
    if point.startswith("write"):
        assert names and all(n.endswith(".parquet") for n in names)
    else:
        assert names[-1] == "README.md" and all(n.endswith(".parquet") for n in names[:-1])
    there = _sizes(out)
    assert all(there[p["file"]] == p["size"] for p in put_before)
    rerun = run_process(["-v", *args], env=s3)
    assert rerun.returncode == 0, rerun.stderr
    assert remote_hashes(out) == reference
    put = [json.loads(line)["file"] for line in log.read_text().splitlines()]
    assert len(put) == len(set(put))  # no file uploaded twice
    assert put[-1] == "packcli.json"
    assert invoke("verify", out)[0] == 0


def test_a_parquet_file_up_before_its_record_is_not_put_again(
    corpus: Path, reference: dict[str, str], toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """A write task killed after it uploaded a file and before it wrote the file's record:
    the rerun writes the same bytes again, finds them logged and on the store, and does
    not put them a second time."""
    work = tmp_path / "stage"
    out, args = remote_pack(corpus, bucket, toy_tokenizer_path, work)
    invoke_ok(*args)
    log = work / ".packcli" / packfs.UPLOAD_LOG
    (work / ".packcli" / "write" / "long-00001.json").unlink()  # as if killed before it
    invoke_ok(*args)
    put = [json.loads(line)["file"] for line in log.read_text().splitlines()]
    assert put.count("data/long/train-00001-of-00003.parquet") == 1
    assert remote_hashes(out) == reference
    assert "packcli.json" in remote_files(out)


def _sizes(url: str) -> dict[str, int]:
    fs, prefix = packfs.locate(url)
    fs.invalidate_cache()
    return {p[len(prefix) + 1 :]: int(i["size"]) for p, i in fs.find(prefix, detail=True).items()}


# --------------------------------------------------------------------------- refusals


def test_foreign_remote_prefix_is_refused(
    corpus: Path, toy_tokenizer_path: Path, bucket: str
) -> None:
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    fs, _ = packfs.locate(f"s3://{bucket}")
    fs.pipe_file(f"{bucket}/theirs/notes.txt", b"not packcli's")
    out = f"s3://{bucket}/theirs"
    code, output = invoke(
        "pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus)
    )
    assert code == 1
    assert f"output {out} is not empty and is not a packcli output" in output
    assert "--overwrite" in output
    assert remote_files(out) == {"notes.txt"}  # nothing written there
    invoke_ok(
        "pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, "--overwrite",
        *cfg(corpus),
    )  # fmt: skip
    assert "notes.txt" in remote_files(out) and "packcli.json" in remote_files(out)


def test_missing_filesystem_package_names_the_extra(
    s3: dict[str, str], toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = sys.modules["fsspec.registry"]._registry  # fsspec.registry is also a mapping
    monkeypatch.delitem(registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # "not installed"
    code, output = invoke(
        "pack", "s3://bucket/in/*.jsonl", "-t", toy_tokenizer_path, "-o", tmp_path / "out"
    )
    assert code == 1
    assert output.strip().splitlines() == [
        "error: s3://bucket/in/*.jsonl: s3:// URLs need s3fs, which is not installed: "
        "pip install 'packcli[s3]'"
    ]
    with pytest.raises(ConfigError, match=r"pip install 'packcli\[gcs\]'"):
        monkeypatch.delitem(registry, "gs", raising=False)
        monkeypatch.setitem(sys.modules, "gcsfs", None)
        packfs.locate("gs://bucket/x.parquet")


def test_secrets_in_urls_are_redacted() -> None:
    assert packfs.redact("ftp://me:hunter2@host/x.jsonl") == "ftp://me:***@host/x.jsonl"
    signed = "https://h/x.parquet?versionId=7&X-Amz-Signature=abc&X-Amz-Credential=k%2Fs"
    assert (
        packfs.redact(signed)
        == "https://h/x.parquet?versionId=7&X-Amz-Signature=***&X-Amz-Credential=***"
    )
    assert packfs.redact("s3://bucket/in/a.jsonl") == "s3://bucket/in/a.jsonl"
    assert packfs.redact("/local/path") == "/local/path"
    text = "packcli pack ftp://u:pw@h/a.jsonl -o s3://b/out"
    assert packfs.redact_text(text) == "packcli pack ftp://u:***@h/a.jsonl -o s3://b/out"


def test_file_urls_are_local_paths(
    corpus: Path, reference: dict[str, str], toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    invoke_ok(
        "pack", f"file://{corpus}/", "-t", toy_tokenizer_path, "-o", f"file://{out}", *cfg(corpus)
    )
    assert local_hashes(out) == reference


# --------------------------------------------------------------------------- push


def test_push_from_s3(
    corpus: Path, toy_tokenizer_path: Path, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    upload(corpus, f"s3://{bucket}/in", "part-2.jsonl.zst")
    out = f"s3://{bucket}/out"
    invoke_ok("pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus))
    # Made in the default staging folder on this machine: verify finds this run's shards.
    assert "and against the tokenized shards" in invoke_ok("verify", out)
    listing = invoke_ok("push", out, "me/packed", "--dry-run")
    expected = sorted(f for f in remote_files(out) if f.endswith(".parquet"))
    assert all(f in listing for f in ["README.md", "packcli.json", *expected])
    assert "packcli-push-" not in listing

    seen: dict[str, bytes] = {}

    def upload_folder(self: Any, **kwargs: Any) -> None:
        folder = Path(kwargs["folder_path"])
        for p in folder.rglob("*"):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and rel in [x.replace("\\", "") for x in kwargs["allow_patterns"]]:
                seen[rel] = p.read_bytes()

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **k: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.delattr(huggingface_hub.HfApi, "upload_large_folder", raising=False)
    invoke_ok("push", out, "me/packed", "--no-prune")
    fs, _ = packfs.locate(out)
    assert sorted(seen) == sorted(["README.md", "packcli.json", *expected])
    assert all(seen[rel] == fs.cat_file(f"{bucket}/out/{rel}") for rel in seen)


def test_changed_output_replaces_the_remote_one_marker_first(
    s3: dict[str, str], corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """A finished remote output packed again with other settings: its packcli.json goes
    before the first new file is put (a kill leaves no marker vouching for a mix), and its
    Parquet files that the new output lacks are deleted before the new marker."""
    upload(corpus, f"s3://{bucket}/in", "*.jsonl.zst")
    out = f"s3://{bucket}/out"
    base = ["pack", f"s3://{bucket}/in/", "-t", str(toy_tokenizer_path), "-o", out]
    base += ["--work-dir", str(tmp_path / "stage"), *ARGS]
    assert run_process(["-v", *base, "-c", str(corpus / "cfg.yaml")], env=s3).returncode == 0
    first = remote_hashes(out)
    bigger = tmp_path / "bigger.yaml"
    bigger.write_text(CONFIG.replace("shard_tokens: 8192", "shard_tokens: 30000"))
    killed = run_process(["-v", *base, "-c", str(bigger)], env=s3, crash="upload:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "packcli.json" not in remote_files(out)
    assert run_process(["-v", *base, "-c", str(bigger)], env=s3).returncode == 0
    ref = tmp_path / "ref"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", ref, "-c", bigger, *ARGS)
    assert remote_hashes(out) == local_hashes(ref)
    assert len(first) > len(local_hashes(ref))  # the earlier output's extra files are gone
    assert invoke("verify", out)[0] == 0


def test_a_remote_compressed_input_is_fetched_once(
    corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A .zst is decoded twice (checksums first, then the lines): from the store it is
    fetched once, into a temp file that is gone afterwards, and the bytes are the local
    run's."""
    upload(corpus, f"s3://{bucket}/in", "*.zst")
    zst = sorted(p.name for p in corpus.glob("*.zst"))
    assert zst
    fetched: list[str] = []
    opened: list[str] = []
    real_get, real_open = s3fs.S3FileSystem._get_file, s3fs.S3FileSystem._open

    async def _get_file(self: Any, rpath: str, lpath: str, **kw: Any) -> Any:
        fetched.append(rpath)
        return await real_get(self, rpath, lpath, **kw)

    def _open(self: Any, path: str, *args: Any, **kw: Any) -> Any:
        opened.append(path)
        return real_open(self, path, *args, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_get_file", _get_file)
    monkeypatch.setattr(s3fs.S3FileSystem, "_open", _open)
    s3fs.S3FileSystem.clear_instance_cache()  # instances bind their sync methods when made
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(tmp_path / "cache"))
    ref, out = tmp_path / "ref", tmp_path / "out"
    local = tmp_path / "local"
    local.mkdir()
    for name in zst:
        (local / name).write_bytes((corpus / name).read_bytes())
    invoke_ok("pack", local, "-t", toy_tokenizer_path, "-o", ref, *cfg(corpus))
    invoke_ok("pack", f"s3://{bucket}/in", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus))
    assert local_hashes(out) == local_hashes(ref)
    for name in zst:
        assert sum(p.endswith(name) for p in fetched) == 1, (fetched, opened)
    # Apart from the self-check's quick look at the first lines, nothing reads them again.
    assert sum(p.endswith(zst[-1]) for p in opened) == 0, (opened, fetched)
    assert not list((tmp_path / "cache" / "spool").glob("*"))


def test_an_output_or_work_folder_in_a_missing_bucket_fails_before_any_work(
    s3: dict[str, str], corpus: Path, toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """``-o s3://no-such-bucket/x``: one line naming the URL before anything is read,
    tokenized or staged (the job used to run whole, then fail at the upload)."""
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    inputs = [f"s3://{bucket}/in/", "-t", toy_tokenizer_path, *cfg(corpus)]
    missing = f"t-missing-{bucket[2:]}"
    stage = tmp_path / "stage"
    code, output = invoke("pack", *inputs, "-o", f"s3://{missing}/x", "--work-dir", stage)
    assert code == 1 and output.count("\n") == 1, output
    assert output.startswith(f"error: output s3://{missing}/x is not writable: "), output
    assert "rerun the same command" not in output
    assert not (stage / ".packcli" / "tokens").exists()  # nothing tokenized
    code, output = invoke(
        "pack", *inputs, "-o", f"s3://{bucket}/out", "--work-dir", f"s3://{missing}/w"
    )
    assert code == 1 and output.startswith(f"error: work folder s3://{missing}/w is not writable")
    assert not remote_files(f"s3://{bucket}/out")
    # A bucket that is there: the probe leaves nothing behind.
    invoke_ok("pack", *inputs, "-o", f"s3://{bucket}/ok")
    assert not [f for f in remote_files(f"s3://{bucket}/ok") if "probe" in f]


# --------------------------------------------------------------------------- issue 29: 5, 6


def _same_size_other_bytes(url: str, rel: str) -> bytes:
    """Replace ``rel`` under ``url`` with a file of the same size and other bytes (one byte
    changed); returns what was there."""
    fs, prefix = packfs.locate(url)
    before = bytes(fs.cat_file(f"{prefix}/{rel}"))
    data = bytearray(before)
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(f"{prefix}/{rel}", bytes(data))
    fs.invalidate_cache()
    return before


def test_a_remote_file_replaced_at_the_same_size_is_uploaded_again(
    corpus: Path, reference: dict[str, str], toy_tokenizer_path: Path, bucket: str, tmp_path: Path
) -> None:
    """The upload log and the store's size agree, but the bytes are not packcli's: the rerun
    compares the store's version (ETag) with the one it got at upload time, puts the file
    again, and the remote files are those packcli.json's hashes describe."""
    out, args = remote_pack(corpus, bucket, toy_tokenizer_path, tmp_path / "stage")
    invoke_ok(*args)
    victim = sorted(remote_hashes(out))[0]
    _same_size_other_bytes(out, victim)
    assert remote_hashes(out) != reference
    invoke_ok(*args)
    assert remote_hashes(out) == reference
    meta = json.loads(packfs.locate(out)[0].cat_file(f"{bucket}/out/packcli.json"))
    listed = {
        f"data/{n}/{f['file']}": f["sha256"] for n in ("long", "short") for f in meta["files"][n]
    }
    assert listed == remote_hashes(out)
    assert invoke("verify", out)[0] == 0


def test_overwrite_on_a_shared_prefix_never_deletes_other_peoples_files(
    corpus: Path, toy_tokenizer_path: Path, bucket: str
) -> None:
    """``-o s3://bucket/shared --overwrite``: other teams' files where packcli writes are
    refused by name, nothing is written; once they are moved, the others stay."""
    upload(corpus, f"s3://{bucket}/in", "part-0.jsonl.zst")
    fs, _ = packfs.locate(f"s3://{bucket}")
    theirs = {
        "data/long/mine.parquet": b"their long data",
        "data/short/other-team.parquet": b"their short data",
        "rejected.jsonl": b'{"their": "rejects"}\n',
        "notes.txt": b"their notes",
    }
    for rel, data in theirs.items():
        fs.pipe_file(f"{bucket}/shared/{rel}", data)
    out = f"s3://{bucket}/shared"
    args = ["pack", f"s3://{bucket}/in/", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus)]
    code, output = invoke(*args, "--overwrite")
    assert code == 1 and output.count("\n") == 1, output
    for rel in ("data/long/mine.parquet", "data/short/other-team.parquet", "rejected.jsonl"):
        assert rel in output
    assert "notes.txt" not in output
    assert remote_files(out) == set(theirs)
    for rel in ("data/long/mine.parquet", "data/short/other-team.parquet", "rejected.jsonl"):
        fs.rm_file(f"{bucket}/shared/{rel}")
    invoke_ok(*args, "--overwrite")
    assert fs.cat_file(f"{bucket}/shared/notes.txt") == b"their notes"
    # A Parquet file dropped into the finished output later: refused, not deleted.
    fs.pipe_file(f"{bucket}/shared/data/long/mine.parquet", b"their long data")
    code, output = invoke(*args, "--long-len", "512")
    assert code == 1 and "data/long/mine.parquet" in output, output
    assert fs.cat_file(f"{bucket}/shared/data/long/mine.parquet") == b"their long data"
    assert "packcli.json" in remote_files(out)


def test_a_failed_store_call_is_one_redacted_line_of_the_callers_error() -> None:
    class Boto(Exception):
        pass

    class Mine(ConfigError):
        pass

    def fails() -> None:
        raise Boto(
            "An error occurred (SlowDown) on https://bucket.example/key?X-Amz-Signature=abc123\n"
            "Traceback line two"
        )

    with pytest.raises(Mine) as err:
        packfs.store_call(fails, "work folder s3://b/w: cannot read x", "rerun to resume", Mine)
    message = str(err.value)
    assert message.startswith("work folder s3://b/w: cannot read x: Boto: An error occurred")
    assert message.endswith("; rerun to resume") and "\n" not in message
    assert "abc123" not in message and "line two" not in message
    assert isinstance(err.value.__cause__, Boto)

    def ours() -> None:
        raise ConfigError("already one of packcli's, with its own words")

    with pytest.raises(ConfigError, match=r"^already one of packcli's, with its own words$"):
        packfs.store_call(ours, "x", "y", Mine)
    assert packfs.store_call(lambda: 7, "x", "y") == 7


@pytest.mark.parametrize("marker", [b'{"packcli_work": 1, "out": 5}', b'{"packcli_work": 1'])
def test_a_damaged_marker_of_a_started_upload_does_not_claim_the_prefix(
    bucket: str, marker: bytes
) -> None:
    fs, _ = packfs.locate(f"s3://{bucket}")
    out = f"s3://{bucket}/started-{len(marker)}"
    fs.pipe_file(f"{out[5:]}/data/long/train-00000-of-00001.parquet", b"killed upload")
    fs.pipe_file(f"{out[5:]}/{packfs.REMOTE_MARKER}", marker)
    with pytest.raises(ConfigError, match="is not empty and is not a packcli output"):
        packfs.check_remote_output(out, overwrite=False)
    fs.pipe_file(f"{out[5:]}/{packfs.REMOTE_MARKER}", packfs.WorkMarker.naming(out).compact())
    # Claimed now: only its unlisted data file is refused (the upload log names none).
    with pytest.raises(ConfigError, match="1 file\\(s\\) packcli did not write"):
        packfs.check_remote_output(out, overwrite=False)
