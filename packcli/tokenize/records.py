"""The tokenize stage's records in the work folder, as typed values with one writer and one
reader each: the stage record (``tokens/stage.json``), the backend chosen
(``tokens/backend.json``), each unit's fingerprint stamp, shard manifests and completion record
(``tokens/files/<key>/fingerprint.json``, ``shard-NNNNN.json``, ``_SUCCESS.json``) and the
shard index (``tokens/_SUCCESS.json``).

Why here, beside ``shards.py``: ``TokenShards`` reads the index, and the stages (which import
this package) write all three; this module imports nothing of packcli but its errors and the
records' base (``packcli.records``), so every reader can import it without a cycle. The
shards' manifests nested in the unit record and the index are typed (``ShardManifest``, and
``IndexedShard`` for the index's, which adds where the shard is in the run); the other nested
parts (read counts, the tokenizer's description) stay JSON objects: their schema belongs to
the code that counts them. A record of another version is redone
(a unit tokenized again, the index rebuilt), never read field by field; the records without a
version field (``VERSION = None``: their bytes are those every packcli wrote) are redone when
they do not read as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from packcli.errors import PackcliError
from packcli.records import Fields, Record

STAGE = "stage.json"
"""The stage record's file name, in ``tokens/``."""
SUCCESS = "_SUCCESS.json"
"""A unit's completion record (in its folder) and the stage's index (in ``tokens/``)."""
BACKEND = "backend.json"
"""The tokenizer backend chosen (``BackendChoice``), in ``tokens/``."""
UNIT_STAMP = "fingerprint.json"
"""In a unit's folder, from its first shard on: the fingerprint its shards are for."""


class ShardError(PackcliError):
    """A tokenized shard or the stage's index in the work folder is damaged."""


def damaged(path: Path | str, exc: Exception | str) -> ShardError:
    """The error for a damaged shard or record: it names the file and how to rebuild it."""
    return ShardError(
        f"{path}: damaged tokenized shard or index ({exc}); rerun the same packcli pack or "
        "tokenize command to rebuild it (`packcli verify --no-shards` checks the output "
        "without the work folder)"
    )


@dataclass(frozen=True)
class SourceSpec(Fields):
    """A mixture's source as tokenized: its name, text field and BOS/EOS ids."""

    name: str
    text_field: str
    bos: int | None
    eos: int | None


@dataclass(frozen=True)
class SourceCount(SourceSpec):
    """A mixture's source in the index: its doc ids (consecutive from ``first_doc``),
    documents and tokens."""

    first_doc: int
    documents: int
    tokens: int


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
    # A mixture's sources as tokenized, by index.
    sources: list[SourceSpec] | None = field(default=None, metadata={"omit": True})

    @staticmethod
    def recognised(data: dict[str, Any]) -> bool:
        """Whether ``data`` is a stage record of any version (a work folder of a packcli
        without work markers is recognised by it)."""
        return "settings" in data and "units" in data


@dataclass(frozen=True)
class BackendChoice(Record):
    """``tokens/backend.json``: the backend asked for, the one used and why (a fast one after
    it reproduced HF's ids on a sample: ``check``, its ``version``); the index and
    ``packcli.json`` carry it as the run's ``tokenizer_backend``. Damaged: chosen again."""

    VERSION: ClassVar[int | None] = None

    requested: str
    backend: str
    fallback_reason: str | None
    version: str | None = field(default=None, metadata={"omit": True})
    check: dict[str, Any] | None = field(default=None, metadata={"omit": True})
    passed_over: dict[str, str] | None = field(default=None, metadata={"omit": True})
    chat_offsets: dict[str, Any] | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True)
class UnitStamp(Record):
    """A unit folder's ``fingerprint.json``: the fingerprint its shards (finished or not)
    are for, so a killed unit resumes only its own shards. Damaged: the unit starts over."""

    VERSION: ClassVar[int | None] = None

    fingerprint: str


@dataclass(frozen=True)
class ShardManifest(Record):
    """A shard's ``shard-NNNNN.json``, written after the shard: its documents (their
    ``doc_index`` range in the unit), tokens, size and sha256. A shard whose manifest does
    not read as one is not complete: it is written again."""

    VERSION: ClassVar[int | None] = None

    file: str
    num_docs: int
    num_tokens: int
    first_doc_index: int
    last_doc_index: int
    sha256: str
    bytes: int


@dataclass(frozen=True)
class IndexedShard(ShardManifest):
    """A shard as the index lists it: its manifest (``file`` relative to ``tokens/``:
    ``files/<key>/<file>``) and where it is in the run: its first global document id, the
    line its unit starts at in its input file (the shard's ``line`` column counts from it),
    its unit's file index in this run's inputs and when tokenized (the ``file_index``
    column's base; files may have been added since), and a mixture's source."""

    first_doc_id: int
    first_line: int
    file_index: int
    tokenized_file_index: int
    source: int | None = field(default=None, metadata={"omit": True})


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
    shards: list[ShardManifest]  # in order
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
    shards: list[IndexedShard]
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
    # A mixture's sources, counted.
    sources: list[SourceCount] | None = field(default=None, metadata={"omit": True})
