r"""Streaming jsonl reader: the first stage of the packing pipeline.

The reader turns a list of input specs (files, directories, glob patterns) into a stable,
sorted list of files, then streams their documents in batches of ``DocBatch``.

Why it looks the way it does:

* **Streaming, bounded memory.** Corpora can be terabytes, so files are read line by line in
  binary mode (plain, gzip or zstd) and only one batch of texts is held at a time. A single
  line can still be arbitrarily long; nothing else grows with the input size.
* **Stable document ids.** Inputs are deduplicated and sorted by path, and every accepted
  line gets the next global id in that order. The same inputs (and policy) therefore always
  give the same ids, which later stages use to refer back to documents (and
  ``file_index``/``line`` let any id be traced to ``file:line``).
* **Nothing lost, nothing corrupted.** Bad input is a policy, not an accident
  (``on_bad_line``). ``"error"`` (the default) stops with a ``BadLineError`` (an
  ``InputError``) naming ``file:line`` and the reason; for a corrupt compressed stream, the
  last trusted line, its uncompressed byte offset and the compressed byte where the failed
  gzip member or zstd frame begins. ``"skip"`` drops the line, counts it by
  reason key in ``ReadStats.rejected`` and hands its exact bytes to a ``RejectSink``
  (``rejected.jsonl``, base64, written atomically). Either way every line is accounted for:
  documents + rejected + blank lines = lines. I/O errors (a failing disk) are not bad *data*
  and raise whatever the policy.
* **Truncation is never silent.** A last line cut mid-JSON is ``truncated_line``; a gzip
  member or zstd frame cut short is a corrupt stream (the zstd library's ``stream_reader``
  would end it silently, so members are decoded with ``decompressobj`` one at a time).
* **Compressed data is verified before it is used.** A flipped byte inside a deflate stream
  usually decodes to plausible garbage with no error until the member's CRC32 at its very
  end, and a zstd frame's checksum also comes last, so each compressed file is first decoded
  once without parsing (``_check_stream``) to find the end of its last verified member
  (frame), and then read only up to the last newline before that. A zstd frame written
  without a content checksum has nothing to verify: only decode errors show its damage
  (logged at INFO). Cost, CPU seconds for 283 MB of jsonl (2-core box, median of 5): gzip
  2.65 -> 3.9 s (the check decodes at ~150 MB/s; the read pass's own decoder is faster than
  ``GzipFile`` was), zstd 1.1 -> 2.1 s: a few percent of tokenizing the same text
  (~10 MB/s with the fast path), paid before the file's first document.
* **The happy path pays nothing.** A good line costs one ``orjson.loads`` and two type
  checks, a blank line one failed parse and ``isspace``, as before the policy existed.
  Finding out *why* a line is bad (and the big-number fallback below) runs only after that
  check failed (~10-20 us a line). Measured on 300 MB of generated jsonl, CPU time, median
  of 9, before -> after: 3.7 KB documents 1.45 -> 1.35 s (~210 MB/s), 220-byte documents
  3.34 -> 3.13 s (~90 MB/s), the 3.7 KB file as zstd 1.96 -> 1.90 s: unchanged within noise.
* **Cheap progress.** ``DocBatch.progress_bytes`` counts on-disk (compressed) bytes consumed,
  read from the raw file position once per batch, so a progress bar over the sum of the file
  sizes stays accurate for compressed inputs without any per-line cost.

What is bad, and why. The reason key is what ``ReadStats.rejected``, ``rejected.jsonl`` and
``BadLineError.reason`` use; the message follows ``file:line:``.

================================================  ==========================================
input                                             outcome
================================================  ==========================================
UTF-8 BOM at the start of a file                  accepted (stripped)
CRLF line endings                                 accepted (``\r`` is JSON whitespace)
blank or whitespace-only line                     no document, no error: ``blank_lines``
duplicate keys                                    accepted, the last value wins (below)
number beyond a double, in any field              accepted if otherwise valid (below)
syntax error, trailing content, BOM mid-file      ``invalid_json``
last line cut mid-JSON or mid-UTF-8, no newline   ``truncated_line``
invalid UTF-8: truncated or overlong sequence,    ``invalid_utf8`` (message: byte column and
surrogate bytes ``ED A0 80``, stray continuation  bytes; orjson says "surrogates not
byte, ``FF``/``FE``                               allowed" for every kind)
``"\ud800"``: lone surrogate escape, anywhere     ``lone_surrogate`` (not encodable as UTF-8)
``NaN``, ``Infinity``, ``-Infinity``              ``nan_infinity`` (not JSON; Python's
                                                  ``json`` writes and reads them)
nesting deeper than ``MAX_DEPTH`` (1024)          ``too_deep`` (orjson's limit; a line of
                                                  100k ``[`` costs nothing)
a JSON value that is not an object                ``not_object``
text field absent / not a string / ``""``         ``missing_field`` / ``not_string`` /
                                                  ``empty_text``
corrupt, truncated or trailing junk in a ``.gz``  ``corrupt_stream``: under ``skip`` the
/ ``.zst`` (decode error, failed CRC32/size or    whole members (frames) before the failed
zstd checksum, cut mid-member, non-member bytes)  one are kept, cut at their last newline;
                                                  the rest of the file is not used, one
                                                  reject (``raw=b""``, line = last kept + 1)
                                                  recorded and the file listed in
                                                  ``ReadStats.corrupt_streams``
================================================  ==========================================

Duplicate keys: RFC 8259 leaves them undefined, and every mainstream reader (orjson, Python's
``json``, JavaScript's ``JSON.parse``, pandas, ``datasets``) keeps the last value. Doing the
same means packcli tokenizes exactly the text any other tool shows for that line, while
detecting them would need a second, slow parse of every good line.

Big numbers: JSON puts no limit on numbers; orjson's (it refuses a number that overflows a
double, e.g. an integer of more than ~309 digits, and silently turns integers beyond 64 bits
into floats) is an implementation limit, not bad data. Only the text field is used, so
rejecting a good document for, say, a 1024-bit hash in its metadata would lose it for
nothing. A line orjson refuses *at a number* is therefore parsed again by the standard
library (numbers not converted, which also dodges CPython's 4300-digit ``int`` limit) and
held to orjson's other rules: no NaN/Infinity, no lone surrogate anywhere, at most
``MAX_DEPTH`` levels. So such a line is accepted exactly when orjson would accept it with its
out-of-range numbers replaced by 0 (except that one nesting near ``MAX_DEPTH`` may hit
Python's recursion limit first and be reported ``too_deep``).
"""

