"""``packcli push``: the exact upload set, refusals, and the Hub calls (recorded, no network)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import huggingface_hub
import pytest
import typer
from corpora import mixed_corpus
from huggingface_hub.utils import filter_repo_objects
from typer.testing import CliRunner

from packcli.cli import app as main_app
from packcli.cli.publish import PUSH_EPILOG, push_command
from packcli.errors import ConfigError, PackcliError
from packcli.publish.push import PushError, push, upload_files
from packcli.publish.stats import PLOT_ROW_FILL, STATS_DIR

runner = CliRunner()
app = typer.Typer(add_completion=False, rich_markup_mode=None)
app.command("push", epilog=PUSH_EPILOG)(push_command)
app.command("noop")(lambda: None)  # two commands, so "push" stays a subcommand

CONFIG = "write:\n  shard_tokens: 6000\n"  # several files per config
EXPECTED = {
    "README.md",
    "packcli.json",
    f"{STATS_DIR}/{PLOT_ROW_FILL}",
}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("publish")
    corpus = mixed_corpus(root / "corpus.jsonl", 250, 3)
    (root / "cfg.yaml").write_text(CONFIG)
    out = root / "out"
    args = ["pack", str(corpus), "-t", str(toy_tokenizer_path), "-o", str(out)]
    args += ["-c", str(root / "cfg.yaml"), "--short-len", "64", "--long-len", "1024", "-q"]
    result = runner.invoke(main_app, args)
    assert result.exit_code == 0, result.output
    # Things that must never be uploaded, beside the work folder pack left in .packcli/.
    (out / "notes.txt").write_text("private")
    (out / "data" / "long" / ".train-00000-of-00009.parquet.tmp-123").write_bytes(b"x")
    (out / STATS_DIR).mkdir()
    (out / STATS_DIR / PLOT_ROW_FILL).write_bytes(b"\x89PNG fake plot")
    (out / STATS_DIR / "mine.png").write_bytes(b"\x89PNG not ours")
    return out


def expected_files(out: Path) -> set[str]:
    meta = json.loads((out / "packcli.json").read_text())
    data = {f"data/{name}/{f['file']}" for name in ("long", "short") for f in meta["files"][name]}
    assert len(data) >= 4
    return EXPECTED | data


def copy_out(packed: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    return out


def test_dry_run_lists_exactly_the_dataset_files(packed: Path) -> None:
    result = runner.invoke(app, ["push", str(packed), "me/packed", "--dry-run"])
    assert result.exit_code == 0, result.output
    listed = re.findall(r"^  (\S+)\s+([\d.,]+ [KMGT]?B)$", result.output, flags=re.M)
    assert {p for p, _ in listed} == expected_files(packed)
    assert len(listed) == len(expected_files(packed))
    assert ".packcli" not in result.output and "tmp-" not in result.output
    assert 'datasets.load_dataset("me/packed", "long", split="train")' in result.output
    sizes = {f.path: f.size for f in upload_files(packed)}
    assert sizes == {p: (packed / p).stat().st_size for p in expected_files(packed)}
    assert f"{len(sizes)} files" in result.output


def test_refuses_an_incomplete_output(packed: Path, tmp_path: Path) -> None:
    out = copy_out(packed, tmp_path)
    (out / "packcli.json").unlink()
    result = runner.invoke(app, ["push", str(out), "me/packed", "--dry-run"])
    assert isinstance(result.exception, PushError)
    assert "incomplete" in str(result.exception)


def test_refuses_a_missing_data_file(packed: Path, tmp_path: Path) -> None:
    out = copy_out(packed, tmp_path)
    next((out / "data" / "short").glob("*.parquet")).unlink()
    with pytest.raises(PushError, match="missing"):
        upload_files(out)


def test_refuses_an_output_that_fails_verification(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = copy_out(packed, tmp_path)
    victim = next((out / "data" / "long").glob("*.parquet"))
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the Hub must not be called for a corrupt output")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_network)
    result = runner.invoke(app, ["push", str(out), "me/packed"])
    assert isinstance(result.exception, PushError)
    assert "refusing to push" in str(result.exception) and "hash" in str(result.exception)


def test_rejects_a_bad_repo_id(packed: Path) -> None:
    result = runner.invoke(app, ["push", str(packed), "not a repo//id", "--dry-run"])
    assert isinstance(result.exception, ConfigError)


class RecordingApi:
    """Stands in for ``HfApi``: records calls and applies the allow patterns like the Hub."""

    def __init__(self, remote: list[str], large: bool) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.remote = remote
        self.uploaded: set[str] = set()
        if large:
            self.upload_large_folder = self._upload

    def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"me/{repo_id}")

    def create_branch(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_branch", {"repo_id": repo_id, **kwargs}))

    def _upload(self, **kwargs: Any) -> None:
        self.calls.append(("upload", kwargs))
        folder = Path(kwargs["folder_path"])
        every = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        self.uploaded = set(filter_repo_objects(every, allow_patterns=kwargs["allow_patterns"]))

    def upload_folder(self, **kwargs: Any) -> None:
        self._upload(**kwargs)

    def list_repo_files(self, repo_id: str, **kwargs: Any) -> list[str]:
        self.calls.append(("list_repo_files", {"repo_id": repo_id, **kwargs}))
        return sorted(set(self.remote) | self.uploaded)

    def create_commit(self, repo_id: str, operations: list[Any], **kwargs: Any) -> None:
        paths = [op.path_in_repo for op in operations]
        self.calls.append(("create_commit", {"repo_id": repo_id, "deleted": paths, **kwargs}))


STALE = [
    "data/long/train-00000-of-00099.parquet",
    "data/short/train-00098-of-00099.parquet",
    "stats/old_plot.png",
]
KEPT = [".gitattributes", "README.md", "extra/notes.md", "data/long/README.txt"]


@pytest.mark.parametrize("large", [True, False], ids=["upload_large_folder", "upload_folder"])
def test_push_uploads_exactly_the_file_set_and_prunes_stale_files(
    packed: Path, large: bool
) -> None:
    api = RecordingApi(remote=STALE + KEPT, large=large)
    result = push(packed, "me/packed", private=True, revision="v2", api=api)
    names = [name for name, _ in api.calls]
    assert names == ["create_repo", "create_branch", "upload", "list_repo_files", "create_commit"]
    calls = dict(api.calls)
    assert calls["create_repo"] == {
        "repo_id": "me/packed",
        "repo_type": "dataset",
        "private": True,
        "exist_ok": True,
    }
    assert calls["create_branch"]["branch"] == "v2" and calls["create_branch"]["exist_ok"]
    upload = calls["upload"]
    assert upload["repo_type"] == "dataset" and upload["revision"] == "v2"
    assert Path(upload["folder_path"]) == packed
    assert api.uploaded == expected_files(packed)  # nothing from .packcli/, no temp files
    assert sorted(calls["create_commit"]["deleted"]) == sorted(STALE)
    assert calls["create_commit"]["revision"] == "v2"
    assert result.deleted == sorted(STALE)
    assert result.url == "https://huggingface.co/datasets/me/packed/tree/v2"


def test_push_without_prune_or_revision(packed: Path) -> None:
    api = RecordingApi(remote=STALE, large=False)
    result = push(packed, "packed", prune=False, api=api)
    assert [name for name, _ in api.calls] == ["create_repo", "upload"]
    assert dict(api.calls)["create_repo"]["private"] is None  # the account's default
    assert result.repo_id == "me/packed"  # the namespace the Hub resolved
    assert dict(api.calls)["upload"]["revision"] is None


def test_push_command_calls_the_hub_through_hfapi(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = RecordingApi(remote=[], large=False)
    for name in ("create_repo", "upload_folder", "list_repo_files", "create_commit"):
        monkeypatch.setattr(
            huggingface_hub.HfApi, name, lambda self, *a, _f=getattr(api, name), **k: _f(*a, **k)
        )
    monkeypatch.delattr(huggingface_hub.HfApi, "upload_large_folder", raising=False)
    result = runner.invoke(app, ["push", str(packed), "me/packed"])
    assert result.exit_code == 0, result.output
    assert api.uploaded == expected_files(packed)
    assert "pushed to https://huggingface.co/datasets/me/packed" in result.output
    assert "create_commit" not in dict(api.calls)  # nothing stale


def test_hub_errors_become_one_line_messages(packed: Path) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    error = HfHubHTTPError.__new__(HfHubHTTPError)
    Exception.__init__(error, "401 Client Error: Unauthorized")
    error.response = SimpleNamespace(status_code=401)

    class Refusing(RecordingApi):
        def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
            raise error

    with pytest.raises(PackcliError, match="hf auth login"):
        push(packed, "me/packed", api=Refusing(remote=[], large=True))


def test_plots_older_than_the_output_are_not_uploaded(packed: Path, tmp_path: Path) -> None:
    out = copy_out(packed, tmp_path)
    marker = (out / "packcli.json").stat().st_mtime_ns
    plot = out / STATS_DIR / PLOT_ROW_FILL
    os.utime(plot, ns=(marker - 10**9, marker - 10**9))  # made for an earlier pack
    assert {f.path for f in upload_files(out)} == expected_files(out) - {
        plot.relative_to(out).as_posix()
    }
