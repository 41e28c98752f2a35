"""``packcli pack``: every stage in one command, tokenize and write as tasks on an executor
(this process or Ray), plan and finalize here, under locks on the output and work folders."""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from packcli import jit
from packcli.config import RunConfig
from packcli.process_exit import park
from packcli.stages.executors import Executor
from packcli.stages.finalize import finalize_stage
from packcli.stages.lock import hold
from packcli.stages.plan import plan_stage
from packcli.stages.prepare import Prepared, prepare_tokenize
from packcli.stages.tokenize import release_free_memory, tokenize_task
from packcli.stages.work import check_output, claim_output, require_out
from packcli.stages.workstore import in_mirror
from packcli.stages.write import write_stage, write_tail, write_task
from packcli.tokenize.encode import StageTimes

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    report: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    reused_tokens: bool = False
    # Busy seconds inside the tokenize stage (read, encode, assemble, write, wait).
    tokenize_times: dict[str, float] = field(default_factory=dict)


@in_mirror
def run_pack(
    cfg: RunConfig,
    *,
    quiet: bool = False,
    overwrite: bool = False,
    command: str = "",
    executor: Executor | None = None,
    num_tasks: int | None = None,
) -> RunResult:
    """The whole job from one command: tokenize and write as ``num_tasks`` tasks each on the
    executor (one in-process task by default), plan and finalize in this process.

    Everything a user can get wrong is checked before any file is touched, and the output and
    work folders are locked for the whole job (a second run on either fails at once)."""
    out = require_out(cfg)
    check_output(cfg, overwrite)
    # Held by the list alone, so the tokenize stage can drop it (see _run_locked).
    prepared = [prepare_tokenize(cfg)]
    executor = executor or Executor("local")
    warming = _warm_kernels(prepared[0], executor)
    try:
        claim_output(cfg)
        with hold(out, cfg.work_path):
            return _run_locked(cfg, prepared, quiet, command, executor, num_tasks)
    finally:
        if warming is not None:
            warming.join()


# Inputs at least this large get the plan's and the writer's kernels compiled (loaded from
# numba's cache) in the background while tokenizing: ~1 s of CPU that otherwise sat between
# the tokenize and the plan stage, in the seconds where the main thread only waits (for the
# fast tokenizer's tables, then for the tokenizer). Below it the plan has fewer documents
# than ``jit.SMALL_WORK`` (at up to ~1.6 KB a document) and runs as plain Python anyway.
WARM_BYTES = 16 << 20
WARM_MODULES = (
    "packcli.pack.binpack",
    "packcli.pack.refine",
    "packcli.pack.plan",
    "packcli.write",
)


def _warm_kernels(prepared: Prepared, executor: Executor) -> threading.Thread | None:
    """Start warming the kernels when this process will plan and write a large input."""
    if executor.kind != "local" or prepared.input_bytes < WARM_BYTES:
        return None
    return jit.warm(WARM_MODULES)


def _run_locked(
    cfg: RunConfig,
    held: list[Prepared],
    quiet: bool,
    command: str,
    executor: Executor,
    num_tasks: int | None,
) -> RunResult:
    n = num_tasks or executor.default_tasks()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # In this process the tokenizer is already loaded; Ray tasks load their own.
    prepared = held.pop()
    small = prepared.input_bytes < WARM_BYTES
    task = functools.partial(tokenize_task, prepared=prepared)
    del prepared
    reused = all(
        executor.map(task if executor.kind == "local" else tokenize_task, (cfg,), n, quiet=quiet)
    )
    # The tokenizers (~0.3 GB for a 128k vocabulary: HF's and the fast backend's tables) go
    # now: the plan and the write stage need neither, and peaked with both held. A small
    # input's plan and write need little memory: where the process ends without teardown,
    # its tokenizers stay to the end instead of costing ~0.05 s to free.
    parked = small and park(task)
    del task
    if not parked:
        release_free_memory()
    timings["tokenize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # Ray plans the groups on the cluster; in this process they are planned one by one.
    run_tasks = None
    if executor.kind != "local":
        run_tasks = functools.partial(executor.map, args=(cfg,), num_tasks=n, quiet=quiet)
    plan, shards = plan_stage(cfg, quiet=quiet, run_tasks=run_tasks)
    timings["plan"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if executor.kind == "local" and n == 1:
        write_task(cfg, plan, shards, quiet=quiet)  # reuse the plan already in memory
    else:
        executor.map(write_stage, (cfg,), n, quiet=quiet)
        write_tail(cfg, plan, shards, quiet=quiet)  # from the groups' tail shards
    timings["write"] = time.perf_counter() - t0
    report = finalize_stage(cfg, command=command, plan=plan)  # at the plan's step
    return RunResult(
        report=report,
        timings=timings,
        reused_tokens=reused,
        tokenize_times=StageTimes.ordered(shards.success.times),
    )
