"""The tokenize stage's records in the work folder, as typed values with one writer and one
reader each: the stage record (``tokens/stage.json``), each unit's completion record
(``tokens/files/<key>/_SUCCESS.json``) and the shard index (``tokens/_SUCCESS.json``).

Why here, beside ``shards.py``: ``TokenShards`` reads the index, and the stages (which import
this package) write all three; this module imports nothing of packcli but its errors, so
every reader can import it without a cycle. The nested parts (shard manifests, read counts,
the tokenizer's description) stay JSON objects: their schema belongs to the code that
counts them.

A record of another ``version`` (or of a packcli before versions) is refused with
``OldRecordError``; readers that can redo the work (a unit tokenized again, the index
rebuilt) treat it as not matching, never read it field by field.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from packcli.errors import PackcliError

STAGE = "stage.json"
"""The stage record's file name, in ``tokens/``."""
SUCCESS = "_SUCCESS.json"
"""A unit's completion record (in its folder) and the stage's index (in ``tokens/``)."""


class ShardError(PackcliError):
    """A tokenized shard or the stage's index in the work folder is damaged."""


def damaged(path: Path | str, exc: Exception | str) -> ShardError:
    """The error for a damaged shard or record: it names the file and how to rebuild it."""
    return ShardError(
        f"{path}: damaged tokenized shard or index ({exc}); rerun the same packcli pack or "
        "tokenize command to rebuild it (`packcli verify --no-shards` checks the output "
        "without the work folder)"
    )


class RecordError(ShardError):
    """A record of the tokenize stage with a field missing or of the wrong type."""


class OldRecordError(RecordError):
    """A record written by another version of packcli: its work is redone, not misread."""


R = TypeVar("R", bound="Record")


def _json_types(hint: Any) -> tuple[type, ...]:
    """The JSON value types a field's annotation accepts (``None`` as ``NoneType``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _json_types(arg))
    if hint is Any:
        return (object,)
    return (origin or hint,)


_KINDS: dict[type, dict[str, tuple[type, ...]]] = {}


def _field_kinds(cls: type) -> dict[str, tuple[type, ...]]:
    """Per field of record class ``cls``, the JSON value types it accepts. Kept per class:
    resolving the annotations (strings here) took ~4 ms a record, ~20 ms of a small pack's."""
    kinds = _KINDS.get(cls)
    if kinds is None:
        hints = typing.get_type_hints(cls)
        kinds = _KINDS[cls] = {f.name: _json_types(hints[f.name]) for f in dataclasses.fields(cls)}
    return kinds


def _fits(value: object, accepted: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in accepted:  # JSON true is not a count
        return False
    return isinstance(value, accepted)


@dataclass(frozen=True)
class Record:
    """Shared reader and writer of the work folder's records (the write stage's too): fields
    in declaration order; a field whose metadata says ``omit`` is left out of the file when
    None (as the literal that wrote it did)."""

    VERSION: ClassVar[int] = 1

    def to_json(self) -> dict[str, Any]:
        """The record as written to its file."""
        out: dict[str, Any] = {"version": self.VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit"):
                continue
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: object, path: Path | str) -> Self:
        """The record ``data`` (a parsed JSON file at ``path``); ``RecordError`` naming the file
        and the field when one is missing or of the wrong type, ``OldRecordError`` when the
        record is of another version."""
        if not isinstance(data, dict):
            raise RecordError(f"{path}: not a JSON object; rerun the same packcli command")
        if data.get("version") != cls.VERSION:
            raise OldRecordError(
                f"{path}: record version {data.get('version')!r}, this packcli reads "
                f"{cls.VERSION}; rerun the same packcli pack or tokenize command to redo it"
            )
        kinds = _field_kinds(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING:
                    raise RecordError(f"{path}: field {f.name!r} missing; rerun the same command")
                continue
            accepted = kinds[f.name]
            if not _fits(data[f.name], accepted):
                want = " or ".join("null" if t is type(None) else t.__name__ for t in accepted)
                raise RecordError(
                    f"{path}: field {f.name!r} is {type(data[f.name]).__name__}, not {want}; "
                    "rerun the same command"
                )
            values[f.name] = data[f.name]
        return cls(**values)


def read_record(cls: type[R], path: Path) -> R | None:
    """The record at ``path``; None when it is missing, not JSON, damaged or of another
    version: for readers that then redo what it would vouch for."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return parse_record(cls, data, path)


def parse_record(cls: type[R], data: object, path: Path | str) -> R | None:
    """``cls.from_json``, or None where it would raise (``read_record`` for parsed data)."""
    try:
        return cls.from_json(data, path)
    except RecordError:
        return None


@dataclass(frozen=True)
class StageRecord(Record):
    """``tokens/stage.json``: the stage's settings, tokenizer, input files and units (the same
    bytes from every task of the same run). ``fingerprint`` covers settings and units."""

    fingerprint: str
    settings: dict[str, Any]
    tokenizer: dict[str, Any]
    config: dict[str, Any]  # read, tokenize, chat (and sources) settings, as run
    files: list[dict[str, Any]]
    units: list[dict[str, Any]]
    # A mixture's sources as tokenized (name, text field, BOS/EOS ids), by index.
    sources: list[dict[str, Any]] | None = field(default=None, metadata={"omit": True})

    @staticmethod
    def recognised(data: dict[str, Any]) -> bool:
        """Whether ``data`` is a stage record of any version (a work folder of a packcli
        without work markers is recognised by it)."""
        return "settings" in data and "units" in data


@dataclass(frozen=True)
class UnitRecord(Record):
    """A unit's completion record: its shards and what reading and encoding it counted;
    written last, so its presence marks the unit complete."""

    fingerprint: str
    path: str
    span: list[int] | None
    # The shards' file_index column is this plus the file's place in the unit.
    file_index: int
    num_docs: int
    num_tokens: int
    shards: list[dict[str, Any]]  # the shards' manifests, in order
    read_stats: dict[str, Any]
    chat: dict[str, Any] | None
    special_strings: dict[str, int]
    times: dict[str, float]
    preference: dict[str, Any] | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True)
class ShardIndex(Record):
    """``tokens/_SUCCESS.json``: every shard in input order with its global first document id,
    the units' summed counts; it marks the whole stage complete for ``fingerprint`` (the
    stage record's)."""

    fingerprint: str
    files: list[dict[str, Any]]
    shards: list[dict[str, Any]]
    read_stats: dict[str, Any]
    chat: dict[str, Any] | None
    special_strings: dict[str, int]
    units: list[dict[str, Any]]  # key and first line of each unit, in input order
    # Busy seconds of the tokenize stage's parts, summed over units (when they ran).
    times: dict[str, float]
    tokens: int
    tokenizer: dict[str, Any]
    backend: dict[str, Any]
    # Only for preference outputs, so other indexes (and reports) stay as they were.
    preference: dict[str, Any] | None = field(default=None, metadata={"omit": True})
    # A mixture's sources: each one's doc ids (from ``first_doc``), documents and tokens.
    sources: list[dict[str, Any]] | None = field(default=None, metadata={"omit": True})
