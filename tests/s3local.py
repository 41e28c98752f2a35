"""A local S3 server for tests (moto in server mode: the S3 HTTP API, driven by the real
s3fs / botocore clients), a small .jsonl.zst corpus, its reference Parquet hashes packed from
local disk, and helpers to look at a bucket. Test modules import the fixtures they use."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from clirun import invoke_ok
from corpora import mixed_lengths, write_corpus
from s3count import RequestLog

from packcli import fs as packfs
from packcli.tokenize.shards import sha256_file

ARGS = ["--short-len", "64", "--long-len", "1024", "-q"]
CONFIG = "read:\n  batch_size: 16\ntokenize:\n  shard_tokens: 4096\nwrite:\n  shard_tokens: 8192\n"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local S3 endpoint; the environment every s3fs client (here and in subprocesses)
    finds it through: the usual AWS variables, dummy credentials."""
    import logging

    pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    from s3count import CountingMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = CountingMotoServer()  # moto's server, logging each request's bytes
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    LOGS[env["AWS_ENDPOINT_URL"]] = server.log
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(k, raising=False)
        s3fs.S3FileSystem.clear_instance_cache()
        yield env
        s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


LOGS: dict[str, RequestLog] = {}  # each running server's request log, by endpoint


@pytest.fixture
def s3_log(s3: dict[str, str]) -> RequestLog:
    """The requests the local S3 server answered (``take()`` returns and clears them)."""
    return LOGS[s3["AWS_ENDPOINT_URL"]]


@pytest.fixture
def bucket(s3: dict[str, str]) -> str:
    """A fresh bucket per test."""
    import s3fs

    name = f"t-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return name


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three .jsonl.zst files (one of several frames) in a local folder."""
    root = tmp_path_factory.mktemp("corpus")
    lengths = mixed_lengths(300, seed=11)
    for i, part in enumerate((lengths[:120], lengths[120:200], lengths[200:])):
        plain = root / f"part-{i}.jsonl"
        write_corpus(plain, part, seed=i)
        data = plain.read_bytes()
        cctx = zstandard.ZstdCompressor(write_checksum=True)
        half = data.rfind(b"\n", 0, len(data) // 2) + 1
        (root / f"part-{i}.jsonl.zst").write_bytes(
            cctx.compress(data[:half]) + cctx.compress(data[half:])
        )
        plain.unlink()
    (root / "cfg.yaml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def reference(
    corpus: Path, toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Parquet hashes of the same files packed from local disk."""
    out = tmp_path_factory.mktemp("ref") / "out"
    invoke_ok("pack", corpus / "*.jsonl.zst", "-t", toy_tokenizer_path, "-o", out, *cfg(corpus))
    return local_hashes(out)


def cfg(corpus: Path) -> list[str]:
    return ["-c", str(corpus / "cfg.yaml"), *ARGS]


def local_hashes(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*.parquet"))}


def remote_hashes(url: str) -> dict[str, str]:
    fs, prefix = packfs.locate(url)
    fs.invalidate_cache()
    return {
        p[len(prefix) + 1 :]: hashlib.sha256(fs.cat_file(p)).hexdigest()
        for p in sorted(fs.find(prefix))
        if p.endswith(".parquet")
    }


def upload(local: Path, url: str, pattern: str = "*") -> None:
    fs, prefix = packfs.locate(url)
    for p in sorted(local.glob(pattern)):
        fs.put_file(str(p), f"{prefix}/{p.name}")
    fs.invalidate_cache()


def remote_pack(corpus: Path, bucket: str, tok: Path, work: object) -> tuple[str, list[object]]:
    """The module's corpus put on the store (``s3://BUCKET/in``) and the ``pack`` of it into
    ``s3://BUCKET/out`` with its work folder at ``work`` (a path or a URL): the output's URL
    and the command's arguments."""
    upload(corpus, f"s3://{bucket}/in", "*.jsonl.zst")
    out = f"s3://{bucket}/out"
    args: list[object] = ["pack", f"s3://{bucket}/in/*.jsonl.zst", "-t", tok, "-o", out]
    return out, [*args, "--work-dir", work, *cfg(corpus)]


def remote_files(url: str) -> set[str]:
    fs, prefix = packfs.locate(url)
    fs.invalidate_cache()
    return {p[len(prefix) + 1 :] for p in fs.find(prefix)}
