"""Input specs to files: paths, folders, globs, URLs, ``save_to_disk`` folders and Hub datasets
become one stable, sorted, deduplicated list of files (the order that gives documents their
ids), keeping out whatever packcli itself writes.

One rule for every form that names a folder (a path, a glob of it, a ``file://`` or store
URL of it), so each gives the same documents:

* A folder is searched recursively; a glob is matched, component by component
  (``fnmatch``; ``**`` is any number of folders), against the paths under its folder before
  the first wildcard, and a folder it matches is searched whole. A path or URL that exists
  as written is never taken for a glob (a folder named ``data[1]``).
* Hidden entries (names starting with ``.``: ``.git``, ``.cache``, packcli's ``.packcli``)
  are skipped below the folder named; name one to read it.
* Links are followed: a linked file or folder is read as the one it names. A link to a
  folder that holds it (a loop) is not followed again (logged), so every form terminates.
  A link that cannot be followed (dangling, a loop of links) or an entry that is not a
  regular file (a fifo), with an input's name, is an error naming it.
* A file reached twice (two specs, a folder and a file in it, two links, a hard link) is
  read once, under its smallest name, with a warning: never two copies of its documents.
* A folder that is, or looks like, a ``save_to_disk`` folder is read only through its
  ``state.json`` (``packcli/read/saved_dataset.py``), wherever the search meets it.
* A file name that is not valid UTF-8 is refused, naming it: it could not be recorded.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from packcli.errors import InputError
from packcli.fs import is_url, list_tree, local_path, normalize, read_text, redact
from packcli.names import INPUT_FORMATS
from packcli.read.formats import HUB_PREFIX, suffix_format, suffix_list, wanted_formats
from packcli.read.hub import hub_local_spec
from packcli.read.saved_dataset import hf_disk_files, saved_dataset_marks, saved_dataset_members

# The name log lines showed before the reader became a package (the CLI prints it).
logger = logging.getLogger("packcli.read")

_GLOB_MAGIC = frozenset("*?[")


_SKIPPED_NOTE = " (files under the output and work folders are not inputs)"

Order = tuple[str, int]


def shown_name(path: Path | str) -> str:
    """A path for messages: a name that is not valid UTF-8 with its bytes as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace") if not is_url(path) else str(path)


def _check_name(path: Path | str) -> None:
    """Refuse a file whose name is not valid UTF-8 (``os.fsdecode``'s surrogate escapes): unit
    keys, ``rejected.jsonl`` and ``packcli.json`` record input names as UTF-8 text."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{shown_name(path)}: the file name is not valid UTF-8, so packcli cannot record "
            "it (provenance, rejected.jsonl, packcli.json): rename it (e.g. with convmv)"
        ) from None


def _has_magic(part: str) -> bool:
    return bool(_GLOB_MAGIC.intersection(part))


def _match_parts(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match_parts(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return (
        bool(parts)
        and fnmatch.fnmatchcase(parts[0], pattern[0])
        and _match_parts(parts[1:], pattern[1:])
    )


def reached(rel: str, pattern: Sequence[str] | None) -> bool:
    """Whether the file at ``rel`` (under the glob's folder) is reached by ``pattern`` (its
    components; None: the folder itself was named): it matches the file or a folder above it."""
    if pattern is None:
        return True
    parts = rel.split("/")
    return any(_match_parts(parts[:k], pattern) for k in range(1, len(parts) + 1))


def split_glob(parts: Sequence[str]) -> tuple[list[str], list[str]]:
    """A glob's components as its folder (those before the first wildcard) and its pattern."""
    first = next(i for i, part in enumerate(parts) if _has_magic(part))
    return list(parts[:first]), [p for p in parts[first:] if p]


