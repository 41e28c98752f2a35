"""The write stage: each task writes the output Parquet files of whole parts of the saved plan
(groups of token shards; a grouped mixture's share a shard where a source's cut falls in
it), so it reads each of its groups' shards once and no other; with a
record per finished file for resume. A group's task also cuts the group's *tail shard* (the
tokens of the pieces the group released); the tail's files are written from those last."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from packcli.arrow_np import list_array, to_arrow
from packcli.atomic import atomic_path, atomic_write_json
from packcli.config import RunConfig
from packcli.errors import PackcliError
from packcli.faults import crash_point
from packcli.pack.groups import Pieces
from packcli.pack.mixture import MixSpec
from packcli.pack.plan import Plan
from packcli.pack.schedule import CostModel, resolve_cost_model
from packcli.records import read_record
from packcli.stages.index import index_tokens
from packcli.stages.plan import FileJob, PlanSet, load_part, load_plan, plan_fingerprint
from packcli.stages.plan_records import PLAN, PlanPart, PlanRecord
from packcli.stages.progress import progress_bar
from packcli.stages.tasks import assign_by_size
from packcli.stages.work import fingerprint, read_json, require_out, uncomplete
from packcli.stages.workstore import in_mirror, work_store
from packcli.stages.write_records import (
    WRITE_DIR,
    WRITE_SETTINGS,
    FileClaim,
    FileRecord,
    TailShard,
    WriteSettings,
    file_record_name,
    tail_shard_name,
)
from packcli.tokenize.shards import TokenShards, sha256_file, shard_tokens
from packcli.write import (
    ROWS_VERSION,
    PieceRule,
    Scratch,
    TokenSource,
    pad_token_id,
    write_config_file,
)

log = logging.getLogger(__name__)


def write_fingerprint(cfg: RunConfig, shards: TokenShards) -> str:
    model = cost_model_of(cfg)
    plan = read_record(PlanRecord, cfg.work_path / PLAN)  # None: no plan of this packcli
    return fingerprint(
        {
            "plan": plan_fingerprint(cfg.plan, shards.success.fingerprint),
            "plan_content": plan.content_sha256 if plan is not None else None,
            "write": dataclasses.asdict(cfg.write),
            "rows": ROWS_VERSION,
            # The coefficients, not only the setting: a config file named by path may change.
            "cost_model": dataclasses.asdict(model) if model is not None else None,
        }
    )


def cost_model_of(cfg: RunConfig) -> CostModel | None:
    """The ``cost`` column's model (``write.cost_model``), None when not asked for."""
    spec = cfg.write.cost_model
    return resolve_cost_model(spec) if spec is not None else None


def piece_rule(planset: PlanSet) -> PieceRule:
    """How the plan cut documents (``long_len``; per source of a mixture, the policy the
    plan recorded), for the writer's ``seq_pieces`` / ``seq_last``."""
    record = planset.stats.get("mixture_spec")
    policies = MixSpec.from_record(record).overlong if record else (planset.config.overlong,)
    return PieceRule(planset.config.long_len, tuple(p == "truncate" for p in policies))


def task_parts(planset: PlanSet, task_index: int, num_tasks: int) -> list[int]:
    """The groups (part indices) a write task writes: whole groups, balanced by tokens, the
    same assignment in every task. The tail is not a task's: ``write_tail`` writes it."""
    groups = [k for k, part in enumerate(planset.parts) if not part.is_tail]
    owner = assign_by_size([sum(planset.parts[k].tokens.values()) for k in groups], num_tasks)
    return [k for k, t in zip(groups, owner, strict=True) if t == task_index]


