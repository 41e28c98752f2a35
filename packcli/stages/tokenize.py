"""The tokenize stage: each task tokenizes its share of the units into shards, resuming after
the shards an interrupted run completed; ``index.index_tokens`` then numbers them globally."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa

from packcli.arrow_np import to_numpy
from packcli.atomic import atomic_write_json
from packcli.chat.batches import SpanReading, tokenize_chat_batches, tokenize_chat_spans
from packcli.chat.encoder import ChatEncoder, ChatStats, TemplateEncoder
from packcli.config import RunConfig
from packcli.errors import InputError
from packcli.faults import crash_point
from packcli.fs import is_url
from packcli.names import TOKENS_DIR
from packcli.read import DocBatch, ReadStats, RejectSink, count_newlines
from packcli.read.formats import splittable
from packcli.read.spans import line_spans
from packcli.records import read_record
from packcli.stages.prepare import Prepared, Tokenizing, choose_backend, prepare_tokenize
from packcli.stages.progress import Bar, progress_bar
from packcli.stages.tasks import assign_by_size
from packcli.stages.units import (
    input_units,
    read_unit,
    source_units,
    unit_paths,
    unit_span,
)
from packcli.stages.work import (
    REJECTED,
    claim_output,
    fingerprint,
    recorded_read,
    require_out,
    uncomplete,
)
from packcli.stages.workstore import LocalWork, in_mirror, work_store
from packcli.tokenize.encode import StageTimes, prefetch, tokenize_batches
from packcli.tokenize.records import (
    BACKEND,
    STAGE,
    SUCCESS,
    UNIT_STAMP,
    BackendChoice,
    ShardIndex,
    ShardManifest,
    SourceSpec,
    StageRecord,
    UnitRecord,
    UnitStamp,
)
from packcli.tokenize.shards import (
    CHAT_SHARD_SCHEMA,
    PREFERENCE_SHARD_SCHEMA,
    SHARD_SCHEMA,
    ShardWriter,
    manifest_name,
    shard_intact,
)
from packcli.tokenize.tokenizer import SpecialStringCounter

if TYPE_CHECKING:
    from packcli.chat.preference import PreferenceStats
    from packcli.chat.render_pool import RenderPool, SpanRead
    from packcli.stages.prepare import UnitEncoder

log = logging.getLogger(__name__)


def _indexed_units(folder: Path, store: LocalWork) -> set[str]:
    """Keys of the units whose shards the stage's index lists (all units when it is damaged:
    then assume a finished output depends on every one)."""
    index = read_record(ShardIndex, folder / SUCCESS)
    if index is None:
        return store.unit_keys() if (folder / SUCCESS).exists() else set()
    try:
        return {m.file.split("/")[1] for m in index.shards}
    except IndexError:  # a file not under files/<key>/
        return store.unit_keys()


@in_mirror
def tokenize_task(
    cfg: RunConfig,
    *,
    task_index: int = 0,
    num_tasks: int = 1,
    quiet: bool = False,
    prepared: Prepared | None = None,
) -> bool:
    """Tokenize this task's share of the input files; returns True if all were reused.

    Every task writes the same ``stage.json`` (same inputs and settings give the same bytes),
    so tasks need no coordination; the plan stage checks that every file is complete.
    ``prepared``: the stage already resolved in this process (``pack`` validates first).
    """
    require_out(cfg)
    prepared = prepared or prepare_tokenize(cfg)
    tok = prepared.tok
    stage_fp = fingerprint(tok.settings)
    if prepared.path_sources is not None:
        files, units = source_units(
            prepared.paths,
            prepared.path_sources,
            tok.sources,
            cfg.read.split_bytes,
            stage_fp,
            cfg.read.input_format,
        )
    else:
        files, units = input_units(
            prepared.paths, cfg.read.split_bytes, stage_fp, cfg.read.input_format
        )
    claim_output(cfg)
    store = work_store(cfg)
    folder = cfg.work_path / TOKENS_DIR
    _write_stage_record(cfg, tok, stage_fp, files, units)
    store.push(f"{TOKENS_DIR}/{STAGE}")
    store.pull(f"{TOKENS_DIR}/{SUCCESS}", f"{TOKENS_DIR}/{BACKEND}")
    task_of = assign_by_size([u["size"] for u in units], num_tasks)
    mine = [k for k in range(len(units)) if task_of[k] == task_index]
    done = store.done_units(units[k] for k in mine)
    pending = {k for k in mine if units[k]["key"] not in done}
    stale: list[str] = []
    if num_tasks == 1:  # the only task: shards of units no longer in the input go at the end
        stale = sorted(store.unit_keys() - {u["key"] for u in units})
    # A finished output stays finished unless this run changes the shards it was checked
    # against (those the index lists): a new unit's shards go to a folder of their own.
    indexed = _indexed_units(folder, store)
    if any(units[k]["key"] in indexed for k in pending):
        uncomplete(cfg)
        (folder / SUCCESS).unlink(missing_ok=True)  # index_tokens rebuilds it
        store.remove(f"{TOKENS_DIR}/{SUCCESS}")
    encoder: UnitEncoder | None = tok.chat
    total = sum(units[k]["size"] for k in mine)
    renderers = _render_pool(cfg, encoder, sum(units[k]["size"] for k in pending))
    with renderers or contextlib.nullcontext():
        if renderers is not None:  # the workers start while the fast backend is built
            _read_ahead(cfg, [units[k] for k in mine if k in pending], renderers)
        if pending or read_record(BackendChoice, folder / BACKEND) is None:
            # Building and checking the fast path costs seconds; skip it when nothing is left.
            encoder, backend = choose_backend(cfg, tok, units, prepared.early)
            # Every key as a field (a new one fails here, not silently dropped from the file).
            atomic_write_json(folder / BACKEND, BackendChoice(**backend).to_json())
            store.push(f"{TOKENS_DIR}/{BACKEND}")
        with progress_bar(quiet, total=total, unit="B", unit_scale=True, desc="tokenize") as bar:
            progress = _TokenizeProgress(bar)
            for k in mine:
                if k in pending:
                    assert encoder is not None  # chosen above whenever a unit is pending
                    _tokenize_unit(cfg, units[k], encoder, tok, progress, renderers)
                    store.unit_finished(units[k]["key"])
                    release_free_memory()
                else:
                    progress.update(units[k]["size"], 0)
    if any(name in indexed for name in stale):
        uncomplete(cfg)
    for gone in stale:  # only now that this run's shards are all there
        store.drop_unit(gone)
    if not pending:
        log.info("reusing tokenized shards for all %d input unit(s) of this task", len(mine))
    return not pending


def _write_stage_record(
    cfg: RunConfig,
    tok: Tokenizing,
    stage_fp: str,
    files: list[dict[str, Any]],
    units: list[dict[str, Any]],
) -> None:
    """``tokens/stage.json``: the stage's settings, tokenizer, input files and units (the
    same bytes from every task of the same run)."""
    folder = cfg.work_path / TOKENS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = StageRecord(
        fingerprint=fingerprint({"stage": stage_fp, "units": units}),
        settings=tok.settings,
        tokenizer=tok.record,
        config={
            "read": recorded_read(cfg.read),
            "tokenize": cfg.to_dict()["tokenize"],
            "chat": dataclasses.asdict(cfg.chat),
            **({"sources": cfg.to_dict()["sources"]} if cfg.sources else {}),
        },
        files=files,
        units=units,
        sources=[SourceSpec(**s) for s in tok.sources] if tok.sources else None,
    )
    atomic_write_json(folder / STAGE, record.to_json())


def _render_pool(
    cfg: RunConfig, encoder: UnitEncoder | None, pending_bytes: int
) -> RenderPool | None:
    """Worker processes for chat templates, when there is enough chat to render to repay
    starting them (packcli.chat.render_pool) and more than one core to render on."""
    if not isinstance(encoder, ChatEncoder):  # text, or preference pairs
        return None
    from packcli.chat.render_pool import MIN_POOL_BYTES  # multiprocessing: only for chat

    if pending_bytes < MIN_POOL_BYTES or cfg.tokenize.threads < 2:
        return None
    return encoder.render_pool(cfg.tokenize.threads)


@functools.cache
def _malloc_trim() -> Any:
    try:
        # The process's own symbols, libc's among them (``find_library`` would run
        # ``ldconfig -p`` in a subprocess to find the same library: ~15 ms).
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


def release_free_memory() -> None:
    """Hand memory freed by a finished unit or shard back to the OS (glibc's ``malloc_trim``).

    Each unit's reader and tokenizer threads allocate from their own glibc arenas, which keep
    freed memory; without this, peak RSS crept up by ~35 MB per unit (measured: 310 MB
    tokenized as 1 unit peaked at 481 MB, as 3 units at 589 MB)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _TokenizeProgress:
    """Bytes on the bar, tokens and tokens/s in its postfix, across the task's files."""

    def __init__(self, bar: Bar) -> None:
        self.bar = bar
        self.tokens = 0
        self.new_shards = 0

    def update(self, nbytes: int, tokens: int) -> None:
        self.bar.update(nbytes)
        self.tokens += tokens
        elapsed = max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.set_postfix_str(
            f"{self.tokens:,} tokens, {self.tokens / elapsed:,.0f} tok/s", refresh=False
        )


@dataclass
class _UnitCounts:
    """What tokenizing one unit counts, for its completion record."""

    read: ReadStats = field(default_factory=ReadStats)
    chat: ChatStats | None = None  # dialogues (--format chat)
    preference: PreferenceStats | None = None  # preference pairs
    times: StageTimes = field(default_factory=StageTimes)
    specials: Counter[str] = field(default_factory=Counter)


def _tokenize_unit(
    cfg: RunConfig,
    unit: dict[str, Any],
    encoder: UnitEncoder,
    tok: Tokenizing,
    progress: _TokenizeProgress,
    renderers: RenderPool | None = None,
) -> None:
    """Tokenize one input unit (a file or a byte span of one) that is not complete yet,
    resuming after its finished shards. ``renderers``: chat rendering workers, or None."""
    folder = cfg.work_path / TOKENS_DIR / "files" / unit["key"]
    done_shards = _resumable_shards(folder, unit["fingerprint"])
    resume_doc = done_shards[-1].last_doc_index + 1 if done_shards else 0
    if done_shards:
        log.info(
            "resuming tokenization of %s after %d completed shard(s)",
            unit["path"],
            len(done_shards),
        )
    counts = _UnitCounts()
    if cfg.chat.is_preference:
        from packcli.chat.preference import PreferenceStats

        counts.preference = PreferenceStats()
    elif cfg.chat.uses_template:
        counts.chat = ChatStats()
    done_bytes = 0
    with (
        RejectSink(folder / REJECTED) as sink,
        _shard_writer(
            folder, cfg.tokenize.shard_tokens, unit["size"], done_shards, _schema(cfg)
        ) as writer,
    ):
        failed = _template_failed(cfg, unit, counts.read, sink)
        spans = _worker_spans(cfg, unit, renderers, resume_doc)
        if spans is not None:  # the workers read the unit too (packcli.chat.render_pool)
            assert renderers is not None and isinstance(encoder, ChatEncoder)
            assert counts.chat is not None
            reading = SpanReading(counts.read, sink, unit["file_index"], spans[0][0])
            encoded = tokenize_chat_spans(
                unit["path"], spans, _span_read(cfg), encoder, renderers, counts.chat, failed,
                reading, counts.times,
            )  # fmt: skip
        else:
            source = read_unit(cfg, unit, cfg.read.batch_size, counts.read, sink)
            batches = prefetch(
                _skip_documents(source, resume_doc, unit["file_index"]), times=counts.times
            )
            encoded = _encoded(cfg, batches, encoder, tok, counts, failed, renderers, unit)
        seen = len(writer.manifests)  # shards on disk (written behind: counted as they land)
        for batch, record_batch in encoded:
            writer.add(record_batch)
            landed = len(writer.manifests) - seen  # read once: a thread may append
            if landed:
                release_free_memory()  # the shard's combined columns were just freed
            for _ in range(landed):
                seen += 1
                progress.new_shards += 1
                crash_point(f"tokenize:{progress.new_shards}")
            tokens = int(to_numpy(record_batch.column("length")).sum())
            progress.update(batch.progress_bytes - done_bytes, tokens)
            done_bytes = batch.progress_bytes
    counts.times.write += writer.flush_seconds
    progress.update(unit["size"] - done_bytes, 0)
    log.info(
        "tokenized %s%s: busy seconds %s",
        unit["path"],
        f" bytes {unit['span']}" if unit["span"] else "",
        ", ".join(f"{k} {v:.2f}" for k, v in dataclasses.asdict(counts.times).items()),
    )
    atomic_write_json(folder / SUCCESS, _unit_record(unit, writer.manifests, counts).to_json())


# A unit's shards are cut into about this many while its input is small enough (two such
# shards fit in ``tokenize.shard_tokens``), each full one written on a thread while the next
# fills (``ShardWriter(behind=True)``): the tokenize stage then ends with the write of a
# quarter of the unit's tokens instead of all of them (a 41M-token chat unit's 328 MB took
# ~1 s of one core, the other idle). The two shards then in memory hold at most
# shard_tokens tokens together, the bound of one shard in line; larger units keep shards of
# shard_tokens, written in line.
SHARD_CUTS = 4
# Fewer tokens than this never cut a shard earlier (a small pack stays one shard).
MIN_CUT_TOKENS = 4 * 1024 * 1024
# Input bytes per token assumed when a unit's tokens are not known yet: fewer than the ~3.5
# of English text with a 128k vocabulary, so the estimate is rather too many than too few.
BYTES_PER_TOKEN_GUESS = 3


def _shard_writer(
    folder: Path,
    shard_tokens: int,
    unit_bytes: int,
    done: list[ShardManifest],
    schema: pa.Schema,
) -> ShardWriter:
    """The unit's shard writer: shards of ``shard_tokens``, or, for a unit expected to fit in
    ``SHARD_CUTS / 2`` shards, about ``SHARD_CUTS`` smaller ones written behind, none cut
    below ``MIN_CUT_TOKENS``. Shard boundaries change no byte of a plan in one group (the
    write stage gathers each document's tokens wherever they are), but a grouped plan's
    groups follow the shards: they follow from the unit's size and the config alone (and
    the stage fingerprint's ``shards`` version), never from the task count."""
    expected = unit_bytes // BYTES_PER_TOKEN_GUESS
    cut = max(MIN_CUT_TOKENS, -(-expected // SHARD_CUTS))
    if 2 * cut > shard_tokens:
        return ShardWriter(folder, shard_tokens, done, schema)
    return ShardWriter(folder, cut, done, schema, behind=True)


def _worker_spans(
    cfg: RunConfig, unit: dict[str, Any], renderers: RenderPool | None, resume_doc: int
) -> list[tuple[int, int]] | None:
    """The byte spans the rendering workers read a unit in, or None (this process reads
    it): only a fresh unit that is one local, plain jsonl file (or a span of one). Without
    workers nothing is imported: the pool's module brings multiprocessing (~5 ms of a small
    text pack)."""
    if renderers is None or resume_doc or unit.get("format", "jsonl") != "jsonl":
        return None
    from packcli.chat.render_pool import SPAN_BYTES

    paths = unit_paths(unit)
    if len(paths) != 1 or is_url(paths[0]) or not splittable(paths[0]):
        return None
    size = os.path.getsize(paths[0])
    lo, hi = unit_span(unit) or (0, size)
    return line_spans(paths[0], min(lo, size), min(hi, size), SPAN_BYTES) or None


def _read_ahead(cfg: RunConfig, pending: list[dict[str, Any]], renderers: RenderPool) -> None:
    """Hand the workers the first spans of the first pending unit now: building and checking
    the fast backend takes seconds (~2.5 s for Llama 3's vocabulary) in which this process
    mostly waits on a Rust thread, and those spans are read and rendered meanwhile. A unit
    that turns out to resume an interrupted run never claims them (same results either way:
    ``RenderPool.submit_span`` only hands back a span read with the same settings)."""
    from packcli.chat.render_pool import READ_AHEAD

    spans = _worker_spans(cfg, pending[0], renderers, 0) if pending else None
    if spans is not None:
        renderers.read_ahead(pending[0]["path"], spans[:READ_AHEAD], _span_read(cfg))


def _span_read(cfg: RunConfig) -> SpanRead:
    from packcli.chat.render_pool import SpanRead

    read = cfg.read
    return SpanRead(cfg.chat.messages_field, read.on_bad_line, read.batch_size, read.batch_bytes)


def _schema(cfg: RunConfig) -> Any:
    """The shards' schema: text, chat (with labels) or preference (with the pair split)."""
    if cfg.chat.is_preference:
        return PREFERENCE_SHARD_SCHEMA
    return CHAT_SHARD_SCHEMA if cfg.chat.uses_template else SHARD_SCHEMA


def _template_failed(
    cfg: RunConfig, unit: dict[str, Any], stats: ReadStats, sink: RejectSink
) -> Callable[[DocBatch, int, str], None]:
    """What a dialogue the chat template cannot render does: stop the run naming its file and
    line (row), or, under ``--on-bad-line skip``, go to the quarantine and be counted."""

    def failed(batch: DocBatch, index: int, reason: str) -> None:
        line = int(batch.position[index])
        doc_path = unit_paths(unit)[int(batch.file_index[index]) - unit["file_index"]]
        if cfg.read.on_bad_line != "skip":
            if "format" in unit:  # a row of a Parquet/Arrow file (range)
                row = line + stats.rows_before
                raise InputError(f"{doc_path}: row {row}: {reason}")
            line += count_newlines(doc_path, stats.first_line_byte)  # a file line
            raise InputError(f"{doc_path}:{line}: {reason}")
        stats.rejected["template_error"] = stats.rejected.get("template_error", 0) + 1
        record = batch.texts[index]
        if not cfg.chat.is_preference:
            record = {cfg.chat.messages_field: record}
        sink.add(doc_path, line, "template_error", orjson.dumps(record), reason)

    return failed


def _encoded(
    cfg: RunConfig,
    batches: Iterator[DocBatch],
    encoder: UnitEncoder,
    tok: Tokenizing,
    counts: _UnitCounts,
    failed: Callable[[DocBatch, int, str], None],
    renderers: RenderPool | None,
    unit: dict[str, Any],
) -> Iterator[tuple[DocBatch, pa.RecordBatch]]:
    """(batch, its shard rows) for the run's format: chat records (dialogues or preference
    pairs), or text."""
    if isinstance(encoder, TemplateEncoder):
        stats = counts.preference if counts.preference is not None else counts.chat
        assert stats is not None  # set for chat and preference runs
        return tokenize_chat_batches(batches, encoder, stats, failed, counts.times, renderers)
    bos, eos = tok.specials(unit)  # a mixture's unit: its source's separators
    return tokenize_batches(
        batches,
        encoder,
        bos=bos,
        eos=eos,
        times=counts.times,
        count_specials=(SpecialStringCounter.of(tok.loaded.tokenizer), counts.specials),
    )


def _unit_record(
    unit: dict[str, Any], manifests: list[ShardManifest], counts: _UnitCounts
) -> UnitRecord:
    """The unit's completion record (``_SUCCESS.json``), from what tokenizing it counted."""
    stats = counts.read
    return UnitRecord(
        fingerprint=unit["fingerprint"],
        path=unit["path"],
        span=unit["span"],
        file_index=unit["file_index"],
        num_docs=sum(m.num_docs for m in manifests),
        num_tokens=sum(m.num_tokens for m in manifests),
        shards=list(manifests),
        read_stats={
            "documents": stats.documents,
            "blank_lines": stats.blank_lines,
            "bytes_read": stats.bytes_read,
            "lines": stats.lines,
            "rejected": dict(sorted(stats.rejected.items())),
            "corrupt_streams": stats.corrupt_streams,
        },
        chat=None if counts.chat is None else dataclasses.asdict(counts.chat),
        preference=None if counts.preference is None else dataclasses.asdict(counts.preference),
        special_strings=dict(sorted(counts.specials.items())),
        times={k: round(v, 3) for k, v in dataclasses.asdict(counts.times).items()},
    )


def _resumable_shards(folder: Path, fingerprint: str) -> list[ShardManifest]:
    """Completed shards of an interrupted run with the same fingerprint; clears the rest.

    A shard counts as complete when its manifest reads as one (``ShardManifest``): the shard
    is renamed into place first, its manifest second, both atomically. Anything else (temp
    files, a shard without a manifest, shards of another fingerprint, a damaged shard or
    manifest and all after it) is removed.
    """
    stamp = folder / UNIT_STAMP
    if read_record(UnitStamp, stamp) != UnitStamp(fingerprint):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        atomic_write_json(stamp, UnitStamp(fingerprint).to_json())
        return []
    manifests: list[ShardManifest] = []
    while True:
        shard = read_record(ShardManifest, folder / manifest_name(len(manifests)))
        if shard is None or not shard_intact(folder, shard):
            break
        manifests.append(shard)
    keep = {stamp.name} | {m.file for m in manifests}
    keep |= {manifest_name(i) for i in range(len(manifests))}
    for f in folder.iterdir():
        if f.name not in keep:
            f.unlink()
    return manifests


def _skip_documents(batches: Iterator[DocBatch], start: int, file_index: int) -> Iterator[DocBatch]:
    """Drop documents before ``start`` (already tokenized by an interrupted run) and stamp
    the global file index (the unit's first file's, plus the file's place in a group of small
    files). Re-reading is ~100x cheaper than tokenizing and keeps stats exact."""
    for batch in batches:
        n = len(batch.texts)
        if batch.doc_id_start + n <= start:
            continue
        cut = max(0, start - batch.doc_id_start)
        yield DocBatch(
            texts=batch.texts[cut:],
            doc_id_start=batch.doc_id_start + cut,
            file_index=(batch.file_index[cut:] + file_index).astype(np.int32),
            position=batch.position[cut:],
            progress_bytes=batch.progress_bytes,
        )
