"""Units of work of the tokenize stage: whole input files, groups of small files, byte spans
of large uncompressed files, row-group ranges of Parquet/Arrow files.

A unit's key names its folder of shards and its fingerprint covers everything its shards
depend on, so tasks split the units between them and resume skips the finished ones.
``read_unit`` streams one unit's documents (through ``packcli.read``), with the record
validator of the run's format."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packcli.config import RunConfig
from packcli.fs import as_input, input_entry
from packcli.read import (
    DocBatch,
    ReadOptions,
    ReadStats,
    RejectSink,
    file_format,
    iter_batches,
    split_spans,
    splittable,
    suffix_format,
)
from packcli.stages.work import fingerprint

log = logging.getLogger(__name__)


def _file_key(path: str) -> str:
    # surrogateescape: a name that is not valid UTF-8 (os.fsdecode's escapes) still has a
    # key; resolve_inputs refuses such names, a library caller may not.
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]


# Files smaller than this share a unit of tokenize work with their neighbours: a unit has a
# fixed cost (a folder, a shard, three records with an fsync each, two threads), which made
# 2,000 one-line files take 30 s. Groups end where a file's path says so (below), so adding
# or removing a file regroups only its own neighbourhood, and at GROUP_CAP bytes.
GROUP_BYTES = 8 << 20
GROUP_CAP = 4 * GROUP_BYTES


def _starts_group(path: str, size: int) -> bool:
    """Whether a small file begins a new group: with probability size / GROUP_BYTES (so
    groups average about GROUP_BYTES), decided by the file alone, as content-defined
    chunking does, so one file more or less moves no boundary elsewhere."""
    draw = int.from_bytes(
        hashlib.sha256(path.encode("utf-8", "surrogateescape")).digest()[:8], "big"
    )
    return draw * GROUP_BYTES < size * 2**64


def _group_unit(members: list[tuple[int, dict[str, Any]]], stage_fp: str) -> dict[str, Any]:
    """One unit of several whole small files (``paths``); its documents carry each file's
    own index and line numbers, so the output is the same as one unit per file."""
    paths = [entry["path"] for _, entry in members]
    unit: dict[str, Any] = {
        "file_index": members[0][0],
        "path": paths[0],
        "paths": paths,
        "span": None,
        "size": sum(entry["size"] for _, entry in members),
        "key": _file_key("\n".join(paths)),
    }
    files = [entry for _, entry in members]
    if "format" in files[0]:  # every member has the same format
        unit["format"] = files[0]["format"]
    unit["fingerprint"] = fingerprint({"stage": stage_fp, "files": files, "key": unit["key"]})
    return unit


def unit_paths(unit: dict[str, Any]) -> list[str]:
    return unit.get("paths") or [unit["path"]]


def input_units(
    paths: list[Path | str], split_bytes: int, stage_fp: str, input_format: str = "auto"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input files, and the units of tokenize work: each file, each byte span of an
    uncompressed file larger than ``split_bytes`` (so one huge file still spreads over
    tasks), each range of row groups of such a Parquet/Arrow file, or a group of
    consecutive small files of one format. Units are in input order; document ids and line
    numbers are assigned from their counts later, so how files are split or grouped never
    changes the output. A jsonl file's records are as they always were (so its shards are
    reused across versions); others add their ``format``."""
    files: list[dict[str, Any]] = []
    units: list[dict[str, Any]] = []
    group: list[tuple[int, dict[str, Any]]] = []
    group_bytes = 0

    def close_group() -> None:
        nonlocal group_bytes
        if len(group) > 1:
            units.append(_group_unit(group, stage_fp))
        elif group:
            units.extend(_file_units(*group[0], None, stage_fp))
        group.clear()
        group_bytes = 0

    for index, p in enumerate(paths):
        fmt = file_format(p, input_format) or "jsonl"
        path = str(_identity(p))
        # Local: size + mtime_ns; a URL: size + the store's version fields (packcli/fs/).
        entry: dict[str, Any] = {"path": path, **input_entry(p)}
        size = entry["size"]
        if fmt != "jsonl":
            entry["format"] = fmt
        files.append(entry)
        spans: list[Any] | None  # jsonl: byte spans; else ((first, end) group, bytes) pieces
        if fmt == "jsonl":
            spans = split_spans(size, split_bytes) if splittable(p) else None
        else:
            from packcli.read.columnar import split_groups

            spans = split_groups(p, fmt, size, split_bytes)
        if spans is None and size < GROUP_BYTES:
            if group and (
                _starts_group(path, size)
                or group_bytes + size > GROUP_CAP
                or group[0][1].get("format") != entry.get("format")
            ):
                close_group()
            group.append((index, entry))
            group_bytes += size
            continue
        close_group()
        units.extend(_file_units(index, entry, spans, stage_fp))
    close_group()
    return files, units


