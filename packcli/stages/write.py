"""The write stage: each task writes its share of the output Parquet files from the saved plan
and the tokenized shards, with a record per finished file for resume."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packcli.atomic import atomic_write_json
from packcli.config import RunConfig
from packcli.faults import crash_point
from packcli.fs import begin_changes, put_output_file, same_version
from packcli.names import CONFIG_NAMES
from packcli.pack.plan import Plan
from packcli.stages.index import collect_tokens
from packcli.stages.plan import load_plan, plan_fingerprint
from packcli.stages.work import fingerprint, progress_bar, read_json, require_out, uncomplete
from packcli.stages.workstore import WorkStore, in_mirror, work_store
from packcli.tokenize.shards import TokenShards, sha256_file
from packcli.write import TokenSource, file_ranges, write_config_file

log = logging.getLogger(__name__)


def write_fingerprint(cfg: RunConfig, shards: TokenShards) -> str:
    return fingerprint(
        {
            "plan": plan_fingerprint(cfg.plan, shards.success["fingerprint"]),
            "plan_content": read_json(cfg.work_path / "plan.json").get("content_sha256"),
            "write": dataclasses.asdict(cfg.write),
        }
    )


def parquet_jobs(cfg: RunConfig, plan: Plan) -> list[tuple[str, int, int, int, int]]:
    """Every output file as (config, index, count, first row, end row), in a fixed order."""
    jobs = []
    for name in CONFIG_NAMES:
        ranges = file_ranges(getattr(plan, name), cfg.write.shard_tokens)
        jobs += [(name, i, len(ranges), r0, r1) for i, (r0, r1) in enumerate(ranges)]
    return jobs


@in_mirror
def write_task(
    cfg: RunConfig,
    plan: Plan,
    shards: TokenShards,
    *,
    task_index: int = 0,
    num_tasks: int = 1,
    quiet: bool = False,
) -> None:
    """Write this task's share of the output files (round robin over all files)."""
    out = require_out(cfg)
    store = work_store(cfg)
    # plan.json is here already: write_stage pulled it, or ``pack`` made it in this process.
    store.pull_records("write")
    fingerprint = write_fingerprint(cfg, shards)
    records = cfg.work_path / "write"
    records.mkdir(parents=True, exist_ok=True)
    atomic_write_json(records / "config.json", {"write": dataclasses.asdict(cfg.write)})
    store.push("write/config.json")
    jobs = parquet_jobs(cfg, plan)[task_index::num_tasks]
    # Where the Parquet files are: this disk, or (URL work folder) the remote output.
    placed = store.out_listing("data") if isinstance(store, WorkStore) else None

    def written(job: tuple[str, int, int, int, int]) -> bool:
        name, i, count = job[:3]
        final = out / "data" / name / f"train-{i:05d}-of-{count:05d}.parquet"
        record = read_json(records / f"{name}-{i:05d}.json")
        if record.get("fingerprint") != fingerprint:
            return False
        if placed is not None:  # there at its size, and as the store had it when put
            there = placed.get(f"data/{name}/{final.name}")
            return (
                there is not None
                and int(there.get("size") or 0) == record.get("bytes")
                and same_version(record.get("store_version") or {}, there)
            )
        return final.is_file()

    def claim_file(name: str, record_path: Path, final: Path) -> None:
        """Before a file is written, its record names it (without a fingerprint: not done),
        so a kill mid-write leaves a file packcli's records own. A file of an earlier plan
        the record named (another name) is packcli's and stale: it goes first."""
        old = read_json(record_path).get("file")
        if isinstance(old, str) and old != final.name and "/" not in old:
            if isinstance(store, WorkStore):
                store.remove_output(f"data/{name}/{old}")
            (out / "data" / name / old).unlink(missing_ok=True)
        atomic_write_json(record_path, {"file": final.name})
        store.push(f"write/{record_path.name}")

    if not all(written(job) for job in jobs):
        uncomplete(cfg)  # a Parquet file the finished output lists is about to change
        if cfg.remote_out:  # and on the store: its packcli.json goes before the first one
            begin_changes(cfg.remote_out)
    total = sum(int(getattr(plan, j[0]).row_tokens[j[3] : j[4]].sum()) for j in jobs)
    source = TokenSource.of(shards)
    with progress_bar(quiet, total=total, unit="tok", unit_scale=True, desc="write") as bar:

        def write_one(job: tuple[str, int, int, int, int]) -> None:
            name, i, count, r0, r1 = job
            layout = getattr(plan, name)
            final = out / "data" / name / f"train-{i:05d}-of-{count:05d}.parquet"
            record_path = records / f"{name}-{i:05d}.json"
            if written(job):
                bar.update(int(layout.row_tokens[r0:r1].sum()))
                return
            claim_file(name, record_path, final)
            write_config_file(plan, layout, source, final, cfg.write, r0, r1, bar.update)
            record = {
                "fingerprint": fingerprint,
                "file": final.name,
                "rows": r1 - r0,
                "tokens": int(layout.row_tokens[r0:r1].sum()),
                "bytes": final.stat().st_size,
                "sha256": sha256_file(final),
            }
            if isinstance(store, WorkStore):  # straight to the remote output, then the record
                record["store_version"] = store.put_output(final, f"data/{name}/{final.name}")
            elif cfg.remote_out:  # uploads overlap writing; finalize puts only what is not up
                rel = f"data/{name}/{final.name}"
                put_output_file(
                    out, cfg.work_path, cfg.remote_out, rel, record["bytes"], record["sha256"]
                )
            atomic_write_json(record_path, record)
            store.push(f"write/{record_path.name}")
            crash_point(f"write:{name}:{i}")

        # Files are independent and Parquet encoding/compression runs without the GIL, so
        # files are written side by side on the process's threads (each file's bytes do not
        # depend on which thread wrote it, or when).
        workers = max(1, min(len(jobs), cfg.tokenize.threads))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packcli-write") as pool:
            for _ in pool.map(write_one, jobs):
                pass


@in_mirror
def write_stage(
    cfg: RunConfig, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = False
) -> None:
    """``packcli write``: one write task over the saved plan, with the plan's own settings."""
    shards = collect_tokens(cfg)
    work_store(cfg).pull("plan.json", "plan.npz")
    plan, plan_cfg = load_plan(cfg.work_path, shards)
    cfg = dataclasses.replace(cfg, plan=plan_cfg)
    write_task(cfg, plan, shards, task_index=task_index, num_tasks=num_tasks, quiet=quiet)
