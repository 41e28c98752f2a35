"""The upload log of a remote output (``uploads.jsonl``, packcli.fs.output): one typed line
per put file, read back as written; a torn or damaged line is no upload, and a line of an
older packcli (no store version) still names packcli's file but is never taken as still
on the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packcli.fs import output

names = st.text("abcdefgh/._-", min_size=1, max_size=20)
versions = st.dictionaries(st.sampled_from(["etag", "mtime", "generation"]), names, min_size=1)


@given(rel=names, size=st.integers(0, 2**50), version=versions)
def test_a_line_reads_back_and_is_the_literal_it_replaced(
    tmp_path_factory: pytest.TempPathFactory, rel: str, size: int, version: dict[str, str]
) -> None:
    work = tmp_path_factory.mktemp("work")
    output._log_upload(work, "s3://b/out", rel, size, "a" * 64, version)
    line = (work / output.UPLOAD_LOG).read_text()
    literal = {"url": "s3://b/out", "file": rel, "size": size, "sha256": "a" * 64}
    assert line == json.dumps({**literal, "version": version}) + "\n"
    logged = output._uploaded(work, "s3://b/out")[rel]
    assert (logged.size, logged.sha256, logged.version) == (size, "a" * 64, version)
    assert output.uploaded_files(work, "s3://b/other") == set()


def test_torn_damaged_and_older_lines(tmp_path: Path) -> None:
    good = {"url": "s3://b/out", "file": "a", "size": 3, "sha256": "x", "version": {"etag": "e"}}
    older = {"url": "s3://b/out", "file": "b", "size": 4, "sha256": "y"}
    damaged = {**good, "file": "c", "size": "3"}
    lines = [json.dumps(good), json.dumps(older), json.dumps(damaged), '{"url": "s3://b/o']
    (tmp_path / output.UPLOAD_LOG).write_text("\n".join(lines))
    assert output.uploaded_files(tmp_path, "s3://b/out") == {"a", "b"}
    logged = output._uploaded(tmp_path, "s3://b/out")
    there = {"size": 4, "ETag": "e"}
    assert not output._still_there(logged["b"], there, 4, "b", lambda _: "y")  # put again
    assert output._still_there(logged["a"], {**there, "size": 3}, 3, "a", lambda _: "x")