class _Tree:
    """The files under one folder by path relative to it (``/``-separated), as local paths or
    URLs, and the entries with an input's name that cannot be read (why, by path)."""

    def __init__(
        self,
        files: dict[str, Path | str],
        unreadable: dict[str, str],
        read: Callable[[str], str],
        join: Callable[[str], str],
    ) -> None:
        self.files = files
        self.unreadable = unreadable
        self.read = read  # a file's text by relative path
        self.join = join  # a relative path as shown (the folder's name joined with it)
        self.names: dict[str, set[str]] = {}  # folder -> the names of the files in it
        for rel in files:
            folder, _, name = rel.rpartition("/")
            self.names.setdefault(folder, set()).add(name)

    def names_in(self, folder: str) -> set[str]:
        return self.names.get(folder, set())


def _may_reach(rel_folder: str, pattern: Sequence[str] | None) -> bool:
    """Whether files under the folder at ``rel_folder`` can be reached by ``pattern``: its
    components match the pattern's, up to its first ``**`` (a glob's search stays as
    narrow as the glob)."""
    if pattern is None:
        return True
    fixed = list(itertools.takewhile(lambda p: p != "**", pattern))
    parts = rel_folder.split("/")
    return all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, fixed, strict=False))


def _walk_local(base: Path, wanted: Sequence[str], pattern: Sequence[str] | None = None) -> _Tree:
    """Every regular file under ``base`` (in folders ``pattern`` may reach), following links,
    skipping hidden entries and links back to a folder above them (a loop: logged, not
    followed)."""
    files: dict[str, Path | str] = {}
    unreadable: dict[str, str] = {}
    stack: list[tuple[Path, str, tuple[str, ...]]] = [(base, "", (os.path.realpath(base),))]
    while stack:
        folder, rel, above = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"cannot list {shown_name(folder)}: {exc.strerror or exc}") from exc
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path, name = Path(entry.path), f"{rel}{entry.name}"
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()  # both follow links
            except OSError:
                is_dir = is_file = False
            if is_dir:
                if not _may_reach(name, pattern):
                    continue
                real = os.path.realpath(path)
                # A link to a folder holding it (by real paths), or back to one this search
                # came through: a loop, whose files are reached without it.
                if real in above or Path(above[-1]).is_relative_to(real):
                    logger.info("not following %s: a link to %s, which holds it", path, real)
                    continue
                stack.append((path, f"{name}/", (*above, real)))
            elif is_file:
                files[name] = path
            elif suffix_format(name) in wanted:
                why = "a link that cannot be followed" if entry.is_symlink() else "not a file"
                unreadable[name] = why
    return _Tree(
        files,
        unreadable,
        lambda r: (base / r).read_text(encoding="utf-8"),
        lambda r: os.path.abspath(base / r) if r else os.path.abspath(base),
    )


