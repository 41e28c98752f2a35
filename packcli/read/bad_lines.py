r"""Why a line is bad: the slow path for a line the reader's fast path refused.

Everything here runs only for lines the fast path (one ``orjson.loads``, two type checks)
refused, so it may be slow and thorough (~10-20 us a line).

What is bad, and why. The reason key is what ``ReadStats.rejected``, ``rejected.jsonl`` and
``BadLineError.reason`` use; the message follows ``file:line:``.

================================================  ==========================================
input                                             outcome
================================================  ==========================================
UTF-8 BOM at the start of a file                  accepted (stripped)
CRLF line endings                                 accepted (``\r`` is JSON whitespace)
blank or whitespace-only line                     no document, no error: ``blank_lines``
duplicate keys                                    accepted, the last value wins (below)
number beyond a double, in any field              accepted if otherwise valid (below);
                                                  chat/preference: ``invalid_json``
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
Python's recursion limit first and be reported ``too_deep``). Chat and preference records
are used whole (tool calls and their arguments reach the template), where a number stood in
by 0 would change the data, so there such a line is ``invalid_json`` as orjson says.
"""

from __future__ import annotations

import json
import re

import orjson

MAX_DEPTH = 1024
"""Deepest nesting of arrays/objects accepted (orjson's own limit, applied to the fallback too)."""

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


def _type_name(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


Verdict = str | tuple[str, str]
"""What a refused line turns out to be: its text (accepted after all) or ``(reason, message)``."""


class _NonStandardConstant(ValueError):
    """``NaN``/``Infinity`` met by the standard-library fallback parser."""


def _reject_constant(name: str) -> object:
    raise _NonStandardConstant(name)


def _number_placeholder(_: str) -> int:
    # Only the text field is used; other numbers are never converted (no 4300-digit limit, no
    # quadratic int parsing). A number *as* the text field still reports "not a string".
    return 0


def check_document(doc: object, text_field: str) -> Verdict:
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


def _parse_with_big_numbers(text: str, text_field: str) -> Verdict | None:
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
    return _orjson_rules(doc) or check_document(doc, text_field)


def _classify_json_error(
    line: bytes, exc: orjson.JSONDecodeError, text_field: str, big_numbers: bool
) -> Verdict:
    """Why orjson refused ``line``: a specific reason, or the big-number fallback's text
    (tried only with ``big_numbers``)."""
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
    if big_numbers and text[pos : pos + 1] in _NUMBER_START:
        verdict = _parse_with_big_numbers(text, text_field)
        if verdict is not None:
            return verdict
    if last_line and pos >= len(text.rstrip()):
        return "truncated_line", f"invalid JSON: {exc.msg} at end of last line (file truncated?)"
    return "invalid_json", f"invalid JSON: {exc.msg} ({column})"


def diagnose(line: bytes, text_field: str, parsed: object, big_numbers: bool = True) -> Verdict:
    """The slow path for a non-blank line the fast path refused; ``parsed`` is what orjson made
    of it: the document, or the ``JSONDecodeError`` (no JSON value is an exception instance).
    ``big_numbers=False`` (a record validator uses the whole line, not one text field) never
    rescues a line orjson refused at a number."""
    if isinstance(parsed, orjson.JSONDecodeError):
        return _classify_json_error(line, parsed, text_field, big_numbers)
    return check_document(parsed, text_field)
