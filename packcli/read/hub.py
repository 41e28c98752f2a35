"""Hub datasets (``hf-dataset:OWNER/NAME[@REVISION][/PATH]``): fetched into the Hugging Face
cache, then read as the local files they became (``packcli/read/inputs.py``)."""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from packcli.errors import InputError
from packcli.read.formats import FORMAT_SUFFIXES, HUB_PREFIX
from packcli.read.saved_dataset import SAVED_DATASET_RECORDS

logger = logging.getLogger(__name__)

_REVISION_WITH_SLASH = re.compile(r"refs/convert/parquet|refs/pr/\d+")


@dataclass(frozen=True)
class HubSpec:
    repo_id: str
    revision: str | None
    path: str  # inside the repo: a file, a folder or a glob; "" for the whole repo


def parse_hub_spec(spec: str) -> HubSpec:
    """``[hf-dataset:]OWNER/NAME[@REVISION][/PATH]`` (the layout of ``hf://datasets/`` paths;
    a revision may be ``refs/convert/parquet`` or ``refs/pr/N``)."""
    body = spec.removeprefix(HUB_PREFIX)
    owner, _, rest = body.partition("/")
    # Matches every string (each group may be empty).
    name, at, rest = cast(re.Match[str], re.match(r"([^/@]*)(@?)(.*)", rest)).groups()
    revision = None
    if at:
        special = _REVISION_WITH_SLASH.match(rest)
        cut = special.end() if special else (rest.find("/") if "/" in rest else len(rest))
        revision, rest = rest[:cut], rest[cut:]
    if not owner or not name or (at and not revision) or (rest and not rest.startswith("/")):
        raise InputError(
            f"Hub dataset {spec!r}: expected {HUB_PREFIX}OWNER/NAME[@REVISION][/PATH], e.g. "
            f"{HUB_PREFIX}HuggingFaceFW/fineweb-edu/sample/10BT"
        )
    return HubSpec(f"{owner}/{name}", revision, rest.strip("/"))


def hub_local_spec(spec: str, formats: Sequence[str]) -> str:
    """Download the Hub dataset's data files of ``formats`` (under its path) into the
    Hugging Face cache with ``huggingface_hub.snapshot_download``, as its users do (resumed,
    shared with ``datasets``, offline from the cache with ``HF_HUB_OFFLINE=1``, credentials
    from the usual token), and return the local file, folder or glob to read."""
    from huggingface_hub import snapshot_download

    hub = parse_hub_spec(spec)
    suffixes = [s for fmt in formats for s in FORMAT_SUFFIXES[fmt]]
    if hub.path and glob.has_magic(hub.path):
        patterns = [hub.path]
    else:
        prefix = f"{hub.path}/" if hub.path else ""
        patterns = [f"{prefix}*{s}" for s in suffixes] + ([hub.path] if hub.path else [])
        if "arrow" in formats:  # a save_to_disk folder in the repo is read through these
            patterns += [f"{prefix}*{name}" for name in SAVED_DATASET_RECORDS]
    logger.info("fetching %s (%s) from the Hub", hub.repo_id, ", ".join(patterns))
    try:
        folder = snapshot_download(
            hub.repo_id, repo_type="dataset", revision=hub.revision, allow_patterns=patterns
        )
    except (OSError, ValueError) as exc:  # not found, gated, offline without a cache...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"Hub dataset {hub.repo_id!r}: {first}") from exc
    return os.path.join(folder, hub.path) if hub.path else folder
