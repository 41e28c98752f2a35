"""The one reader and writer of packcli's JSON records: a record is a frozen dataclass whose
fields are its schema, written by ``to_json`` and read back by ``from_json``, which names the
file and the field when one is missing or of the wrong type.

Why one module of its own: every stage writes records (tokenize, plan, write, finalize,
export), so the base must import nothing of theirs; this module imports only packcli's
errors. Nested parts of a record that have a schema of their own are ``Fields`` (no version:
their record has one); a field typed ``Fields``, or a list, tuple or dict of them, is read
and written through it.

A record of another ``version`` (or of a packcli before versions) is refused with
``OldRecordError``; readers that can redo the work treat it as not there (``read_record``),
never read it field by field. A record whose bytes are a contract (``packcli.json``, an
export's marker) has ``VERSION = None``: no version field, and its readers decide staleness by
the fingerprint it holds.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from packcli.errors import PackcliError


class RecordError(PackcliError):
    """A record with a field missing or of the wrong type."""


class OldRecordError(RecordError):
    """A record written by another version of packcli: its work is redone, not misread."""


F = TypeVar("F", bound="Fields")


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, Fields):
        return "object"
    return getattr(origin or hint, "__name__", str(hint))


class _Mismatch(Exception):
    """A value that does not fit its field (``where``: the field, dotted into nested parts)."""

    def __init__(self, where: str, value: object, hint: Any) -> None:
        super().__init__(where)
        self.where, self.value, self.hint = where, value, hint


def _parse(hint: Any, value: object, where: str, path: Path | str) -> Any:
    """``value`` read as ``hint`` says: nested ``Fields`` built, lists made tuples where the
    field is a tuple, a number checked to be one (JSON ``true`` is not a count)."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _parse(arg, value, where, path)
            except _Mismatch:
                continue
        raise _Mismatch(where, value, hint)
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch(where, value, hint)
    if isinstance(hint, type) and issubclass(hint, Fields):
        if not isinstance(value, dict):
            raise _Mismatch(where, value, hint)
        return hint.from_json(value, path, prefix=f"{where}.")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise _Mismatch(where, value, hint)
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length
            if len(value) != len(args):
                raise _Mismatch(where, value, hint)
            items = [
                _parse(a, v, f"{where}[{i}]", path)
                for i, (a, v) in enumerate(zip(args, value, strict=True))
            ]
        else:
            item = args[0] if args else Any
            items = [_parse(item, v, f"{where}[{i}]", path) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch(where, value, hint)
        item = args[1] if args else Any
        return {k: _parse(item, v, f"{where}.{k}", path) for k, v in value.items()}
    kind = origin or hint
    if isinstance(value, bool) and kind is not bool:
        raise _Mismatch(where, value, hint)
    if kind is float and isinstance(value, int):  # JSON writes 2.0 and 2 alike for some
        return value
    if not isinstance(value, kind):
        raise _Mismatch(where, value, hint)
    return value


def _dumped(value: object) -> object:
    """``value`` as JSON holds it: nested ``Fields`` as objects, tuples as lists."""
    if isinstance(value, Fields):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_dumped(v) for v in value]
    if isinstance(value, dict):
        return {k: _dumped(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved field annotations, kept per class: resolving them (strings under
    ``from __future__ import annotations``) took ~4 ms a record, ~20 ms of a small pack's."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


@dataclass(frozen=True)
class Fields:
    """A typed JSON object: fields in declaration order; a field whose metadata says ``omit``
    is left out of the file when None (as the literal that wrote it did)."""

    def to_json(self) -> dict[str, Any]:
        """The object as written to its file."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit"):
                continue
            out[f.name] = _dumped(value)
        return out

    @classmethod
    def from_json(cls, data: object, path: Path | str, prefix: str = "") -> Self:
        """The object ``data`` (parsed JSON of the file at ``path``; ``prefix``: where in it,
        for a nested part); ``RecordError`` naming the file and the field when one is missing
        or of the wrong type. Keys it has no field for are ignored."""
        if not isinstance(data, dict):
            where = f" field {prefix.rstrip('.')!r}" if prefix else ""
            raise RecordError(f"{path}:{where} not a JSON object; rerun the same packcli command")
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if not f.init:  # derived from the others when built
                continue
            name = f"{prefix}{f.name}"
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{path}: field {name!r} missing; rerun the same command")
                continue
            try:
                values[f.name] = _parse(hints[f.name], data[f.name], name, path)
            except _Mismatch as bad:
                raise RecordError(
                    f"{path}: field {bad.where!r} is {type(bad.value).__name__}, not "
                    f"{_type_name(bad.hint)}; rerun the same command"
                ) from None
        return cls(**values)


@dataclass(frozen=True)
class Record(Fields):
    """A record file: ``Fields`` with a ``version`` (``VERSION``; None for a file whose bytes
    are a contract and carry none)."""

    VERSION: ClassVar[int | None] = 1

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return out if self.VERSION is None else {"version": self.VERSION, **out}

    @classmethod
    def from_json(cls, data: object, path: Path | str, prefix: str = "") -> Self:
        """``Fields.from_json``, and ``OldRecordError`` when the record is of another
        version."""
        if not isinstance(data, dict):
            raise RecordError(f"{path}: not a JSON object; rerun the same packcli command")
        if cls.VERSION is not None and data.get("version") != cls.VERSION:
            raise OldRecordError(
                f"{path}: record version {data.get('version')!r}, this packcli reads "
                f"{cls.VERSION}; rerun the same packcli command to redo it"
            )
        return super().from_json(data, path, prefix)


def read_record(cls: type[F], path: Path) -> F | None:
    """The record at ``path``; None when it is missing, not JSON, damaged or of another
    version: for readers that then redo what it would vouch for."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return parse_record(cls, data, path)


def parse_record(cls: type[F], data: object, path: Path | str) -> F | None:
    """``cls.from_json``, or None where it would raise (``read_record`` for parsed data)."""
    try:
        return cls.from_json(data, path)
    except RecordError:
        return None