from __future__ import annotations

import base64
import glob
import io
import json
import logging
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np
import orjson
import zstandard

from packcli.errors import InputError
from packcli.fs import is_url, local_path, open_binary, opened_size, spool

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz", ".jsonl.zst")
"""jsonl file name endings the reader accepts (matched case-insensitively)."""

FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": SUPPORTED_SUFFIXES,
    "parquet": (".parquet",),
    # Arrow IPC, file or stream format (``.arrows``; ``datasets`` writes streams as .arrow).
    "arrow": (".arrow", ".arrows", ".feather", ".ipc"),
}
"""File formats by name ending: found in folders and globs, and read as that format."""

HUB_PREFIX = "hf-dataset:"
"""An input spec naming a Hub dataset: ``hf-dataset:OWNER/NAME[@REVISION][/PATH]``."""

INPUT_FORMATS: tuple[str, ...] = ("auto", "jsonl", "parquet", "arrow", "hf-disk", "hub")
"""Values of ``--input-format``: ``auto`` decides per file by its name (and per folder: a
``save_to_disk`` folder is read as one); the others force it (``packcli/read_columnar.py``)."""

BAD_LINE_POLICIES: tuple[str, ...] = ("error", "skip")
"""Values of ``iter_batches(on_bad_line=...)``."""

MAX_DEPTH = 1024
"""Deepest nesting of arrays/objects accepted (orjson's own limit, applied to the fallback too)."""

_BOM = b"\xef\xbb\xbf"
_READ_BUFFER = 1 << 20  # buffered line reader size
_INPUT_CHUNK = 1 << 17  # compressed bytes fed to a decoder at a time
_OUTPUT_CHUNK = 1 << 20  # most gzip output decoded per call (deflate expands up to 1032x)
_GLOB_MAGIC = frozenset("*?[")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_CHAR = re.compile(r"[\ud800-\udfff]")
_NUMBER_START = frozenset("-0123456789")
_JSON_TYPE_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    str: "string",
    float: "float",
    list: "array",
    dict: "object",
}


@dataclass
class DocBatch:
    """A batch of documents in global input order.

    ``texts[i]`` has global id ``doc_id_start + i`` and comes from line ``line[i]`` (1-based) of
    ``paths[file_index[i]]`` (a Parquet/Arrow file: its row, 0-based). A batch may span
    several files.
    """

    texts: list[str]
    doc_id_start: int
    file_index: np.ndarray  # int32, per doc: index into the resolved path list
    line: np.ndarray  # int64, per doc: 1-based line number in its file (columnar: 0-based row)
    progress_bytes: int  # cumulative on-disk bytes of all inputs consumed so far


@dataclass
class ReadStats:
    """Counters filled in by ``iter_batches`` (up to date at every yielded batch and at the end)."""

    files: int = 0  # files done: read to the end, or abandoned at a corrupt stream under skip
    documents: int = 0
    blank_lines: int = 0
    bytes_read: int = 0  # uncompressed bytes
    lines: int = 0  # lines read: documents + blank + rejected
    rejected: dict[str, int] = field(default_factory=dict)  # reason key -> lines (``skip``)
    # Under ``skip``, one entry per compressed file that failed verification: ``file``,
    # ``reason``, ``kept_lines``, ``discarded_lines`` (decoded after them; fewer than were
    # lost when decoding stopped early) and ``byte`` (compressed offset of the failed member).
    corrupt_streams: list[dict[str, Any]] = field(default_factory=list)
    # With ``span``: the byte offset of the span's first line (the start of the first line
    # that begins inside the span); ``count_newlines(path, first_line_byte)`` lines precede it.
    first_line_byte: int = 0
    # Columnar inputs with a row-group range: the rows of the file before it.
    rows_before: int = 0


