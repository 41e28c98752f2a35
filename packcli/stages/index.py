"""The tokenize stage's index: checks that every unit is tokenized and numbers the documents
globally, in input order (``tokens/_SUCCESS.json``), with the summed read statistics."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.atomic import atomic_write_json, atomic_writer
from packcli.config import RunConfig
from packcli.errors import PackcliError
from packcli.names import TOKENS_DIR
from packcli.read import shift_reject_lines
from packcli.records import OldRecordError, RecordError, read_record
from packcli.stages.units import unit_paths
from packcli.stages.work import REJECTED, uncomplete
from packcli.stages.workstore import work_store
from packcli.tokenize.encode import StageTimes
from packcli.tokenize.records import (
    BACKEND,
    STAGE,
    SUCCESS,
    BackendChoice,
    IndexedShard,
    ShardIndex,
    SourceCount,
    StageRecord,
    UnitRecord,
)
from packcli.tokenize.shards import TokenShards

log = logging.getLogger(__name__)


@dataclass
class _Totals:
    """The units' read and encode counts, summed into the index."""

    read: dict[str, int] = field(
        default_factory=lambda: {"documents": 0, "blank_lines": 0, "bytes_read": 0}
    )
    rejected: dict[str, int] = field(default_factory=dict)
    corrupt_streams: list[dict[str, Any]] = field(default_factory=list)
    chat: dict[str, int] | None = None
    preference: dict[str, int] | None = None
    specials: Counter[str] = field(default_factory=Counter)
    times: StageTimes = field(default_factory=StageTimes)

    def add(self, done: UnitRecord) -> None:
        """Add one unit's completion record."""
        for key in self.read:
            self.read[key] += done.read_stats[key]
        for reason, n in done.read_stats.get("rejected", {}).items():
            self.rejected[reason] = self.rejected.get(reason, 0) + n
        self.corrupt_streams += done.read_stats.get("corrupt_streams", [])
        if done.chat is not None:
            self.chat = {k: (self.chat or {}).get(k, 0) + v for k, v in done.chat.items()}
        if done.preference is not None:
            self.preference = {
                k: (self.preference or {}).get(k, 0) + v for k, v in done.preference.items()
            }
        self.specials.update(done.special_strings)
        self.times.add(done.times)


def index_tokens(cfg: RunConfig) -> TokenShards:
    """Check that every input file is tokenized and write the global shard index."""
    folder = cfg.work_path / TOKENS_DIR
    store = work_store(cfg)
    store.pull_records(TOKENS_DIR)
    stage = _stage_record(folder / STAGE, store.shown(TOKENS_DIR))
    index_path = folder / SUCCESS
    index = read_record(ShardIndex, index_path)
    if index is not None and index.fingerprint == stage.fingerprint:
        return TokenShards(folder, store)
    shards: list[IndexedShard] = []
    missing = []
    totals = _Totals()
    next_doc = 0
    lines_before = [0] * len(stage.files)  # per file: lines of its units read so far
    units = []
    n_sources = len(stage.sources or [])
    source_docs = [[None, 0, 0] for _ in range(n_sources)]  # first doc, docs, tokens
    for unit in stage.units:
        done = read_record(UnitRecord, folder / "files" / unit["key"] / SUCCESS)
        if done is None or done.fingerprint != unit["fingerprint"]:
            missing.append(_unit_name(unit))
            continue
        first_line = lines_before[unit["file_index"]]
        lines_before[unit["file_index"]] += done.read_stats["lines"]
        units.append({"key": unit["key"], "first_line": first_line})
        for m in done.shards:
            manifest = {**dataclasses.asdict(m), "file": f"files/{unit['key']}/{m.file}"}
            entry = IndexedShard(
                **manifest,
                first_doc_id=next_doc + m.first_doc_index,
                first_line=first_line,  # the shard's line column counts from its unit
                file_index=unit["file_index"],  # in this run's input list
                # The unit's first file index when tokenized (the column's base).
                tokenized_file_index=done.file_index,
                source=unit.get("source"),
            )
            shards.append(entry)
        if "source" in unit:
            own = source_docs[unit["source"]]
            own[0] = next_doc if own[0] is None else own[0]
            own[1] += done.num_docs
            own[2] += done.num_tokens
        next_doc += done.num_docs
        totals.add(done)
    if missing:
        raise PackcliError(
            f"tokenize task(s) not finished: {len(missing)} of {len(stage.units)} input "
            f"unit(s) have no complete shards, e.g. {missing[0]}"
        )
    uncomplete(cfg)  # the index a finished output was checked against changes
    record = ShardIndex(
        fingerprint=stage.fingerprint,
        files=stage.files,
        shards=shards,
        read_stats={
            "files": len(stage.files),
            **totals.read,
            "rejected": dict(sorted(totals.rejected.items())),
            "corrupt_streams": totals.corrupt_streams,
        },
        chat=totals.chat,
        preference=totals.preference,
        special_strings=dict(sorted(totals.specials.items())),
        units=units,
        times={k: round(v, 3) for k, v in dataclasses.asdict(totals.times).items()},
        tokens=sum(m.num_tokens for m in shards),
        tokenizer=stage.tokenizer,
        backend=_backend(folder / BACKEND).to_json(),
        sources=_sources_index(stage, source_docs, next_doc),
    )
    atomic_write_json(index_path, record.to_json())
    store.push(f"{TOKENS_DIR}/{SUCCESS}")
    return TokenShards(folder, store)


