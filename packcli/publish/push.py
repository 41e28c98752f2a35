"""Push a finished output folder to a Hugging Face dataset repo.

Why a command of our own rather than ``hf upload``: an output folder holds more than the
dataset. The work folder ``.packcli/`` (tokenized shards, often larger than the dataset
itself), temp files of an interrupted run (``.*.tmp-*``) and anything a user dropped there
must never reach the Hub, and a half-written or corrupt output must not be published at all.
So the upload set is exact: ``README.md``, ``packcli.json``, the Parquet files listed in
``packcli.json`` and the plots ``packcli stats`` wrote (``stats/*.png``, by name; skipped
when older than ``packcli.json``, as they would describe an earlier pack), and the folder
must pass the checks ``packcli verify`` runs first (``verify.verify_folder``: structure, the
figures of ``packcli.json``, the sha256 of every data file, and every token against the
tokenized shards when they are present), so push refuses what verify refuses.

The upload itself is ``huggingface_hub``'s resumable folder upload: ``upload_large_folder``
where it exists (huggingface_hub 0.25 to 1.x), else ``upload_folder``, which from
huggingface_hub 1.20 commits large folders in batches and resumes when rerun (2.x removed
``upload_large_folder``). Rerunning ``packcli push`` after an interruption resumes: files
already committed are skipped. After a successful upload, data files and plots of an earlier
push that this output does not have are deleted (``prune``): the card loads
``data/<config>/train-*.parquet``, so a stale shard left from a previous push with more files
would silently join the dataset.

An output on object storage (``packcli push s3://bucket/out REPO``) is first downloaded to a
temp folder (``publish.remote.local_output``), then pushed the same way.

Authentication is huggingface_hub's own (``HF_TOKEN`` or ``hf auth login``); packcli never
sees the token.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli import __version__
from packcli.errors import ConfigError, PackcliError, VerifyError
from packcli.names import CONFIG_NAMES, MARKER, STATS_DIR
from packcli.publish.card import PLOT_FILES
from packcli.publish.marker import load_marker

log = logging.getLogger(__name__)

REPO_TYPE = "dataset"
# Remote files a push owns: deleted by ``prune`` when the pushed output does not have them.
OWNED_PATTERNS = ("data/long/*.parquet", "data/short/*.parquet", "stats/*.png")


class PushError(PackcliError):
    """The output cannot be pushed (incomplete, fails verification) or the Hub refused it."""


@dataclass(frozen=True)
class UploadFile:
    path: str  # POSIX path relative to the output folder, the same in the repo
    size: int


@dataclass
class PushResult:
    repo_id: str
    url: str
    files: list[UploadFile]
    deleted: list[str] = field(default_factory=list)


def upload_files(out: Path) -> list[UploadFile]:
    """Exactly what a push uploads, in a stable order; raises ``PushError`` if incomplete.

    Does not verify the data (see ``prepare_push``); reads only ``packcli.json`` and sizes.
    """
    marker = out / MARKER
    if not marker.is_file():
        raise PushError(
            f"{out}: no {MARKER}, so the output is missing or incomplete; "
            "run packcli pack to completion first"
        )
    try:
        meta = load_marker(out)
        listed = {name: [f["file"] for f in meta["files"][name]] for name in CONFIG_NAMES}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PushError(f"{marker}: unreadable or not written by packcli ({exc})") from exc
    paths = ["README.md", MARKER]
    for name in CONFIG_NAMES:
        paths += [f"data/{name}/{f}" for f in listed[name]]
    made = marker.stat().st_mtime_ns
    for name in PLOT_FILES:
        plot = out / STATS_DIR / name
        if not plot.is_file():
            continue
        # pack writes packcli.json last, stats plots after it: an older plot shows old data.
        if plot.stat().st_mtime_ns < made:
            log.warning("not uploading %s: it predates packcli.json; rerun packcli stats", plot)
            continue
        paths.append(f"{STATS_DIR}/{name}")
    files = []
    for rel in paths:
        p = out / rel
        _refuse_links(out, rel)
        if not p.is_file():
            raise PushError(f"{out}: {rel} is missing, so the output is incomplete")
        files.append(UploadFile(rel, p.stat().st_size))
    return files


def _refuse_links(out: Path, rel: str) -> None:
    """Refuse a file that is a symlink, or lies under one, or resolves outside ``out``: a
    README.md linked to ``~/.netrc`` would otherwise be listed and uploaded as the card.
    (``out`` itself may be a link; what it holds may not point elsewhere.)"""
    root = out.resolve()
    p = out
    for part in Path(rel).parts:
        p = p / part
        if p.is_symlink():
            raise PushError(
                f"{out}: {Path(rel)} is a symbolic link (to {os.readlink(p)}); push uploads only "
                "regular files inside the output folder: replace the link with the file"
            )
    if p.exists() and not p.resolve().is_relative_to(root):
        raise PushError(f"{out}: {rel} lies outside the output folder; refusing to upload it")


def prepare_push(out: Path, url: str | None = None) -> list[UploadFile]:
    """The upload set of ``out`` after proving the folder is complete and intact: the
    checks ``packcli verify`` runs (``verify_folder``, the tokenized shards included when
    present), so push refuses exactly what verify refuses. ``url``: the output ``out`` is a
    downloaded copy of (its work folder, and its name in messages)."""
    from packcli.fs import redact
    from packcli.publish.verify import verify_folder

    files = upload_files(out)
    try:
        verify_folder(out, url)
    except VerifyError as exc:
        shown = redact(url).rstrip("/") if url else out
        raise PushError(f"refusing to push {shown}: {exc} (see packcli verify)") from exc
    return files


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError

    # Public (huggingface_hub's docs), but its lazy __init__ imports it without re-exporting.
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ConfigError(
            f"invalid repo id {repo_id!r}: use user/name, org/name or name (letters, digits, "
            "'-', '_' and '.'; at most 96 characters)"
        ) from exc


def load_call(repo_id: str, config: str = "long", revision: str | None = None) -> str:
    """The ``load_dataset`` call that reads the pushed dataset back."""
    rev = f", revision={revision!r}" if revision else ""
    return f'datasets.load_dataset("{repo_id}", "{config}", split="train"{rev})'


def _owned(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in OWNED_PATTERNS)


def _hub_error(repo_id: str, exc: Exception) -> PushError:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    hint = ""
    if status in (401, 403):
        hint = " (log in with `hf auth login` or set HF_TOKEN to a token with write access)"
    return PushError(f"push to {repo_id} failed: {exc}{hint}")


def push(
    out: Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    prune: bool = True,
    api: Any = None,
    url: str | None = None,
) -> PushResult:
    """Verify ``out`` and upload its exact file set to the dataset repo ``repo_id``.

    Creates the repo (``private`` applies only to a new repo) and the branch ``revision``
    when missing. Rerunning after an interruption resumes the upload. ``url``: the remote
    output ``out`` is a downloaded copy of (``local_output``).
    """
    from huggingface_hub import CommitOperationDelete, HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    check_repo_id(repo_id)
    files = prepare_push(out, url)
    api = api if api is not None else HfApi()
    total = sum(f.size for f in files)
    log.info("pushing %d files (%d bytes) from %s to %s", len(files), total, out, repo_id)
    try:
        repo_url = api.create_repo(
            repo_id, repo_type=REPO_TYPE, private=True if private else None, exist_ok=True
        )
        repo_id = getattr(repo_url, "repo_id", None) or repo_id  # "name" -> "user/name"
        if revision and revision != "main" and not revision.startswith("refs/"):
            api.create_branch(repo_id, branch=revision, repo_type=REPO_TYPE, exist_ok=True)
        # Exact names as glob patterns: escape glob metacharacters so each matches only itself.
        patterns = [glob.escape(f.path) for f in files]
        upload_large = getattr(api, "upload_large_folder", None)
        if upload_large is not None:
            upload_large(
                repo_id=repo_id,
                folder_path=out,
                repo_type=REPO_TYPE,
                revision=revision,
                allow_patterns=patterns,
            )
        else:
            api.upload_folder(
                repo_id=repo_id,
                folder_path=out,
                repo_type=REPO_TYPE,
                revision=revision,
                allow_patterns=patterns,
                commit_message=f"Upload packed dataset (packcli {__version__})",
            )
        deleted: list[str] = []
        if prune:
            local = {f.path for f in files}
            remote = api.list_repo_files(repo_id, repo_type=REPO_TYPE, revision=revision)
            deleted = sorted(p for p in remote if _owned(p) and p not in local)
            if deleted:
                log.info("deleting %d stale files of an earlier push: %s", len(deleted), deleted)
                api.create_commit(
                    repo_id,
                    [CommitOperationDelete(path_in_repo=p) for p in deleted],
                    commit_message="Remove data files of an earlier packcli push",
                    repo_type=REPO_TYPE,
                    revision=revision,
                )
    except (HfHubHTTPError, OfflineModeIsEnabled) as exc:
        raise _hub_error(repo_id, exc) from exc
    url = f"https://huggingface.co/datasets/{repo_id}"
    if revision:
        url += f"/tree/{revision}"
    return PushResult(repo_id=repo_id, url=url, files=files, deleted=deleted)


def _size(n: int) -> str:
    if n < 1000:
        return f"{n:,} B"
    x = float(n)
    for unit in ("KB", "MB", "GB", "TB"):
        x /= 1000
        if x < 1000 or unit == "TB":
            break
    return f"{x:,.1f} {unit}"


def format_upload_list(files: list[UploadFile]) -> str:
    width = max(len(f.path) for f in files)
    lines = [f"  {f.path:<{width}}  {_size(f.size):>10}" for f in files]
    lines.append(f"  {len(files)} files, {_size(sum(f.size for f in files))}")
    return "\n".join(lines)
