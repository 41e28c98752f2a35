"""The plan stage: one global task over the lengths of every document (``packcli.pack.plan``
decides the tiers and rows); the plan is saved for the write tasks with a digest of its arrays."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import zipfile
from pathlib import Path

import numpy as np

from packcli import __version__
from packcli.atomic import atomic_write_json, atomic_writer
from packcli.config import (
    ChatConfig,
    PlanConfig,
    ReadConfig,
    RunConfig,
    TokenizeConfig,
    WriteConfig,
)
from packcli.errors import InputError, PackcliError
from packcli.faults import crash_point
from packcli.names import CONFIG_NAMES
from packcli.pack.plan import Plan, RowLayout, plan_two_tier
from packcli.stages.index import collect_tokens, gather_rejects
from packcli.stages.work import REJECTED, fingerprint, progress_bar, read_json, require_out
from packcli.stages.workstore import in_mirror, work_store
from packcli.tokenize.shards import TokenShards

log = logging.getLogger(__name__)


def plan_fingerprint(plan_cfg: PlanConfig, tokens_fingerprint: str) -> str:
    return fingerprint(
        {"tokens": tokens_fingerprint, "plan": dataclasses.asdict(plan_cfg), "v": __version__}
    )


@in_mirror
def plan_stage(cfg: RunConfig, *, quiet: bool = False) -> tuple[Plan, TokenShards]:
    """Global plan over the lengths of all tokenized documents; saved for the write tasks.

    The finished output (if any) stays complete: its Parquet files do not change here."""
    require_out(cfg)
    shards = collect_tokens(cfg)
    lengths = shards.column("length").astype(np.int64)
    if lengths.size == 0:
        raise InputError(_no_documents(cfg, shards))
    with progress_bar(quiet, total=1, desc="plan") as bar:
        plan = plan_two_tier(lengths, cfg.plan)
        bar.update(1)
    _save_plan(cfg, plan, shards.success["fingerprint"])
    work_store(cfg).push("plan.npz", "plan.json")
    crash_point("plan")
    return plan, shards


def _no_documents(cfg: RunConfig, shards: TokenShards) -> str:
    """Why there is nothing to pack, in figures: a run whose every line was rejected under
    ``--on-bad-line skip`` says so, and its quarantine is kept in ``OUT/rejected.jsonl``
    (finalize, which gathers it otherwise, never runs)."""
    stats = shards.success["read_stats"]
    files = f"{len(shards.success['files'])} input file(s)"
    blank = f"{stats['blank_lines']} blank lines"
    rejected = stats.get("rejected") or {}
    if not rejected:
        return f"no documents in {files} ({blank}); nothing to pack"
    gather_rejects(cfg, cfg.out_path, shards)
    total = sum(rejected.values())
    reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(rejected.items()))
    corrupt = len(stats.get("corrupt_streams") or [])
    streams = f", {corrupt} corrupt stream(s)" if corrupt else ""
    return (
        f"no documents in {files}: all {total:,} record(s) were rejected ({reasons}; "
        f"{blank}{streams}); see {cfg.out_path / REJECTED}; nothing to pack"
    )


def _save_plan(cfg: RunConfig, plan: Plan, tokens_fingerprint: str) -> None:
    path = cfg.work_path / "plan.npz"
    arrays = {"piece_doc": plan.piece_doc, "piece_start": plan.piece_start}
    arrays["piece_len"] = plan.piece_len
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        arrays[f"{name}_row_offsets"] = layout.row_offsets
        arrays[f"{name}_row_pieces"] = layout.row_pieces
        arrays[f"{name}_row_tokens"] = layout.row_tokens
    with atomic_writer(path) as fh:  # np.savez writes the same bytes to a file or a path
        np.savez(fh, **arrays)
    # What the Parquet files depend on is the plan itself, not only the settings that made it
    # (another packcli build may plan the same settings differently): write records carry
    # this digest of the arrays (the npz bytes hold zip timestamps, so not the file's hash).
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arrays[name]).view(np.uint8).data)
    atomic_write_json(
        cfg.work_path / "plan.json",
        {
            "content_sha256": digest.hexdigest(),
            "fingerprint": plan_fingerprint(cfg.plan, tokens_fingerprint),
            "tokens_fingerprint": tokens_fingerprint,
            "stats": plan.stats,
            "plan": dataclasses.asdict(cfg.plan),
        },
    )


def load_plan(work: Path, shards: TokenShards) -> tuple[Plan, PlanConfig]:
    """The saved plan and the settings it was made with (write tasks need no plan flags)."""
    meta = read_json(work / "plan.json")
    if not meta or meta.get("tokens_fingerprint") != shards.success["fingerprint"]:
        raise PackcliError(
            f"no plan for the current tokenized shards in {work}: run `packcli plan` first"
        )
    try:
        plan_cfg = PlanConfig(**meta["plan"])
        with np.load(work / "plan.npz") as z:
            layouts = {
                name: RowLayout(
                    plan_cfg.short_len if name == "short" else plan_cfg.long_len,
                    z[f"{name}_row_offsets"],
                    z[f"{name}_row_pieces"],
                    z[f"{name}_row_tokens"],
                )
                for name in CONFIG_NAMES
            }
            plan = Plan(
                z["piece_doc"], z["piece_start"], z["piece_len"], stats=meta["stats"], **layouts
            )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{work / 'plan.npz'}: damaged or missing plan ({exc}); run `packcli plan` again"
        ) from exc
    return plan, plan_cfg


def stored_config(cfg: RunConfig) -> RunConfig:
    """The run config as the stages recorded it: tokenize settings from the tokenize stage,
    plan settings from the plan stage, write settings from the write tasks. ``finalize``
    reports this, so the output says how it was made whichever commands made it."""
    work = cfg.work_path
    stage = read_json(work / "tokens" / "stage.json")
    plan = read_json(work / "plan.json")
    write = read_json(work / "write" / "config.json")
    values = {
        "read": stage.get("config", {}).get("read", dataclasses.asdict(cfg.read)),
        "tokenize": stage.get("config", {}).get("tokenize", dataclasses.asdict(cfg.tokenize)),
        "chat": stage.get("config", {}).get("chat", dataclasses.asdict(cfg.chat)),
        "plan": plan.get("plan", dataclasses.asdict(cfg.plan)),
        "write": write.get("write", dataclasses.asdict(cfg.write)),
    }
    return dataclasses.replace(
        cfg,
        read=ReadConfig(**values["read"]),
        tokenize=TokenizeConfig(**values["tokenize"]),
        plan=PlanConfig(**values["plan"]),
        write=WriteConfig(**values["write"]),
        chat=ChatConfig(**values["chat"]),
    )
