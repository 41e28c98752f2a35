"""packcli.atomic: the one temp-name/fsync/rename writer, and the writers that use it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packcli import atomic
from packcli.publish import stats


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_atomic_write_json_is_fsynced_renamed_and_in_the_record_format(
    tmp_path: Path, fsynced: list[int]
) -> None:
    target = tmp_path / "r.json"
    atomic.atomic_write_json(target, {"b": 1, "a": [2]})
    assert target.read_bytes() == b'{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert len(fsynced) == 1 and os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("kind", ["writer", "path"])
def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        if kind == "writer":
            with atomic.atomic_writer(target) as fh:
                fh.write(b"half")
                raise RuntimeError
        else:
            with atomic.atomic_path(target) as tmp:
                assert tmp.name == f".f.bin.tmp-{os.getpid()}"  # what the clean-ups match
                tmp.write_bytes(b"half")
                raise RuntimeError
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_stats_plots_are_fsynced_before_the_rename(tmp_path: Path, fsynced: list[int]) -> None:
    """The plots were renamed into place without an fsync (a crash could leave an empty
    PNG under the final name)."""

    class Figure:
        def savefig(self, path: Path, **_: object) -> None:
            Path(path).write_bytes(b"png")

    stats._save(Figure(), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes() == b"png"
    assert len(fsynced) == 1 and os.listdir(tmp_path) == ["p.png"]