def _tree_of_url(base: str, pattern: Sequence[str] | None) -> _Tree:
    """A URL folder's files, hidden ones left out as a local search leaves them. A glob
    without ``**`` lists only as deep as its pattern, then each folder it matches whole."""
    if pattern is None or "**" in pattern:
        shown_base, listed, _ = list_tree(base)
    else:
        shown_base, listed, folders = list_tree(base, depth=len(pattern))
        for folder in folders:
            parts = folder.split("/")
            if not _hidden(folder) and _match_parts(parts, pattern):
                _, under, _ = list_tree(f"{base.rstrip('/')}/{folder}")
                listed.update({f"{folder}/{rel}": url for rel, url in under.items()})
    files: dict[str, Path | str] = {rel: url for rel, url in listed.items() if not _hidden(rel)}
    return _Tree(
        files,
        {},
        lambda r: read_text(str(files[r])),
        lambda r: f"{shown_base}/{r}" if r else shown_base,
    )


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def _select(
    tree: _Tree, pattern: Sequence[str] | None, wanted: Sequence[str]
) -> list[tuple[Path | str, Order | None]]:
    """The inputs a folder (``pattern`` None) or a glob reaches in ``tree``, each with its
    sort key when a saved dataset's ``state.json`` orders it. A saved dataset (or what looks
    like one) the search meets is read through its ``state.json`` whole, or refused; a glob
    that reaches only some of its files is refused (which rows it meant is unclear)."""
    for rel, why in sorted(tree.unreadable.items()):
        if reached(rel, pattern):
            raise InputError(f"{shown_name(tree.join(rel))}: {why}; fix or remove it")
    saved: set[str] = set()
    if "arrow" in wanted:
        for folder in sorted(tree.names):
            prefix = f"{folder}/" if folder else ""

            def read(name: str, prefix: str = prefix) -> str:
                return tree.read(prefix + name)

            if saved_dataset_marks(tree.names_in(folder), read):
                saved.add(folder)
    result: list[tuple[Path | str, Order | None]] = []
    inside: dict[str, list[str]] = {}
    for rel in sorted(tree.files):
        if suffix_format(rel) not in wanted or not reached(rel, pattern):
            continue
        holder = _outermost(rel, saved)
        if holder is None:
            result.append((tree.files[rel], None))
        else:
            inside.setdefault(holder, []).append(rel)
    for folder, rels in inside.items():
        prefix = f"{folder}/" if folder else ""
        shown = tree.join(folder)

        def read_member(name: str, prefix: str = prefix) -> str:
            return tree.read(prefix + name)

        names = saved_dataset_members(shown, tree.names_in(folder), read_member)
        members = [prefix + n for n in names]
        if missed := sorted(set(members) - set(rels)):
            raise InputError(
                f"the glob reaches some files of the saved dataset {shown} but not "
                f"{missed[0].rpartition('/')[2]} ({len(missed)} of {len(members)} missed): "
                "name the folder to read the dataset"
            )
        key = shown.rstrip("/") + ("/" if is_url(shown) else os.sep)
        result += [(tree.files[m], (key, i)) for i, m in enumerate(members)]
    return result


