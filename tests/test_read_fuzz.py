"""Fuzzing the reader's bad-input policy: every line is a document, a blank line or a reject.

Random files are built from lines of several kinds (valid documents, mutations of them, random
bytes, random unicode, the known hard cases) and read under both policies. The properties:

* ``skip``: documents + rejected + blank lines == lines, each line in exactly one of the three;
  the quarantine holds exactly the rejected lines' bytes; a document's text is what a lenient
  parser (the standard library) reads from its line, so nothing is silently altered;
* ``error``: the read completes exactly when ``skip`` rejects nothing, else it raises
  ``BadLineError`` naming the first line ``skip`` rejected, with the same reason;
* no exception other than ``InputError`` ever escapes.
"""

from __future__ import annotations

import base64
import gzip
import json
import tempfile
from pathlib import Path

import orjson
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packcli.errors import InputError
from packcli.read import BadLineError, ReadOptions, ReadStats, RejectSink, iter_batches

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def _valid_line(draw: st.DrawFn) -> bytes:
    doc = draw(
        st.dictionaries(st.sampled_from(["id", "meta", "x", "text"]), _json_value, max_size=3)
    )
    if draw(st.booleans()):
        doc["text"] = draw(st.text(min_size=1, max_size=30))
    return orjson.dumps(doc)


@st.composite
def _mutated_line(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_valid_line()))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=3))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 3))]
        else:
            del data[pos:]
    return bytes(data)


_SPECIAL_LINES = [
    b"",
    b"   ",
    b"\r",
    b"\xef\xbb\xbf" + b'{"text": "bom"}',
    b'{"text": "a", "text": "b"}',
    b'{"text": "a", "x": NaN}',
    b'{"text": -Infinity}',
    b'{"text": "\\ud800"}',
    b'{"text": "\\ud83d\\ude00"}',
    b'{"text": "\xed\xa0\x80"}',
    b'{"text": "\xc0\xaf"}',
    b'{"text": "\xe2\x82',
    b"[" * 5000,
    b'{"text": "a", "n": ' + b"7" * 400 + b"}",
    b'{"text": "a", "n": 1e999, "x": "\\udc00"}',
    b'{"text": ' + b"7" * 400 + b"}",
    b'{"text": ""}',
    b'{"text": 0}',
    b"null",
]

_line = st.one_of(
    _valid_line(),
    _valid_line(),
    _mutated_line(),
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda s: s.encode("utf-8")),
    st.sampled_from(_SPECIAL_LINES),
)


def _write(folder: Path, name: str, data: bytes) -> Path:
    if name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path = folder / name
    path.write_bytes(data)
    return path


def _expected_text(line: bytes) -> str:
    """What a lenient parser reads as the text of an accepted line."""
    doc = json.loads(line.removeprefix(b"\xef\xbb\xbf").decode("utf-8"), parse_int=lambda _: 0)
    return doc["text"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(_line, min_size=1, max_size=12),
    final_newline=st.booleans(),
    suffix=st.sampled_from([".jsonl", ".jsonl.gz", ".jsonl.zst"]),
    batch_size=st.integers(1, 4),
)
def test_every_line_is_accounted_for(
    lines: list[bytes], final_newline: bool, suffix: str, batch_size: int
) -> None:
    lines = [line.replace(b"\n", b" ") for line in lines]  # one generated line = one file line
    raws = [line + b"\n" for line in lines]
    if not final_newline:
        raws[-1] = lines[-1]
    data = b"".join(raws)
    body = data.removeprefix(b"\xef\xbb\xbf")  # what the reader splits into lines
    n_lines = body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _write(folder, f"f{suffix}", data)
        sink_path = folder / "rejected.jsonl"

        stats = ReadStats()
        with RejectSink(sink_path) as sink:
            batches = list(
                iter_batches(
                    [path],
                    options=ReadOptions(batch_size, on_bad_line="skip", rejects=sink),
                    stats=stats,
                )
            )
        records = []
        if sink_path.exists():
            records = [json.loads(r) for r in sink_path.read_bytes().splitlines()]

        doc_lines = [int(x) for b in batches for x in b.position]
        texts = [t for b in batches for t in b.texts]
        reject_lines = [r["line"] for r in records]
        assert stats.documents == len(texts)
        assert [b.doc_id_start for b in batches] == list(range(0, len(texts), batch_size))
        assert sum(stats.rejected.values()) == len(records)
        assert stats.documents + sum(stats.rejected.values()) + stats.blank_lines == n_lines
        assert not set(doc_lines) & set(reject_lines)
        as_read = [raws[0].removeprefix(b"\xef\xbb\xbf"), *raws[1:n_lines]]  # BOM stripped
        blank = [i + 1 for i, raw in enumerate(as_read) if raw.isspace()]
        assert sorted(doc_lines + reject_lines + blank) == list(range(1, n_lines + 1))
        for record in records:
            assert record["file"] == str(path)
            assert base64.b64decode(record["raw_b64"]) == raws[record["line"] - 1]
        for lineno, text in zip(doc_lines, texts, strict=True):
            assert text == _expected_text(lines[lineno - 1])
            assert text.encode("utf-8")  # never a lone surrogate

        try:
            error_docs = sum(
                len(b.texts) for b in iter_batches([path], options=ReadOptions(batch_size))
            )
        except BadLineError as err:
            first = records[0]
            assert (err.file, err.line, err.reason) == (str(path), first["line"], first["reason"])
            assert str(err).startswith(f"{path}:{first['line']}: ")
        except InputError as err:  # pragma: no cover - would be a reader bug
            raise AssertionError(f"untyped InputError: {err}") from err
        else:
            assert records == []
            assert error_docs == len(texts)
