"""The work folder's own records (its marker, the lock files' lines, the lists of owned files):
one written by an earlier packcli is read as before, and a damaged one is not taken for
packcli's (the folder is refused, the holder unnamed, the list ignored), never misread."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from packcli.config import RunConfig
from packcli.errors import ConfigError
from packcli.stages import lock
from packcli.stages.work import check_output_folder, claim_output, owned_outputs


def _with_marker(out: Path, body: bytes) -> Path:
    """A non-empty output folder whose work folder holds ``body`` as its marker."""
    (out / ".packcli").mkdir(parents=True)
    (out / ".packcli" / "packcli-work.json").write_bytes(body)
    (out / "notes.txt").write_text("left by a killed run")
    return out


def test_a_work_marker_of_an_earlier_packcli_claims_its_folder_and_is_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    shown = str(out.resolve())
    earlier = (
        json.dumps({"packcli_work": 1, "out": shown}, indent=2, sort_keys=True) + "\n"
    ).encode()
    _with_marker(out, earlier)
    check_output_folder(out, overwrite=False)  # ours: no refusal
    marker = out / ".packcli" / "packcli-work.json"
    before = marker.stat().st_mtime_ns
    claim_output(RunConfig(out=str(out)))
    assert marker.read_bytes() == earlier and marker.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "body",
    [
        b'{"packcli_work": 1, "out": 5}',  # wrong type
        b'{"packcli_work": 1}',  # a field missing
        b'{"packcli_work": 2, "out": "x"}',  # another version
        b'{"packcli_work": 1, "out": "x"',  # torn
    ],
)
def test_a_damaged_work_marker_does_not_claim_the_folder(tmp_path: Path, body: bytes) -> None:
    out = _with_marker(tmp_path / "out", body)
    with pytest.raises(ConfigError, match="not a packcli output"):
        check_output_folder(out, overwrite=False)


def test_a_damaged_work_marker_is_rewritten_when_the_folder_is_claimed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _with_marker(out, b'{"packcli_work": 1, "out": 5}')
    claim_output(RunConfig(out=str(out)))
    check_output_folder(out, overwrite=False)  # ours again


def test_a_lock_line_that_does_not_read_as_a_holder_is_not_named(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "out" / ".packcli"
    work.mkdir(parents=True)
    with lock.hold(out, work):
        with (out / ".packcli.lock").open("ab") as fh:  # after this process's own line
            fh.write(b'{"pid": "many", "host": 7}\n')
        with (
            pytest.raises(lock.LockedError, match=f"pid {os.getpid()} on .* since "),
            lock.hold(out, work),
        ):
            pass
        (out / ".packcli.lock").write_bytes(b'{"pid": "many", "host": 7}\n')
        with (
            pytest.raises(lock.LockedError, match="a process that did not say who it is"),
            lock.hold(out, work),
        ):
            pass


def _owned_list(out: Path, body: bytes) -> None:
    (out / ".packcli" / "owned").mkdir(parents=True)
    (out / ".packcli" / "owned" / "0123456789abcdef.json").write_bytes(body)


def test_a_list_of_owned_files_kept_by_an_earlier_packcli_still_owns_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rel = "data/long/train-00000-of-00001.parquet"
    _owned_list(out, (json.dumps({"files": [rel]}, indent=2, sort_keys=True) + "\n").encode())
    assert owned_outputs(RunConfig(out=str(out))) == {rel}


@pytest.mark.parametrize(
    "body", [b'{"files": "data/long/x.parquet"}', b'{"files": [3]}', b"{}", b'{"files": [']
)
def test_a_damaged_list_of_owned_files_owns_nothing(
    tmp_path: Path, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Its files are then refused as another's (never deleted); the log names the list."""
    out = tmp_path / "out"
    _owned_list(out, body)
    assert owned_outputs(RunConfig(out=str(out))) == set()
    assert "0123456789abcdef.json: damaged list of files packcli wrote" in caplog.text