def _outermost(rel: str, saved: set[str]) -> str | None:
    """The outermost saved-dataset folder holding the file at ``rel``, if any."""
    if "" in saved:
        return ""
    parts = rel.split("/")[:-1]
    return next(
        (f for f in ("/".join(parts[:k]) for k in range(1, len(parts) + 1)) if f in saved), None
    )


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
    ``input_format`` other than ``auto`` keeps only files of that format. Folders, globs and
    URLs follow the module's rule (hidden entries, links, loops, saved datasets); a file
    reached through several specs or names is kept once, with a warning. Raises
    ``InputError`` for a spec that matches nothing usable, or when no input files are left.

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
        # identity (a local file's device and inode, a URL) -> (name shown, sort key)
        self.found: dict[tuple[int, int] | str, tuple[Path | str, Order]] = {}
        self.fences = [Path(p).resolve() for p in exclude if not is_url(p)]
        # A remote --out: inputs under its prefix are its own output files.
        self.url_fences = [normalize(str(p)) + "/" for p in exclude if is_url(p)]
        self.fenced_out = 0  # files skipped because they are under an excluded folder
        self.twice: list[tuple[Path | str, Path | str]] = []  # a file reached again: names

    def files(self, n_specs: int) -> list[Path | str]:
        """Every file found, in the order that numbers the documents."""
        if not self.found:
            raise InputError("no input files given")
        if self.fenced_out:
            logger.info("not reading %d file(s) under the output or work folder", self.fenced_out)
        if self.twice:
            first, again = self.twice[0]
            also = f"also as {shown_name(again)}" if again != first else "by two inputs"
            logger.warning(
                "%d file(s) reached more than once, read once each (e.g. %s, %s)",
                len(self.twice),
                shown_name(first),
                also,
            )
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

    def add(self, path: Path | str, order: Order | None = None) -> None:
        """One input file; a file already found (the same local file under any name, the
        same URL) is kept once, under its smallest name, with a warning."""
        _check_name(path)
        if is_url(path):
            key: tuple[int, int] | str = str(path)
            shown: Path | str = str(path)
        else:
            shown = Path(os.path.abspath(path))
            st = os.stat(shown)
            key = (st.st_dev, st.st_ino)
        old = self.found.get(key)
        if old is not None:
            self.twice.append((old[0], shown))
            if str(shown) >= str(old[0]):
                return
            if order is None and old[1][1] >= 0:
                order = old[1]  # a saved dataset's member keeps its place
        self.found[key] = (shown, order or (str(shown), -1))

    def add_reached(self, chosen: list[tuple[Path | str, Order | None]]) -> int:
        """Add the files a folder or glob reached, except those under a fence: how many."""
        kept = [(p, o) for p, o in chosen if not self._fenced(p)]
        self.fenced_out += len(chosen) - len(kept)
        for p, o in kept:
            self.add(p, o)
        return len(kept)

    def _fenced(self, path: Path | str) -> bool:
        if is_url(path):
            return any(str(path).startswith(f) for f in self.url_fences)
        return self.fence_of(Path(path)) is not None

    def add_url_spec(self, spec: str) -> None:
        """An fsspec URL: a file, folder or glob, listed by its filesystem."""
        _, listed, _ = list_tree(spec)
        if "" in listed:  # a file
            url = listed[""]
            if self.input_format == "hf-disk":
                raise InputError(f"{redact(spec)} is not a datasets save_to_disk folder")
            if self.input_format in ("parquet", "arrow") or suffix_format(url) in self.wanted:
                self.add_reached([(url, None)])
                return
            raise InputError(f"{redact(spec)!r} matched no {self.suffixes} files")
        pattern = None
        if not listed and _has_magic(spec.split("://", 1)[1]):
            scheme, _, rest = spec.partition("://")
            parts = rest.split("/")
            if _has_magic(parts[0]):
                raise InputError(f"{redact(spec)!r}: a wildcard in the bucket or host name")
            folder, pattern = split_glob(parts)
            tree = _tree_of_url(f"{scheme}://{'/'.join(folder)}", pattern)
        elif not listed:
            raise InputError(f"input not found: {redact(spec)!r}")
        else:
            tree = _tree_of_url(spec, None)
        if self.input_format == "hf-disk" and pattern is None:
            saved_dataset_members(redact(spec), tree.names_in(""), tree.read)
        chosen = _select(tree, pattern, self.wanted)
        if not self.add_reached(chosen):
            note = _SKIPPED_NOTE if chosen else ""
            raise InputError(f"{redact(spec)!r} matched no {self.suffixes} files{note}")

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
            if input_format == "hf-disk":
                shown = os.path.abspath(path) + os.sep
                for i, member in enumerate(hf_disk_files(path)):
                    self.add(member, (shown, i))
                return
            chosen = _select(_walk_local(path, wanted), None, wanted)
            if not self.add_reached(chosen):
                note = _SKIPPED_NOTE if chosen else ""
                raise InputError(f"no {suffixes} files found under directory {spec!r}{note}")
        elif _GLOB_MAGIC.intersection(spec):
            folder, pattern = split_glob(spec.split(os.sep))
            base = Path(os.sep.join(folder) or ("/" if spec.startswith(os.sep) else "."))
            tree = _walk_local(base, wanted, pattern) if base.is_dir() else None
            chosen = _select(tree, pattern, wanted) if tree else []
            if not self.add_reached(chosen):
                note = _SKIPPED_NOTE if chosen else ""
                raise InputError(f"glob pattern {spec!r} matched no {suffixes} files{note}")
        elif path.exists() or path.is_symlink():
            what = "a link that cannot be followed" if path.is_symlink() else "not a regular file"
            raise InputError(f"input {spec!r} is {what} (nor a directory)")
        else:
            raise InputError(f"input not found: {spec!r}")
