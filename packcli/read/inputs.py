"""Input specs to files: paths, folders, globs, URLs, ``save_to_disk`` folders and Hub datasets
become one stable, sorted, deduplicated list of files (the order that gives documents their
ids), keeping out whatever packcli itself writes."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from packcli.errors import InputError
from packcli.fs import expand, is_url, local_path, normalize, redact
from packcli.names import INPUT_FORMATS
from packcli.read.formats import HUB_PREFIX, suffix_format, suffix_list, wanted_formats
from packcli.read.hub import hub_local_spec
from packcli.read.saved_dataset import hf_disk_files, is_saved_dataset

# The name log lines showed before the reader became a package (the CLI prints it).
logger = logging.getLogger("packcli.read")

_GLOB_MAGIC = frozenset("*?[")


_SKIPPED_NOTE = " (files under the output and work folders are not inputs)"


def _files_under(directory: Path, wanted: Sequence[str] = ("jsonl",)) -> list[Path]:
    return [p for p in directory.rglob("*") if suffix_format(p) in wanted and p.is_file()]


def resolve_inputs(
    specs: Sequence[str], exclude: Sequence[Path | str] = (), input_format: str = "auto"
) -> list[Path | str]:
    """Expand input specs into a deduplicated list of files sorted by path string.

    Each spec is a file (whose name must end in a suffix of ``FORMAT_SUFFIXES``, unless
    ``input_format`` forces parquet or arrow), a directory (searched recursively for
    supported files; a ``datasets`` ``save_to_disk`` folder gives its data files in the
    order of its ``state.json``), a glob pattern (``**`` allowed; matched directories are
    searched recursively, matched files with other suffixes are ignored) or a Hub dataset
    (``hf-dataset:OWNER/NAME[@REVISION][/PATH]``, or any spec with ``input_format="hub"``),
    downloaded into the Hugging Face cache first. A spec may be an fsspec URL (``s3://``,
    ``gs://``, ``hf://``...: a file, folder or glob, listed by its filesystem; returned as
    URL strings, which the readers open through fsspec); ``file://`` is a local path.
    ``input_format`` other than ``auto`` keeps only files of that format. Files reached
    through several specs are kept once (compared by resolved path). Raises ``InputError``
    for a spec that matches nothing usable, or when no input files are left.

    ``exclude`` names folders packcli writes (the output and work folders): what is under them
    (``rejected.jsonl``, work files) is its own output, so a folder or glob that reaches them
    skips them (else an ``--out`` inside the input folder feeds each run's quarantine to the
    next), and a spec that names a file or folder inside one is refused.
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    found = _Found(input_format, exclude)
    for spec in specs:
        if input_format == "hub" or spec.startswith(HUB_PREFIX):
            spec = hub_local_spec(spec, found.wanted)
        spec = local_path(spec)  # file:// is a local path
        if is_url(spec):
            found.add_url_spec(spec)
        else:
            found.add_local_spec(spec)
    return found.files(len(specs))