def source_units(
    paths: list[Path | str],
    path_sources: list[int],
    sources: tuple[dict[str, Any], ...],
    split_bytes: int,
    stage_fp: str,
    input_format: str = "auto",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A mixture's files and units: ``input_units`` of each source's files (so no unit of
    small files spans two sources), source after source, each unit naming its ``source``;
    its fingerprint covers what its source changes in its shards (text field, BOS, EOS)."""
    files: list[dict[str, Any]] = []
    units: list[dict[str, Any]] = []
    for k, settings in enumerate(sources):
        mine = [p for p, s in zip(paths, path_sources, strict=True) if s == k]
        f, u = input_units(mine, split_bytes, stage_fp, input_format)
        for unit in u:
            unit["file_index"] += len(files)
            unit["source"] = k
            own = {key: settings[key] for key in ("text_field", "bos", "eos")}
            unit["fingerprint"] = fingerprint({"unit": unit["fingerprint"], "source": own})
        files += f
        units += u
    return files, units


def _identity(p: Path | str) -> Path | str:
    """The path recorded for an input: resolved (one file, one identity), unless resolving
    loses what its name says it is: a content-addressed store (the Hugging Face cache's
    ``blobs/<sha256>``, which a Hub dataset's files link to) keeps the link's name. A URL
    is recorded as listed (no credentials: they live in the filesystem instance)."""
    if isinstance(p, str):
        return p
    resolved = p.resolve()
    return resolved if suffix_format(resolved) == suffix_format(p) else Path(os.path.abspath(p))


def _file_units(
    index: int, entry: dict[str, Any], spans: list[Any] | None, stage_fp: str
) -> list[dict[str, Any]]:
    """The units of one file: the whole file, each of its byte spans (jsonl) or each of
    its row-group ranges (Parquet/Arrow: ``((start, stop), bytes)``)."""
    units = []
    path = entry["path"]
    if "format" in entry:
        for groups, nbytes in spans or [(None, entry["size"])]:
            unit: dict[str, Any] = {
                "file_index": index,
                "path": path,
                "span": None,
                "format": entry["format"],
                "row_groups": list(groups) if groups else None,
                "size": nbytes,
                "key": _file_key(path if groups is None else f"{path}#rg{groups[0]}-{groups[1]}"),
            }
            keyed = {k: v for k, v in unit.items() if k != "file_index"}
            unit["fingerprint"] = fingerprint({"stage": stage_fp, **entry, **keyed})
            units.append(unit)
        return units
    for span in spans or [None]:
        unit = {
            "file_index": index,
            "path": path,
            "span": list(span) if span else None,
            "size": span[1] - span[0] if span else entry["size"],
            "key": _file_key(path if span is None else f"{path}#{span[0]}-{span[1]}"),
        }
        # Not the file's index: adding a file to the input must not redo the others.
        keyed = {k: v for k, v in unit.items() if k != "file_index"}
        unit["fingerprint"] = fingerprint({"stage": stage_fp, **entry, **keyed})
        units.append(unit)
    return units


def unit_span(unit: dict[str, Any]) -> tuple[int, int] | None:
    return tuple(unit["span"]) if unit["span"] else None


def input_column(cfg: RunConfig, unit: dict[str, Any] | None = None) -> tuple[str, str]:
    """The field (Parquet/Arrow: column) documents are read from, and its option; a
    mixture's unit reads its source's."""
    if cfg.chat.uses_template:
        return cfg.chat.messages_field, "--messages-field"
    if unit is not None and "source" in unit and cfg.sources:
        return cfg.source_settings(unit["source"])["text_field"], "text_field"
    return cfg.read.text_field, "--text-field"


def read_unit(
    cfg: RunConfig,
    unit: dict[str, Any],
    batch_size: int,
    stats: ReadStats,
    rejects: RejectSink | None = None,
    *,
    sample: bool = False,
) -> Iterator[DocBatch]:
    """The documents of one unit of tokenize work, by its format. ``sample``: a quick look
    at the first documents (a compressed jsonl stream is not verified first)."""
    paths = [as_input(p) for p in unit_paths(unit)]
    fmt = unit.get("format", "jsonl")
    options = ReadOptions(
        batch_size=batch_size,
        batch_bytes=0 if sample else cfg.read.batch_bytes,
        on_bad_line=cfg.read.on_bad_line,
        rejects=rejects,
        validate=record_validator(cfg),  # chat: the sample is rendered dialogues
    )
    column, option = input_column(cfg, unit)
    if fmt == "jsonl":
        span = unit_span(unit)
        return iter_batches(paths, column, options, stats, span=span, verify_streams=not sample)
    from packcli.read.columnar import iter_columnar

    groups = unit.get("row_groups")
    groups = tuple(groups) if groups else None
    return iter_columnar(paths, fmt, column, options, stats, groups=groups, option=option)


def record_validator(cfg: RunConfig) -> Any:
    """What ``iter_batches`` checks each line with: the text field (None) or, for chat, the
    messages (the chat module loads only then)."""
    if cfg.chat.is_preference:
        from packcli.chat.validate import validate_pair

        return validate_pair
    if not cfg.chat.uses_template:
        return None
    from packcli.chat import validate_messages

    return functools.partial(validate_messages, field=cfg.chat.messages_field)
