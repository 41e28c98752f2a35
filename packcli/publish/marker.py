"""Reading ``packcli.json``, the marker of a complete output: one reader for every command.

Three strengths, for three kinds of caller:

* ``read_marker``: the typed ``Marker``, for what computes with the contents (verify, stats,
  inspect, export, push through verify). Every field those read is checked, so a damaged,
  truncated or foreign file fails with one line naming it (``VerifyError``) instead of a
  traceback halfway.
* ``load_marker``: the parsed file, unchecked, for callers that check the part they use and
  word their own error (``upload_files``), or read a marker packcli has just written or
  verified (``refresh_card``, ``output_files``).
* ``peek_marker`` (``read_json_object`` for any other record of packcli): never raises;
  ``{}`` when there is no readable JSON object, for questions such as "is this folder a
  packcli output?".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, MARKER, WORK_DIR
from packcli.records import Fields, Record, RecordError
from packcli.stages.write_records import Listing


def load_marker(out: Path) -> Any:
    """``OUT/packcli.json`` parsed, unchecked (any JSON value). Raises ``OSError`` when it is
    missing or unreadable, ``ValueError`` when it is not UTF-8 JSON."""
    return json.loads((out / MARKER).read_text(encoding="utf-8"))


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON record of packcli (this marker, a work folder's records) as a dict, or ``{}``
    when it is missing, unreadable or not a JSON object: for callers to whom such a file
    means "not there"."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return {}
    return data if isinstance(data, dict) else {}


def peek_marker(out: Path) -> dict[str, Any]:
    """``OUT/packcli.json`` as a dict, or ``{}`` when missing, unreadable or not a JSON object."""
    return read_json_object(out / MARKER)


@dataclass(frozen=True)
class PlanShape(Fields):
    """What readers of an output need of its plan settings (``config.plan``)."""

    short_len: int
    long_len: int
    overlong: str


@dataclass(frozen=True)
class ConfigShape(Fields):
    plan: PlanShape


@dataclass(frozen=True)
class TokenizerShape(Fields):
    vocab_size: int


@dataclass(frozen=True)
class RunShape(Fields):
    tokenizer: TokenizerShape


@dataclass(frozen=True)
class InputCounts(Fields):
    """``report.input``: the documents read and their tokens as encoded."""

    documents: int
    tokens: int


@dataclass(frozen=True)
class PolicyCounts(Fields):
    """``report.policy``: what the length policy and the encoders did (and a mixture's
    weights: copies beyond each document's first, what weights below 1 left out)."""

    split_docs: int
    split_pieces: int
    split_tokens: int
    truncated_docs: int
    truncated_tokens: int
    dropped_docs: int
    dropped_tokens: int
    empty_docs: int
    repeat_tokens: int = 0
    subsampled_tokens: int = 0


@dataclass(frozen=True)
class TierCounts(Fields):
    """``report.tiers.<config>``: what a config's rows hold (the card's byte counts too)."""

    rows: int
    tokens: int
    segments: int


@dataclass(frozen=True)
class TierSummary(TierCounts):
    """A config's line of the card's table."""

    capacity: int
    efficiency: float
    rows_over_bound: float


@dataclass(frozen=True)
class Tiers(Fields):
    long: TierCounts
    short: TierCounts

    def of(self, config: str) -> TierCounts:
        return self.long if config == "long" else self.short


@dataclass(frozen=True)
class ReportShape(Fields):
    input: InputCounts
    policy: PolicyCounts
    tiers: Tiers


@dataclass(frozen=True)
class MarkerFiles(Fields):
    """Each config's output files (``data/<config>/``), in order."""

    long: list[Listing]
    short: list[Listing]

    def of(self, config: str) -> list[Listing]:
        return self.long if config == "long" else self.short


@dataclass(frozen=True)
class MarkerPart(Fields):
    """A planned part: its token shards (none for the tail) and the range of each config's
    files it wrote, so ``verify`` checks each part's files against its own shards."""

    name: str
    shards: list[int]
    files: dict[str, tuple[int, int]]
    # A grouped mixture's part: its documents as [shard, first row, end row] runs (parts
    # share shards); absent: its shards whole.
    slices: list[tuple[int, int, int]] | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True)
class Marker(Record):
    """``packcli.json``: the resolved config, the run (tokenizer, inputs, fingerprints), the
    report, the files and the plan's parts. No version field: its bytes are the output's
    (``run.packcli_version`` says which packcli wrote it). ``config``, ``run`` and ``report``
    stay JSON objects (the card and the figures read all of them); what every reader needs
    of them is checked by ``ConfigShape``, ``RunShape`` and ``ReportShape``."""

    VERSION: ClassVar[int | None] = None

    config: dict[str, Any]
    run: dict[str, Any]
    report: dict[str, Any]
    files: MarkerFiles
    # An output of a packcli before parts has none: one part of every file and shard.
    parts: list[MarkerPart] | None = field(default=None, metadata={"omit": True})

    @classmethod
    def from_json(cls, data: object, path: Path | str, prefix: str = "") -> Self:
        """``Record.from_json``, and the fields readers compute with checked inside
        ``config``, ``run`` and ``report``, and every file a bare name of its folder."""
        marker = super().from_json(data, path, prefix)
        for shape, name in ((ConfigShape, "config"), (RunShape, "run"), (ReportShape, "report")):
            shape.from_json(getattr(marker, name), path, prefix=f"{name}.")
        for config in CONFIG_NAMES:
            for entry in marker.files.of(config):
                if Path(entry.file).name != entry.file or entry.file in ("", ".", ".."):
                    raise RecordError(
                        f"{path}: files.{config} names {entry.file!r}, not a file of data/{config}/"
                    )
        return marker

    def plan_shape(self) -> PlanShape:
        return ConfigShape.from_json(self.config, MARKER, prefix="config.").plan

    def report_shape(self) -> ReportShape:
        return ReportShape.from_json(self.report, MARKER, prefix="report.")


def read_marker(out: Path) -> Marker:
    """``packcli.json`` of ``out``, every field verify reads checked, so a damaged, truncated
    or foreign file fails with one line naming it, not with a traceback."""
    marker = out / MARKER
    if not marker.is_file():
        raise VerifyError(f"{out}: no packcli.json, so the output is missing or incomplete")
    fix = "rewrite it with `packcli finalize -o OUT` (needs the work folder) or rerun packcli pack"
    try:
        meta = load_marker(out)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise VerifyError(f"{marker}: unreadable or not JSON ({exc}); {fix}") from exc
    try:
        return Marker.from_json(meta, marker)
    except RecordError as exc:
        reason = str(exc).removeprefix(f"{marker}: ").split("; rerun")[0]
        bad = f"{marker}: damaged or not written by packcli ({reason})"
        raise VerifyError(f"{bad}; {fix}") from None


def work_folder(out: Path, marker: Marker) -> Path:
    """The local work folder a marker records: ``run.work_dir`` (relative to ``out`` unless
    absolute), else the default inside ``out``."""
    recorded = Path(recorded_work_dir(marker))
    return recorded if recorded.is_absolute() else out / recorded


def recorded_work_dir(marker: Marker) -> str:
    """``run.work_dir`` as the marker records it (a path or a URL), else the default."""
    return str(marker.run.get("work_dir") or WORK_DIR)