class _Found:
    """The files the specs reached so far, and the folders they must keep out of."""

    def __init__(self, input_format: str, exclude: Sequence[Path | str]) -> None:
        self.input_format = input_format
        self.wanted = wanted_formats(input_format)
        self.suffixes = suffix_list(self.wanted)
        # resolved path -> (absolute path shown to the user, sort key)
        self.found: dict[Path | str, tuple[Path | str, tuple[str, int]]] = {}
        self.fences = [Path(p).resolve() for p in exclude if not is_url(p)]
        # A remote --out: inputs under its prefix are its own output files.
        self.url_fences = [normalize(str(p)) + "/" for p in exclude if is_url(p)]
        self.fenced_out = 0  # files skipped because they are under an excluded folder

    def files(self, n_specs: int) -> list[Path | str]:
        """Every file found, in the order that numbers the documents."""
        if not self.found:
            raise InputError("no input files given")
        if self.fenced_out:
            logger.info("not reading %d file(s) under the output or work folder", self.fenced_out)
        result = [shown for shown, _ in sorted(self.found.values(), key=lambda v: v[1])]
        logger.debug("resolved %d input spec(s) to %d file(s)", n_specs, len(result))
        return result

    def fence_of(self, path: Path) -> Path | None:
        resolved = path.resolve()
        return next((f for f in self.fences if resolved.is_relative_to(f)), None)

    def refuse_inside(self, spec: str, path: Path) -> None:
        if (fence := self.fence_of(path)) is not None:
            raise InputError(
                f"input {spec!r} is inside {fence}, where packcli writes its output: "
                "move the inputs elsewhere or choose another --out/--work-dir"
            )

    def add(self, path: Path, order: tuple[str, int] | None = None) -> None:
        shown = Path(os.path.abspath(path))
        key = path.resolve()
        old = self.found.get(key)
        if old is None or str(shown) < str(old[0]):
            # A save_to_disk folder's files sort as its state.json lists them, together
            # where the folder's name sorts.
            self.found[key] = (shown, order or (old[1] if old else (str(shown), -1)))

    def add_matches(self, files: list[Path]) -> int:
        """Add the files a folder or glob reached, except those under a fence: how many."""
        kept = [p for p in files if self.fence_of(p) is None]
        self.fenced_out += len(files) - len(kept)
        for p in kept:
            self.add(p)
        return len(kept)

    def add_url_spec(self, spec: str) -> None:
        """An fsspec URL: a file, folder or glob, listed by its filesystem."""
        input_format = self.input_format
        urls, ordered = expand(
            spec,
            lambda p: suffix_format(p) in self.wanted,
            saved_dataset=input_format in ("auto", "hf-disk"),
            any_name=input_format in ("parquet", "arrow"),
        )
        kept = [u for u in urls if not any(u.startswith(f) for f in self.url_fences)]
        self.fenced_out += len(urls) - len(kept)
        if not kept:
            note = _SKIPPED_NOTE if urls else ""
            raise InputError(f"{redact(spec)!r} matched no {self.suffixes} files{note}")
        for i, url in enumerate(kept):
            order = (spec.rstrip("/") + "/", i) if ordered else (url, -1)
            self.found.setdefault(url, (url, order))

    def add_local_spec(self, spec: str) -> None:
        """A local file, folder or glob pattern."""
        input_format, wanted, suffixes = self.input_format, self.wanted, self.suffixes
        path = Path(spec)
        if path.is_file():
            if input_format == "hf-disk" or (
                input_format not in ("parquet", "arrow") and suffix_format(path) not in wanted
            ):
                raise InputError(
                    f"unsupported input file {spec!r}: supported suffixes are {suffixes}"
                    + (" (or pass --input-format parquet|arrow)" if input_format == "auto" else "")
                )
            self.refuse_inside(spec, path)
            self.add(path)
        elif path.is_dir():
            self.refuse_inside(spec, path)
            if input_format == "hf-disk" or (input_format == "auto" and is_saved_dataset(path)):
                shown = os.path.abspath(path) + os.sep
                for i, member in enumerate(hf_disk_files(path)):
                    self.add(member, (shown, i))
                return
            files = _files_under(path, wanted)
            if not self.add_matches(files):
                note = _SKIPPED_NOTE if files else ""
                raise InputError(f"no {suffixes} files found under directory {spec!r}{note}")
        elif _GLOB_MAGIC.intersection(spec):
            files = []
            for match in glob.glob(spec, recursive=True):
                mpath = Path(match)
                if mpath.is_dir():
                    files.extend(_files_under(mpath, wanted))
                elif suffix_format(mpath) in wanted and mpath.is_file():
                    files.append(mpath)
            if not self.add_matches(files):
                note = _SKIPPED_NOTE if files else ""
                raise InputError(f"glob pattern {spec!r} matched no {suffixes} files{note}")
        elif path.exists():
            raise InputError(f"input {spec!r} is not a regular file or directory")
        else:
            raise InputError(f"input not found: {spec!r}")