class _Writer:
    """What writing any part's files needs: the records folder, the fingerprint, the work
    folder (which knows where finished files go), and the one rule for whether a file is
    already written."""

    def __init__(self, cfg: RunConfig, shards: TokenShards, planset: PlanSet) -> None:
        self.cfg = cfg
        self.out = require_out(cfg)
        self.store = work_store(cfg)
        self.fingerprint = write_fingerprint(cfg, shards)
        self.mixture = shards.success.sources  # a mixture's sources, else None
        self.records = cfg.work_path / WRITE_DIR
        self.records.mkdir(parents=True, exist_ok=True)
        self.pad_id = pad_token_id(shards.success.tokenizer)  # context-parallel padding
        self.pieces = piece_rule(planset)
        self.cost_model = cost_model_of(cfg)

    def written(self, job: FileJob) -> bool:
        record = read_record(FileRecord, self.records / file_record_name(job.config, job.index))
        return (
            record is not None
            and record.fingerprint == self.fingerprint
            and self.store.output_written(job.rel, record)
        )

    def claim_file(self, job: FileJob, record_path: Path) -> None:
        """Before a file is written, its record names it (without a fingerprint: not done),
        so a kill mid-write leaves a file packcli's records own. A file of an earlier plan
        the record named (another name) is packcli's and stale: it goes first."""
        old = FileClaim.named(read_json(record_path))
        name = Path(job.rel).name
        if old is not None and old != name:
            self.store.remove_output(f"data/{job.config}/{old}")
        atomic_write_json(record_path, FileClaim(file=name).to_json())
        self.store.push(f"{WRITE_DIR}/{record_path.name}")

    def begin(self, jobs: list[FileJob]) -> None:
        """Before the first file of ``jobs`` changes: the finished output is no longer."""
        if not all(self.written(job) for job in jobs):
            uncomplete(self.cfg)  # a Parquet file the finished output lists is about to change
            self.store.begin_output()  # and a remote output's packcli.json goes too

    def write_files(
        self,
        plan: Plan,
        source: TokenSource,
        jobs: list[FileJob],
        on_tokens: Callable[[int], object],  # its result is not used (a bar's update)
    ) -> None:
        """``jobs`` (files of one part) from ``plan`` and ``source``, side by side on the
        process's threads (Parquet encoding runs without the GIL; each file's bytes do not
        depend on which thread wrote it, or when). Each thread keeps its row groups' buffers
        from file to file (``Scratch``)."""
        local = threading.local()

        def write_one(job: FileJob) -> None:
            layout = getattr(plan, job.config)
            final = self.out / job.rel
            record_path = self.records / file_record_name(job.config, job.index)
            if self.written(job):
                on_tokens(int(layout.row_tokens[job.r0 : job.r1].sum()))
                return
            self.claim_file(job, record_path)
            if not hasattr(local, "scratch"):
                local.scratch = Scratch()
            write_config_file(
                plan,
                layout,
                source,
                final,
                self.cfg.write,
                job.r0,
                job.r1,
                on_tokens,
                pad_id=self.pad_id,
                pieces=self.pieces,
                cost_model=self.cost_model,
                scratch=local.scratch,
            )
            size, digest = final.stat().st_size, sha256_file(final)
            record = FileRecord(
                fingerprint=self.fingerprint,
                file=final.name,
                rows=job.r1 - job.r0,
                tokens=int(layout.row_tokens[job.r0 : job.r1].sum()),
                bytes=size,
                sha256=digest,
                store_version=self.store.place_output(job.rel, size, digest),  # then the record
            )
            atomic_write_json(record_path, record.to_json())
            self.store.push(f"{WRITE_DIR}/{record_path.name}")
            crash_point(f"write:{job.config}:{job.index}")

        workers = max(1, min(len(jobs), self.cfg.tokenize.threads))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packcli-write") as pool:
            for _ in pool.map(write_one, jobs):
                pass


@in_mirror
def write_task(
    cfg: RunConfig,
    planset: PlanSet,
    shards: TokenShards,
    *,
    task_index: int = 0,
    num_tasks: int = 1,
    quiet: bool = False,
) -> None:
    """Write this task's groups' files (and tail shards); a single task writes the tail too."""
    writer = _Writer(cfg, shards, planset)
    store = writer.store
    # plan.json is here already: write_stage pulled it, or ``pack`` made it in this process.
    store.pull_records(WRITE_DIR)
    settings = WriteSettings(dataclasses.asdict(cfg.write))
    atomic_write_json(writer.records / WRITE_SETTINGS, settings.to_json())
    store.push(f"{WRITE_DIR}/{WRITE_SETTINGS}")
    mine = task_parts(planset, task_index, num_tasks)
    jobs = [job for job in planset.jobs() if job.part in mine]
    writer.begin(jobs)
    has_tail = planset.parts[-1].is_tail
    total = sum(sum(planset.parts[k].tokens.values()) for k in mine)
    with progress_bar(quiet, total=total, unit="tok", unit_scale=True, desc="write") as bar:
        for k in mine:
            part = planset.parts[k]
            part_jobs = [job for job in jobs if job.part == k]
            if all(writer.written(job) for job in part_jobs) and (
                not has_tail or _tail_shard_done(writer, part)
            ):
                bar.update(sum(part.tokens.values()))
                continue
            store.pull(*part.arrays)
            plan, tail = load_part(cfg.work_path, planset, part)
            source = TokenSource.of(shards)  # loads a shard when a row first needs it
            writer.write_files(plan, source, part_jobs, bar.update)
            if has_tail:
                _write_tail_shard(writer, part, source, tail)
    if num_tasks == 1 and has_tail:  # every tail shard is this task's: the tail's files now
        _write_tail(writer, planset, quiet)


def _tail_shard(writer: _Writer, part: PlanPart) -> TailShard | None:
    """A group's tail shard's record (None: missing, damaged or of another version)."""
    return read_record(TailShard, writer.records / f"{tail_shard_name(part.name)}.json")


def _tail_shard_done(writer: _Writer, part: PlanPart) -> bool:
    record = _tail_shard(writer, part)
    return (
        record is not None
        and record.fingerprint == writer.fingerprint
        and record.pieces == part.tail_pieces
        and writer.store.holds(f"{WRITE_DIR}/{record.file}")
    )