class BadLineError(InputError):
    """A line (or compressed stream) refused under ``on_bad_line="error"``.

    An ``InputError`` like any other for the CLI; the fields let callers and tests tell the
    cases apart without parsing the message.
    """

    def __init__(self, file: str, line: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.reason = reason


_RAW_KEY = b', "raw_b64": "'


def _reject_record(file: str, line: int, reason: str, detail: str, raw_b64: bytes) -> bytes:
    # stdlib json with ensure_ascii: a file name that is not valid UTF-8 (surrogateescape) is
    # still written, as \udcXX escapes, where orjson would raise. The base64 is spliced in as
    # bytes: it needs no escaping, and json.dumps takes ~1 s per 40 MB to find that out.
    head = json.dumps({"file": file, "line": line, "reason": reason, "detail": detail})
    return b"".join((head[:-1].encode("ascii"), _RAW_KEY, raw_b64, b'"}\n'))


def shift_reject_lines(source: BinaryIO, sink: BinaryIO, offset: int) -> None:
    """Copy ``rejected.jsonl`` records adding ``offset`` to each ``line``: a span's records
    count lines from the span, and become file lines once the spans before it are counted."""
    for record in source:
        head, _, raw = record.partition(_RAW_KEY)
        meta = json.loads(head + b"}")
        meta["line"] += offset
        sink.write(_reject_record(**meta, raw_b64=raw.removesuffix(b'"}\n')))


class RejectSink:
    """Quarantine for rejected lines: one JSON object per line in ``path`` (``rejected.jsonl``).

    Each record is ``{"file", "line", "reason", "detail", "raw_b64"}``: ``raw_b64`` is the
    base64 of the line's exact bytes (terminator included, so a truncated last line shows as
    such; invalid UTF-8 survives, which no JSON string could carry). Records are streamed to
    a temp file as they come, so memory stays flat however many lines are bad. Closing
    without error renames the temp file to ``path``; leaving the ``with`` block on an
    exception discards it, so ``path`` only ever holds a complete quarantine. No file is
    created when nothing was rejected.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.count = 0
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._fh: BinaryIO | None = None
        self._closed = False

    def add(self, file: str, line: int, reason: str, raw: bytes, detail: str = "") -> None:
        """Quarantine one line: ``file:line`` as reported, a reason key, the raw bytes."""
        if self._closed:
            raise ValueError(f"RejectSink({self.path}) is closed")
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self._tmp, "wb")  # noqa: SIM115 (closed in close/abort)
        self._fh.write(_reject_record(file, line, reason, detail, base64.b64encode(raw)))
        self.count += 1

    def close(self) -> None:
        """Publish the quarantine (fsync, rename); a no-op if nothing was rejected."""
        if self._closed:
            return
        self._closed = True
        fh, self._fh = self._fh, None
        if fh is None:
            return
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discard what was written so far; ``path`` is left untouched."""
        self._closed = True
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> RejectSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --------------------------------------------------------------------------- input resolution


def _compression(path: Path | str) -> str | None:
    """``"plain"``, ``"gzip"`` or ``"zstd"`` from the file name, or ``None`` if unsupported."""
    name = os.fspath(path).lower()
    if name.endswith(".jsonl"):
        return "plain"
    if name.endswith(".jsonl.gz"):
        return "gzip"
    if name.endswith(".jsonl.zst"):
        return "zstd"
    return None


def suffix_format(path: Path | str) -> str | None:
    """``"jsonl"``, ``"parquet"`` or ``"arrow"`` from the file name, or ``None``."""
    name = os.fspath(path).lower()
    return next((f for f, ends in FORMAT_SUFFIXES.items() if name.endswith(ends)), None)


def file_format(path: Path | str, input_format: str = "auto") -> str | None:
    """How a resolved input file is read: as the forced columnar format whatever its name
    (``--input-format parquet|arrow``), else by its name (jsonl's says its compression)."""
    return input_format if input_format in ("parquet", "arrow") else suffix_format(path)


def splittable(path: Path | str) -> bool:
    """Whether byte ranges of ``path`` can be read on their own (uncompressed jsonl only:
    gzip and zstd streams cannot be entered mid-way)."""
    return _compression(path) == "plain"


def split_spans(size: int, split_bytes: int) -> list[tuple[int, int]] | None:
    """Byte ranges of at most ``split_bytes`` covering a file of ``size`` bytes, or ``None``
    (read it whole) when it is not larger than that or splitting is off (``split_bytes`` 0)."""
    if split_bytes <= 0 or size <= split_bytes:
        return None
    return [(lo, min(lo + split_bytes, size)) for lo in range(0, size, split_bytes)]


def count_newlines(path: Path | str, end: int) -> int:
    """Newlines in the first ``end`` bytes of ``path``: the number of lines before byte ``end``
    when ``end`` starts a line. Used to turn span-relative line numbers into file lines, on
    the error path only (it reads everything before ``end``)."""
    count = 0
    with open_binary(path) as fh:
        while end > 0 and (block := fh.read(min(end, _READ_BUFFER))):
            count += block.count(b"\n")
            end -= len(block)
    return count


def _suffix_list(formats: Sequence[str] = ("jsonl",)) -> str:
    return ", ".join(s for f in formats for s in FORMAT_SUFFIXES[f])


def _wanted_formats(input_format: str) -> tuple[str, ...]:
    """File formats that folders and globs yield under ``input_format``."""
    if input_format in ("jsonl", "parquet", "arrow"):
        return (input_format,)
    return ("arrow",) if input_format == "hf-disk" else tuple(FORMAT_SUFFIXES)


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
    wanted = _wanted_formats(input_format)
    suffixes = _suffix_list(wanted)
    # resolved path -> (absolute path shown to the user, sort key)
    found: dict[Path | str, tuple[Path | str, tuple[str, int]]] = {}
    fences = [Path(p).resolve() for p in exclude if not is_url(p)]
    # A remote --out: inputs under its prefix are its own output files.
    url_fences = [_url_fence(str(p)) for p in exclude if is_url(p)]
    fenced_out = 0  # files skipped because they are under an excluded folder

    def fence_of(path: Path) -> Path | None:
        resolved = path.resolve()
        return next((f for f in fences if resolved.is_relative_to(f)), None)

    def refuse_inside(spec: str, path: Path) -> None:
        if (fence := fence_of(path)) is not None:
            raise InputError(
                f"input {spec!r} is inside {fence}, where packcli writes its output: "
                "move the inputs elsewhere or choose another --out/--work-dir"
            )

    def add_found(files: list[Path]) -> int:
        nonlocal fenced_out
        kept = [p for p in files if fence_of(p) is None]
        fenced_out += len(files) - len(kept)
        for p in kept:
            add(p)
        return len(kept)

    def add(path: Path, order: tuple[str, int] | None = None) -> None:
        shown = Path(os.path.abspath(path))
        key = path.resolve()
        old = found.get(key)
        if old is None or str(shown) < str(old[0]):
            # A save_to_disk folder's files sort as its state.json lists them, together
            # where the folder's name sorts.
            found[key] = (shown, order or (old[1] if old else (str(shown), -1)))

    skipped_note = " (files under the output and work folders are not inputs)"
    for spec in specs:
        if input_format == "hub" or spec.startswith(HUB_PREFIX):
            from packcli.read.columnar import hub_local_spec

            spec = hub_local_spec(spec, wanted)
        spec = local_path(spec)  # file:// is a local path
        if is_url(spec):
            from packcli.fs import expand, redact

            urls, ordered = expand(
                spec,
                lambda p: suffix_format(p) in wanted,
                saved_dataset=input_format in ("auto", "hf-disk"),
                any_name=input_format in ("parquet", "arrow"),
            )
            kept = [u for u in urls if not any(u.startswith(f) for f in url_fences)]
            fenced_out += len(urls) - len(kept)
            if not kept:
                note = skipped_note if urls else ""
                raise InputError(f"{redact(spec)!r} matched no {suffixes} files{note}")
            for i, url in enumerate(kept):
                order = (spec.rstrip("/") + "/", i) if ordered else (url, -1)
                found.setdefault(url, (url, order))
            continue
        path = Path(spec)
        if path.is_file():
            if input_format == "hf-disk" or (
                input_format not in ("parquet", "arrow") and suffix_format(path) not in wanted
            ):
                raise InputError(
                    f"unsupported input file {spec!r}: supported suffixes are {suffixes}"
                    + (" (or pass --input-format parquet|arrow)" if input_format == "auto" else "")
                )
            refuse_inside(spec, path)
            add(path)
        elif path.is_dir():
            refuse_inside(spec, path)
            if input_format == "hf-disk" or (input_format == "auto" and _is_saved_dataset(path)):
                from packcli.read.columnar import hf_disk_files

                shown = os.path.abspath(path) + os.sep
                for i, member in enumerate(hf_disk_files(path)):
                    add(member, (shown, i))
                continue
            files = _files_under(path, wanted)
            if not add_found(files):
                note = skipped_note if files else ""
                raise InputError(f"no {suffixes} files found under directory {spec!r}{note}")
        elif _GLOB_MAGIC.intersection(spec):
            files = []
            for match in glob.glob(spec, recursive=True):
                mpath = Path(match)
                if mpath.is_dir():
                    files.extend(_files_under(mpath, wanted))
                elif suffix_format(mpath) in wanted and mpath.is_file():
                    files.append(mpath)
            if not add_found(files):
                note = skipped_note if files else ""
                raise InputError(f"glob pattern {spec!r} matched no {suffixes} files{note}")
        elif path.exists():
            raise InputError(f"input {spec!r} is not a regular file or directory")
        else:
            raise InputError(f"input not found: {spec!r}")

    if not found:
        raise InputError("no input files given")
    if fenced_out:
        logger.info("not reading %d file(s) under the output or work folder", fenced_out)
    result = [shown for shown, _ in sorted(found.values(), key=lambda v: v[1])]
    logger.debug("resolved %d input spec(s) to %d file(s)", len(specs), len(result))
    return result


def _url_fence(url: str) -> str:
    from packcli.fs import normalize

    return normalize(url) + "/"


def _is_saved_dataset(folder: Path) -> bool:
    """A ``datasets`` ``save_to_disk`` folder (a Dataset, or a DatasetDict to refuse): by its
    ``state.json`` (``_data_files``) or ``dataset_dict.json`` (``splits``), so a corpus
    folder that merely holds a file of either name is searched as usual."""
    for name, key in (("state.json", "_data_files"), ("dataset_dict.json", "splits")):
        try:
            if key in json.loads((folder / name).read_text(encoding="utf-8")):
                return True
        except (OSError, ValueError, TypeError):
            continue
    return False


# --------------------------------------------------------------------------- opening files

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_CHECKSUM_FLAG = 0x04  # Content_Checksum_flag in a zstd frame's header descriptor byte
_MEMBER_NAME = {"gzip": "gzip member", "zstd": "zstd frame"}


class _CorruptStream(Exception):
    """A gzip member or zstd frame failed to decode or to verify.

    ``member`` is its 1-based number, ``start`` the compressed byte where it begins (the last
    point known good), ``seen`` the compressed bytes read when the failure showed (the damage
    is before that, in this member, though a decoder may notice it only at the checksum).
    """

    def __init__(self, detail: str, kind: str, member: int, start: int, seen: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.kind = kind
        self.member = member
        self.start = start
        self.seen = seen

    def describe(self) -> str:
        return (
            f"{_MEMBER_NAME[self.kind]} {self.member} (from compressed byte {self.start}) "
            f"{self.detail} (noticed by compressed byte {self.seen})"
        )


class _MemberDecoder:
    """Decodes a gzip or zstd file one member (zstd: frame) at a time.

    Iterating yields ``(data, member_end)``: decoded bytes, and whether a member ended right
    after them, its checksum verified (gzip: the CRC32 and size in the member's trailer, which
    zlib checks; zstd: the frame's content checksum, when the frame has one). Damage raises
    ``_CorruptStream``: a decode error, a failed checksum, input that is no member at all
    (junk after the last member) or that ends inside one (truncation; the zstd library's own
    ``stream_reader`` would end silently there). Zero bytes between gzip members are padding
    and accepted, as ``gzip -d`` and Python's ``gzip`` do.

    Memory stays bounded by the chunk sizes (gzip output is capped per call; zstd decodes a
    whole ``_INPUT_CHUNK`` of input per call, as the zstd reader always did).
    """

    def __init__(self, raw: BinaryIO, kind: str) -> None:
        self.raw = raw
        self.kind = kind
        self.member = 0  # members begun
        self.start = 0  # compressed byte where the current (or next) member begins
        self.seen = 0  # compressed bytes read from ``raw``
        self.unchecked = 0  # zstd frames without a content checksum: nothing to verify

    def _read(self) -> bytes:
        chunk = self.raw.read(_INPUT_CHUNK)
        self.seen += len(chunk)
        return chunk

    def _corrupt(self, detail: str) -> _CorruptStream:
        return _CorruptStream(detail, self.kind, self.member, self.start, self.seen)

    def __iter__(self) -> Iterator[tuple[bytes, bool]]:
        gz = self.kind == "gzip"
        dctx = None if gz else zstandard.ZstdDecompressor()
        dobj: Any = None  # the current member's decoder; None between members
        pending = b""  # input read and not yet consumed
        drained = True  # zlib holds no output for input it already took
        while True:
            if not pending and drained:
                pending = self._read()
                if not pending:
                    if dobj is not None:
                        raise self._corrupt("is cut short: the file ends inside it (truncated?)")
                    return
            if dobj is None:
                if gz:
                    stripped = pending.lstrip(b"\0")
                    self.start += len(pending) - len(stripped)
                    pending = stripped
                    if not pending:
                        continue
                    dobj = zlib.decompressobj(31)  # 31: gzip header and trailer, checked
                else:
                    while len(pending) < 5 and (more := self._read()):
                        pending += more
                    header = pending[:5]  # shorter only at a cut, which decoding reports
                    if header[:4] == _ZSTD_MAGIC and len(header) == 5:
                        self.unchecked += not header[4] & _ZSTD_CHECKSUM_FLAG
                    dobj = dctx.decompressobj()  # type: ignore[union-attr]
                self.member += 1
            try:
                if gz:
                    data = dobj.decompress(pending, _OUTPUT_CHUNK)
                    pending = dobj.unconsumed_tail
                    drained = len(data) < _OUTPUT_CHUNK
                else:
                    data = dobj.decompress(pending)
                    pending = b""
            except (zlib.error, zstandard.ZstdError) as exc:
                raise self._corrupt(f"is damaged: {exc}") from exc
            if dobj.eof:
                pending = dobj.unused_data  # the next member's bytes
                self.start = self.seen - len(pending)
                dobj = None
                drained = True
                yield data, True
            elif data:
                yield data, False


@dataclass
class _StreamCheck:
    """What a verification pass over a compressed file found (see ``_check_stream``)."""

    keep_bytes: int | None  # uncompressed bytes to read; None: all of it (nothing failed)
    kept_lines: int  # complete lines in those bytes
    failure: _CorruptStream | None = None
    discarded_lines: int = 0  # lines decoded after the kept part (fewer if decoding stopped)


def _check_stream(path: Path, kind: str) -> _StreamCheck:
    """Decode the whole file once, without parsing, to find its verified prefix.

    A gzip member's data can only be trusted once its trailer's CRC verified, and a damaged
    member usually decodes to garbage without error until then; a zstd frame's at its
    checksum. Since a ``.gz`` is usually one member of gigabytes, holding a member's lines
    back until it verifies would cost unbounded memory; a separate pass costs one more
    decompression (measured on this project's 2-core box: ~95 MB/s of output for gzip,
    ~140 MB/s for zstd, i.e. a few percent of tokenizing the same text) and nothing else.
    On failure the prefix ends at the last newline before the failed member: a line that
    runs into it is not trusted either.
    """
    try:
        with open_binary(path, 0) as raw:
            decoder = _MemberDecoder(raw, kind)
            out = lines = 0
            last_newline = 0  # uncompressed offset just past the last newline so far
            keep = kept_lines = 0  # as of the end of the last verified member
            try:
                for data, member_end in decoder:
                    if n := data.count(b"\n"):
                        lines += n
                        last_newline = out + data.rfind(b"\n") + 1
                    out += len(data)
                    if member_end:
                        keep, kept_lines = last_newline, lines
            except _CorruptStream as exc:
                return _StreamCheck(keep, kept_lines, exc, lines - kept_lines)
    except OSError as exc:
        raise InputError(f"{path}: read error while verifying the stream: {exc}") from exc
    if decoder.unchecked:
        logger.info(
            "%s: %d zstd frame(s) carry no content checksum; damage inside them cannot be "
            "detected (zstd -C / write_checksum=True adds one)",
            path,
            decoder.unchecked,
        )
    return _StreamCheck(None, lines)


class _DecodedReader(io.RawIOBase):
    """Raw stream over a ``_MemberDecoder``'s output, ending after ``limit`` bytes (``None``:
    at the end of the stream). It hands out whatever was decoded next, so a ``BufferedReader``
    on top yields every complete line decoded before a failure (``GzipFile`` in a
    ``BufferedReader`` would fill the whole buffer first)."""

    def __init__(self, decoder: _MemberDecoder, limit: int | None) -> None:
        super().__init__()
        self._chunks = iter(decoder)
        self._left = limit
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        while not self._out:
            if self._left == 0:
                return 0
            data = next(self._chunks, None)
            if data is None:
                return 0
            chunk = data[0]
            if self._left is not None:
                chunk = chunk[: self._left]
                self._left -= len(chunk)
            self._out = memoryview(chunk)
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


def _open_lines(path: Path, raw: BinaryIO, limit: int | None = None) -> BinaryIO:
    """A binary line stream over ``raw``: its first ``limit`` uncompressed bytes, or all.

    Reading a compressed stream raises ``_CorruptStream`` at damage; other ``OSError``s are
    read errors (the disk, not the data) and are never skipped.
    """
    kind = _compression(path)
    if kind == "plain":
        return raw
    if kind in _MEMBER_NAME:
        reader = _DecodedReader(_MemberDecoder(raw, kind), limit)
        return io.BufferedReader(reader, _READ_BUFFER)  # type: ignore[return-value]
    raise InputError(f"{path}: unsupported input suffix; supported suffixes are {_suffix_list()}")


# --------------------------------------------------------------------------- reading


def _make_batch(
    texts: list[str],
    lines: list[int],
    segments: list[tuple[int, int]],
    doc_id_start: int,
    progress_bytes: int,
) -> DocBatch:
    n = len(texts)
    file_index = np.empty(n, dtype=np.int32)
    for i, (start, idx) in enumerate(segments):
        end = segments[i + 1][0] if i + 1 < len(segments) else n
        file_index[start:end] = idx
    return DocBatch(
        texts=texts,
        doc_id_start=doc_id_start,
        file_index=file_index,
        line=np.array(lines, dtype=np.int64),
        progress_bytes=progress_bytes,
    )


def _type_name(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- bad lines
# Everything below runs only for lines the fast path refused, so it may be slow and thorough.

_Verdict = str | tuple[str, str]
"""What a refused line turns out to be: its text (accepted after all) or ``(reason, message)``."""


class _NonStandardConstant(ValueError):
    """``NaN``/``Infinity`` met by the standard-library fallback parser."""


def _reject_constant(name: str) -> object:
    raise _NonStandardConstant(name)


def _number_placeholder(_: str) -> int:
    # Only the text field is used; other numbers are never converted (no 4300-digit limit, no
    # quadratic int parsing). A number *as* the text field still reports "not a string".
    return 0


def _check_document(doc: object, text_field: str) -> _Verdict:
    if type(doc) is not dict:
        return "not_object", f"line is not a JSON object (got {_type_name(doc)})"
    if text_field not in doc:
        return "missing_field", f"missing field {text_field!r}"
    text = doc[text_field]
    if type(text) is not str:
        return "not_string", f"field {text_field!r} is not a string (got {_type_name(text)})"
    if not text:
        return "empty_text", f"field {text_field!r} is empty"
    return text


def _orjson_rules(doc: object) -> tuple[str, str] | None:
    """The checks orjson makes while parsing, applied to a standard-library parse."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if type(value) is str:
            if _SURROGATE_CHAR.search(value):
                return "lone_surrogate", "lone surrogate escape in a string: not valid Unicode"
        elif isinstance(value, list | dict):
            if depth > MAX_DEPTH:
                return "too_deep", f"nesting too deep (more than {MAX_DEPTH} levels)"
            children = value if isinstance(value, list) else [*value, *value.values()]
            stack.extend((child, depth + 1) for child in children)
    return None


def _parse_with_big_numbers(text: str, text_field: str) -> _Verdict | None:
    """Fallback for a line orjson refused at a number: ``None`` if it is invalid anyway."""
    try:
        doc = json.loads(
            text,
            parse_int=_number_placeholder,
            parse_float=_number_placeholder,
            parse_constant=_reject_constant,
        )
    except _NonStandardConstant:
        return "nan_infinity", "non-standard JSON (NaN/Infinity)"
    except RecursionError:
        return "too_deep", "nesting too deep (Python's recursion limit)"
    except ValueError:
        return None
    return _orjson_rules(doc) or _check_document(doc, text_field)


def _classify_json_error(line: bytes, exc: orjson.JSONDecodeError, text_field: str) -> _Verdict:
    """Why orjson refused ``line``: a specific reason, or the big-number fallback's text."""
    last_line = not line.endswith(b"\n")  # only the last line of a file can lack one
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        if last_line and err.end == len(line):
            return "truncated_line", "line ends inside a UTF-8 sequence (file truncated?)"
        bad = line[err.start : max(err.end, err.start + 1)].hex(" ")
        return "invalid_utf8", f"invalid UTF-8 at byte {err.start + 1}: {err.reason} ({bad})"
    pos = exc.pos
    column = f"at column {pos + 1}"
    if text.startswith("\ufeff"):
        return "invalid_json", "invalid JSON: UTF-8 byte order mark (BOM) not at file start"
    if "surrogate" in exc.msg or _SURROGATE_ESCAPE.match(text, pos):
        return "lone_surrogate", f"lone surrogate escape {text[pos : pos + 6]} {column}"
    if "depth" in exc.msg or "recursion" in exc.msg.lower():
        return "too_deep", f"nesting too deep (more than {MAX_DEPTH} levels) {column}"
    if text.startswith(("NaN", "Infinity"), pos):
        return "nan_infinity", f"non-standard JSON (NaN/Infinity) {column}"
    if text[pos : pos + 1] in _NUMBER_START:
        verdict = _parse_with_big_numbers(text, text_field)
        if verdict is not None:
            return verdict
    if last_line and pos >= len(text.rstrip()):
        return "truncated_line", f"invalid JSON: {exc.msg} at end of last line (file truncated?)"
    return "invalid_json", f"invalid JSON: {exc.msg} ({column})"


def _diagnose(line: bytes, text_field: str, parsed: object) -> _Verdict:
    """The slow path for a non-blank line the fast path refused; ``parsed`` is what orjson made
    of it: the document, or the ``JSONDecodeError`` (no JSON value is an exception instance)."""
    if isinstance(parsed, orjson.JSONDecodeError):
        return _classify_json_error(line, parsed, text_field)
    return _check_document(parsed, text_field)


def _corrupt_message(path: Path, check: _StreamCheck) -> str:
    assert check.failure is not None
    return (
        f"{path}: corrupt compressed stream after line {check.kept_lines} "
        f"(uncompressed byte {check.keep_bytes}): {check.failure.describe()}"
    )


def _record_corrupt_stream(
    path: Path, check: _StreamCheck, stats: ReadStats, rejects: RejectSink | None
) -> None:
    """Under ``skip``: one ``corrupt_stream`` reject for the file (``raw=b""``, the line after
    the last one kept) and its entry in ``stats.corrupt_streams``."""
    failure = check.failure
    assert failure is not None
    message = (
        f"{_corrupt_message(path, check)}; kept the {check.kept_lines} line(s) before it, "
        f"discarded {check.discarded_lines} decoded after them"
    )
    logger.warning("%s", message)
    stats.rejected["corrupt_stream"] = stats.rejected.get("corrupt_stream", 0) + 1
    stats.corrupt_streams.append(
        {
            "file": str(path),
            "reason": failure.describe(),
            "kept_lines": check.kept_lines,
            "discarded_lines": check.discarded_lines,
            "byte": failure.start,
        }
    )
    if rejects is not None:
        detail = message.removeprefix(f"{path}: ")
        rejects.add(str(path), check.kept_lines + 1, "corrupt_stream", b"", detail)


class _LineBase:
    """Lines before a span's first line, counted once and only when an error needs them."""

    def __init__(self, path: Path, first_line_byte: int) -> None:
        self.path = path
        self.first_line_byte = first_line_byte
        self._count: int | None = None if first_line_byte else 0

    def __call__(self) -> int:
        if self._count is None:
            self._count = count_newlines(self.path, self.first_line_byte)
        return self._count


def iter_batches(
    paths: Sequence[Path],
    text_field: str = "text",
    batch_size: int = 1024,
    stats: ReadStats | None = None,
    *,
    on_bad_line: str = "error",
    rejects: RejectSink | None = None,
    validate: Callable[[Any], Any] | None = None,
    span: tuple[int, int] | None = None,
    batch_bytes: int = 0,
    verify_streams: bool = True,
) -> Iterator[DocBatch]:
    """Stream the documents of ``paths`` (in the given order) in batches of ``batch_size``.

    A document is a line holding a JSON object whose top-level ``text_field`` is a non-empty
    string. Blank lines are skipped and counted (they keep their line number but get no
    document id). Any other line is bad (see the module docstring for the cases): with
    ``on_bad_line="error"`` it raises ``BadLineError`` (an ``InputError``) ``"file:line:
    reason"``; with ``"skip"`` it is counted by reason in ``stats.rejected`` and passed to
    ``rejects`` (if given), and reading goes on. Document ids stay contiguous over the kept
    documents. Every batch except the last holds exactly ``batch_size`` documents, unless
    ``batch_bytes`` (> 0) ends it early: a batch closes once its lines reach that many bytes,
    so a run of huge documents cannot make one batch of gigabytes (the tokenizer turns a
    batch into Python lists of ~40 bytes a token). ``stats``,
    if given, is updated as reading proceeds.

    ``validate`` replaces the text-field rule for other record kinds (chat): it gets the parsed
    line and returns the value to put in ``DocBatch.texts``, or raises ``ValueError`` whose
    message is the reason (reason key ``bad_record``).

    ``span=(lo, hi)`` reads only the lines that *begin* in bytes ``lo..hi-1`` of a single
    uncompressed file (the last one read past ``hi`` to its end), so consecutive spans read
    every line exactly once and tokenize tasks can share one huge file. Line numbers in
    batches, ``stats`` and ``rejects`` then count from the span's first line (the caller adds
    the lines of the spans before it); errors raised here still name the file's own line.

    A compressed file is verified in a first pass (``_check_stream``) and then read only up
    to the end of its last verified member (frame): garbled data never becomes a document.
    A file that fails is ``corrupt_stream``: ``"error"`` stops before reading it, ``"skip"``
    keeps its verified lines and records the file in ``stats.corrupt_streams``.
    ``verify_streams=False`` trusts data as it decodes and quietly stops a file where
    decoding fails: for a quick look at the first documents (the backend sample), whose
    file the verified read reports; never for data to pack.
    """
    if span is not None:
        if len(paths) != 1 or not splittable(paths[0]):
            raise ValueError("span needs exactly one uncompressed .jsonl file")
        if not 0 <= span[0] <= span[1]:
            raise ValueError(f"span must be (lo, hi) with 0 <= lo <= hi, got {span}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if on_bad_line not in BAD_LINE_POLICIES:
        raise ValueError(f"on_bad_line must be one of {BAD_LINE_POLICIES}, got {on_bad_line!r}")
    skip = on_bad_line == "skip"
    if stats is None:
        stats = ReadStats()
    rejected = stats.rejected

    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    key = text_field

    texts: list[str] = []
    text_bytes = 0  # bytes of the lines in ``texts``
    lines: list[int] = []
    segments: list[tuple[int, int]] = []  # (offset in batch, file index) where a file starts
    next_id = 0  # global id of texts[0]
    done_bytes = 0  # on-disk size of the files read to the end

    for file_index, path in enumerate(paths):
        kind = _compression(path)
        spooled = None  # a remote compressed file, fetched once for both passes
        try:
            if verify_streams and kind in _MEMBER_NAME and is_url(path):
                spooled = spool(str(path))
            raw = open_binary(spooled or path, _READ_BUFFER)  # a local file or a URL's
        except OSError as exc:
            if spooled is not None:
                spooled.unlink(missing_ok=True)
            raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc
        lineno = 0
        counted = 0  # lines already added to stats.lines
        blank = 0
        nbytes = 0
        bom = False
        try:
            size = opened_size(raw)
            lo, hi = (0, size) if span is None else (min(span[0], size), min(span[1], size))
            check = None  # a compressed file's verified prefix (None: plain, or not verified)
            if verify_streams and kind in _MEMBER_NAME:
                check = _check_stream(spooled or path, kind)
                if check.failure is not None and not skip:
                    raise BadLineError(
                        str(path),
                        check.kept_lines + 1,
                        "corrupt_stream",
                        f"{_corrupt_message(path, check)}. Replace the file, or pass "
                        f"--on-bad-line skip to keep its first {check.kept_lines} line(s)",
                    )
            stream = _open_lines(path, raw, None if check is None else check.keep_bytes)
            logger.debug("reading %s (%d bytes on disk)", path, size)
            segments.append((len(texts), file_index))
            texts_append = texts.append
            lines_append = lines.append
            pos = lo  # where the next line starts (tracked for spans only)
            if lo > 0:
                raw.seek(lo - 1)
                if raw.read(1) != b"\n":  # the rest of a line that began in an earlier span
                    pos += len(raw.readline())
                stats.first_line_byte = pos
            line_base = _LineBase(path, pos)
            try:
                if lo == 0 and stream.peek(3)[:3] == _BOM:  # type: ignore[attr-defined]
                    stream.read(3)
                    nbytes += 3
                    pos += 3
                    bom = True
                for line in stream:
                    if span is not None:
                        if (0 if bom and not lineno else pos) >= hi:  # a BOM is in line 1
                            break
                        pos += len(line)
                    lineno += 1
                    nbytes += len(line)
                    # The fast path: one parse, two type checks, as cheap as before the policy
                    # existed. Blank lines cost what they did; anything else unusual goes to
                    # _diagnose, which is allowed to be slow.
                    record_error = None
                    try:
                        doc = loads(line)
                        text = doc[key] if validate is None else validate(doc)
                    except decode_error as exc:
                        if line.isspace():
                            blank += 1
                            continue
                        text = doc = exc
                    except (KeyError, TypeError):
                        text = None
                    except ValueError as exc:  # validate's reason, e.g. a malformed dialogue
                        text, record_error = None, ("bad_record", str(exc))
                    if (
                        text is None
                        if validate is not None
                        else (type(text) is not str or not text)
                    ):
                        verdict = record_error or _diagnose(line, key, doc)
                        if isinstance(verdict, str):
                            text = verdict  # valid after all (big numbers)
                        else:
                            reason, message = verdict
                            if not skip:
                                at = line_base() + lineno
                                raise BadLineError(str(path), at, reason, f"{path}:{at}: {message}")
                            rejected[reason] = rejected.get(reason, 0) + 1
                            if rejects is not None:
                                raw_line = _BOM + line if bom and lineno == 1 else line
                                rejects.add(str(path), lineno, reason, raw_line, message)
                            continue
                    if len(texts) == batch_size or (batch_bytes and text_bytes >= batch_bytes):
                        # Flush lazily (only once another document arrives) so that a batch
                        # ending a file is yielded after the file is done, with exact progress.
                        full = len(texts)
                        stats.documents = next_id + full
                        stats.blank_lines += blank
                        stats.bytes_read += nbytes
                        stats.lines += lineno - counted
                        blank = nbytes = 0
                        counted = lineno
                        yield _make_batch(
                            texts, lines, segments, next_id, done_bytes + min(raw.tell(), hi) - lo
                        )
                        next_id += full
                        text_bytes = 0
                        texts = []
                        lines = []
                        segments = [(0, file_index)]
                        texts_append = texts.append
                        lines_append = lines.append
                    texts_append(text)
                    lines_append(lineno)
                    text_bytes += len(line)
            except _CorruptStream as exc:
                if check is not None:  # verified in the first pass, so the file changed since
                    raise InputError(
                        f"{path}: changed while being read ({exc.describe()}); run again"
                    ) from exc
                # verify_streams=False, a quick look: stop here; the verified read reports it
                logger.debug("%s: stopped after line %d: %s", path, lineno, exc.describe())
            except OSError as exc:
                raise InputError(f"{path}: read error after line {lineno}: {exc}") from exc
            stream.close()
            if check is not None and check.failure is not None:  # under skip
                _record_corrupt_stream(path, check, stats, rejects)
        finally:
            raw.close()
            if spooled is not None:
                spooled.unlink(missing_ok=True)
        done_bytes += hi - lo
        stats.files += 1
        stats.blank_lines += blank
        stats.bytes_read += nbytes
        stats.lines += lineno - counted
        stats.documents = next_id + len(texts)
        if len(texts) == batch_size or (batch_bytes and text_bytes >= batch_bytes):
            yield _make_batch(texts, lines, segments, next_id, done_bytes)
            next_id += len(texts)
            text_bytes = 0
            texts = []
            lines = []
            segments = []

    if texts:
        yield _make_batch(texts, lines, segments, next_id, done_bytes)