def _stage_record(path: Path, shown: str) -> StageRecord:
    """The stage record the index is built from: an error saying to run the tokenize stage
    when there is none or it is of another version; one naming the field when damaged."""
    if not path.is_file():
        raise PackcliError(f"no tokenize stage in {shown}: run `packcli tokenize` first")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        raise PackcliError(f"no tokenize stage in {shown}: run `packcli tokenize` first") from None
    try:
        return StageRecord.from_json(data, path)
    except OldRecordError as exc:
        raise PackcliError(f"{exc} (run `packcli tokenize` first)") from None


def _backend(path: Path) -> BackendChoice:
    """The backend the tokenize stage chose, for the index: an error naming the file when it
    is missing or damaged (the tokenize stage then chooses again)."""
    try:
        return BackendChoice.from_json(json.loads(path.read_bytes()), path)
    except (OSError, ValueError, RecordError) as exc:
        reason = str(exc).removeprefix(f"{path}: ").split("; rerun")[0]
        raise PackcliError(
            f"{path}: the tokenizer backend's record is missing or damaged ({reason}); rerun "
            "the same packcli pack or tokenize command to choose it again"
        ) from None


def _sources_index(
    stage: StageRecord, source_docs: list[list[Any]], n_docs: int
) -> list[SourceCount] | None:
    """A mixture's sources in the index: each one's doc ids (consecutive, from
    ``first_doc``), documents and tokens; None without sources."""
    if not stage.sources:
        return None
    out = []
    for k, (src, (first, docs, tokens)) in enumerate(zip(stage.sources, source_docs, strict=True)):
        if first is None:  # a source with no documents starts where the next one does
            later = [d[0] for d in source_docs[k + 1 :] if d[0] is not None]
            first = later[0] if later else n_docs
        count = SourceCount(
            **dataclasses.asdict(src), first_doc=first, documents=docs, tokens=tokens
        )
        out.append(count)
    return out


def _unit_name(unit: dict[str, Any]) -> str:
    """A unit as an error names it: its first file, and its span, row groups or group size."""
    more = len(unit_paths(unit)) - 1
    where = f" bytes {unit['span']}" if unit["span"] else ""
    if unit.get("row_groups"):
        where = f" row groups {unit['row_groups']}"
    first: str = unit["path"]
    return first + where + (f" and {more} more file(s)" if more else "")


def gather_rejects(cfg: RunConfig, out: Path, shards: TokenShards) -> None:
    """``OUT/rejected.jsonl``: every quarantined line of every input file, in input order
    (written atomically; removed when nothing was rejected). A unit that is a byte span of a
    file numbered its lines from the span; they become the file's own line numbers here.
    Finalize writes it, and the plan stage when nothing is left to pack."""
    target = out / REJECTED
    parts = [
        (cfg.work_path / TOKENS_DIR / "files" / unit["key"] / REJECTED, unit["first_line"])
        for unit in shards.success.units
    ]
    parts = [(p, first_line) for p, first_line in parts if p.is_file()]
    if not parts:
        target.unlink(missing_ok=True)
        return
    with atomic_writer(target) as sink:
        for part, first_line in parts:
            with open(part, "rb") as fh:
                if first_line:
                    shift_reject_lines(fh, sink, first_line)
                else:
                    shutil.copyfileobj(fh, sink)