def _write_tail_shard(writer: _Writer, part: PlanPart, source: TokenSource, tail: Pieces) -> None:
    """The tokens (labels, pair lengths) of the pieces ``part`` released, one list per piece
    in the tail's order, into ``write/tail-group-NNNNN.arrow``: read from the group's own
    shards while they are open, so the tail's writer never touches a group's shards."""
    if _tail_shard_done(writer, part):
        return
    name = tail_shard_name(part.name)
    offsets = np.zeros(tail.size + 1, dtype=np.int64)
    np.cumsum(tail.length, out=offsets[1:])
    columns = {
        "input_ids": list_array(
            offsets, source.gather(tail.doc, tail.start, tail.length), pa.int32()
        )
    }
    if source.has_labels:
        labels = source.gather(tail.doc, tail.start, tail.length, labels=True)
        columns["labels"] = list_array(offsets, labels, pa.int32())
    if source.has_pairs:
        columns["chosen_len"] = pa.array(source.chosen_len(tail.doc).astype(np.int32))
    # Each piece's document length, so the tail's writer numbers its pieces (seq_pieces,
    # seq_last) as the group's would, without the group's shards.
    columns["doc_len"] = to_arrow(source.doc_lengths(tail.doc), pa.int64())
    batch = pa.record_batch(columns)
    path = writer.records / f"{name}.arrow"
    with (
        atomic_path(path) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        pa.ipc.new_file(sink, batch.schema) as w,
    ):
        w.write_batch(batch)
    store = writer.store
    store.push(f"{WRITE_DIR}/{path.name}")
    record = TailShard(
        fingerprint=writer.fingerprint,
        file=path.name,
        pieces=tail.size,
        bytes=path.stat().st_size,
        sha256=sha256_file(path),
    )
    atomic_write_json(writer.records / f"{name}.json", record.to_json())
    store.push(f"{WRITE_DIR}/{name}.json")


def write_tail(
    cfg: RunConfig, planset: PlanSet, shards: TokenShards, *, quiet: bool = False
) -> None:
    """The tail's files, from the groups' tail shards (after every group's task is done)."""
    if planset.parts[-1].is_tail:
        writer = _Writer(cfg, shards, planset)
        writer.store.pull_records(WRITE_DIR)  # the write tasks' records, wherever they ran
        _write_tail(writer, planset, quiet)


def _write_tail(writer: _Writer, planset: PlanSet, quiet: bool) -> None:
    cfg, store = writer.cfg, writer.store
    k = len(planset.parts) - 1
    part = planset.parts[k]
    jobs = [job for job in planset.jobs() if job.part == k]
    if all(writer.written(job) for job in jobs):
        return
    writer.begin(jobs)
    groups = planset.parts[:-1]
    missing = [p.name for p in groups if not _tail_shard_done(writer, p)]
    if missing:
        raise PackcliError(
            f"write task(s) not finished: {len(missing)} group(s) have no tail shard, e.g. "
            f"{missing[0]}; run `packcli write` for every task first"
        )
    loaded, first = [], 0
    for p in groups:
        rel = f"{WRITE_DIR}/{tail_shard_name(p.name)}.arrow"
        path = cfg.work_path / rel
        record = _tail_shard(writer, p)
        digest = record.sha256 if record is not None else None
        # A tail shard this machine cut (the single write task) is here as its record
        # says: fetched only when not, so it crosses the network once, on its put.
        if not path.is_file() or sha256_file(path) != digest:
            store.pull(rel)
        if not path.is_file() or sha256_file(path) != digest:
            raise PackcliError(f"{path}: damaged tail shard; run `packcli write` again")
        batch = pa.ipc.open_file(pa.memory_map(str(path), "r")).get_batch(0)
        loaded.append(shard_tokens(batch, first, path.name))
        first += p.tail_pieces
    store.pull(*part.arrays)
    plan, _ = load_part(cfg.work_path, planset, part)
    mix = writer.mixture  # a mixture's rows say their sources, the tail's too
    source = TokenSource(  # its columns and first doc ids from the tail shards
        loaded,
        source_first_doc=np.array([s.first_doc for s in mix], np.int64) if mix else None,
    )
    with progress_bar(
        quiet, total=sum(part.tokens.values()), unit="tok", unit_scale=True, desc="write tail"
    ) as bar:
        writer.write_files(plan, source, jobs, bar.update)


@in_mirror
def write_stage(
    cfg: RunConfig, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = False
) -> None:
    """``packcli write``: one write task over the saved plan, with the plan's own settings."""
    shards = index_tokens(cfg)
    cfg, planset = planned_config(cfg, shards)
    write_task(cfg, planset, shards, task_index=task_index, num_tasks=num_tasks, quiet=quiet)


def planned_config(cfg: RunConfig, shards: TokenShards) -> tuple[RunConfig, PlanSet]:
    """The saved plan, and ``cfg`` with the settings it was made with (the plan's, and the
    output file size its files were cut by)."""
    work_store(cfg).pull(PLAN)
    planset = load_plan(cfg.work_path, shards)
    write = dataclasses.replace(
        cfg.write,
        shard_tokens=planset.shard_tokens,
        min_files=planset.min_files,
        # A cost model named when planning (``packcli plan --cost-model``), unless the write
        # command's own config names one.
        cost_model=cfg.write.cost_model or planset.cost_model,
    )
    return dataclasses.replace(cfg, plan=planset.config, write=write), planset
