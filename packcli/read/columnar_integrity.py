"""What a Parquet or Arrow IPC file's own checks can say about its values before they become
documents (``packcli/read/columnar.py`` reads; this module judges).

Why each check:

* **Parquet page CRCs.** A writer may store a CRC32 per page (``write_page_checksum=True``);
  pyarrow checks it only when asked, so the reader always asks: a flipped bit in a page that
  carries one is an error instead of altered text. A page without one is trusted as far as
  its decoder goes: a damaged compressed page or page header usually fails to decode
  (``is_damage``), a bit flipped in an uncompressed page without a CRC cannot be seen.
* **Full validation of every array read** (``rows``). An Arrow IPC file is memory-mapped and
  its arrays are zero-copy views of the file's bytes: a damaged offset makes ``to_pylist``
  read outside the buffer (a segmentation fault), and bytes that are not UTF-8 in a string
  column raise ``UnicodeDecodeError``. So the array's structure is validated first
  (``validate(full=True)`` on a binary view of the same buffers: offsets and lengths); if
  it fails, none of its rows can be trusted (``Broken``). Then ``to_pylist``'s strict
  decoding is the UTF-8 check, and only an array it refuses is decoded row by row to find
  the rows that are not UTF-8.
* **An Arrow stream must end with its end-of-stream marker, at the end of the file**
  (``stream_end_problem``): a stream cut at a batch boundary otherwise reads as a shorter,
  valid stream (``datasets`` writes ``.arrow`` files as streams), and a second stream
  appended after the marker would be ignored.

Cost: see ``columnar.py``'s docstring.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

STREAM_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker of an Arrow IPC stream (continuation token, zero length)."""
_LEGACY_EOS = b"\x00\x00\x00\x00"  # before Arrow 0.15: a zero length without continuation


class Broken(Exception):
    """An array whose structure (offsets, lengths) fails validation: no row can be read."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (pyarrow's thrift errors span several)."""
    return re.sub(r"\s+", " ", str(exc)).strip() or type(exc).__name__


def is_damage(exc: BaseException) -> bool:
    """Whether pyarrow refused the data (a failed CRC, a decoder or thrift error, a body
    shorter than its header says) rather than the disk or network failing to read it.

    pyarrow raises its own ``OSError`` without an errno for damaged data, and one with the
    errno for a failed system call; a Python file object's own exception (fsspec: a
    ``ConnectionError``, a ``TimeoutError``, a store's error) comes through as itself. A read
    error is never skippable: it says nothing about the data.
    """
    if isinstance(exc, pa.ArrowException) and not isinstance(exc, OSError):
        return True  # ArrowInvalid, ArrowIndexError, ...: the bytes do not make sense
    return type(exc) is OSError and exc.errno is None


def binary_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every string type replaced by its binary twin (the same buffers)."""
    if pa.types.is_string(kind):
        return pa.binary()
    if pa.types.is_large_string(kind):
        return pa.large_binary()
    if pa.types.is_string_view(kind):
        return pa.binary_view()
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(binary_type(field.type)) for field in kind])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        field = kind.value_field.with_type(binary_type(kind.value_type))
        return pa.list_(field) if pa.types.is_list(kind) else pa.large_list(field)
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(kind.value_field.with_type(binary_type(kind.value_type)), kind.list_size)
    return kind


def text_type(kind: pa.DataType) -> pa.DataType | None:
    """The string type a binary column's bytes are read as (text is UTF-8 however a writer
    typed it: Parquet written without the UTF8 annotation reads as binary), or None."""
    if pa.types.is_binary(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.large_string()
    if pa.types.is_binary_view(kind):
        return pa.string_view()
    return None


def _is_text(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    )


def _decode(value: Any, kind: pa.DataType, errors: str) -> Any:
    """A value of ``binary_type(kind)`` as the ``kind`` value it stands for."""
    if value is None:
        return None
    if _is_text(kind):
        return value.decode("utf-8", errors)
    if pa.types.is_struct(kind):
        return {field.name: _decode(value[field.name], field.type, errors) for field in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_decode(item, kind.value_type, errors) for item in value]
    return value


def _utf8_message(err: UnicodeDecodeError, nested: bool) -> str:
    bad = err.object[err.start : max(err.end, err.start + 1)].hex(" ")
    where = f"byte {err.start + 1}" + (" of one of its strings" if nested else "")
    return f"invalid UTF-8 at {where}: {err.reason} ({bad})"


def rows(array: pa.Array) -> tuple[list[Any], dict[int, str]]:
    """The array's rows as Python values, and the rows (index: why) whose strings are not
    UTF-8; their values are decoded with ``surrogateescape``, so the bytes survive in the
    quarantine (``json`` writes them as ``\\udcXX``). ``Broken`` when the array's structure
    fails validation.

    The structure is validated on the binary view (offsets and lengths, no UTF-8 pass): the
    strict UTF-8 decoding ``to_pylist`` does anyway is the UTF-8 check, and only an array it
    refuses is decoded again row by row (a full ``validate`` would read the text twice:
    +50% on reading a Parquet file).
    """
    kind = array.type
    as_bytes = binary_type(kind)
    try:
        raw = array.view(as_bytes) if as_bytes != kind else array
    except pa.ArrowException:  # a layout ``view`` does not take: validate it as it is
        raw = array
    try:
        raw.validate(full=True)
    except pa.ArrowException as exc:  # offsets or lengths: broken whatever the text says
        raise Broken(one_line(exc)) from exc
    try:
        return array.to_pylist(), {}
    except UnicodeDecodeError as exc:
        if raw is array:  # no binary view to find the rows by (a dictionary, a map)
            raise Broken(f"invalid UTF-8: {exc}") from exc
    nested = not _is_text(kind)
    values: list[Any] = []
    bad: dict[int, str] = {}
    for i, value in enumerate(raw.to_pylist()):
        try:
            values.append(_decode(value, kind, "strict"))
        except UnicodeDecodeError as err:
            bad[i] = _utf8_message(err, nested)
            values.append(_decode(value, kind, "surrogateescape"))
    return values, bad


def stream_end_problem(source: pa.NativeFile, size: int, first: bytes) -> str | None:
    """Why an Arrow IPC stream read to its end (``source`` just past it) is incomplete, or
    None: the marker must be the last bytes read and nothing may follow it. ``first``: the
    file's first bytes (a stream in the pre-0.15 format has no continuation tokens)."""
    end = source.tell()
    marker = STREAM_EOS if first[:4] == STREAM_EOS[:4] else _LEGACY_EOS
    source.seek(max(end - len(marker), 0))
    if source.read(len(marker)) != marker:
        return "the stream ends without its end-of-stream marker (cut short?)"
    if end < size:
        return f"{size - end} byte(s) follow the end-of-stream marker (another stream appended?)"
    return None
