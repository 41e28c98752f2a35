"""Splitting stages into independent tasks for cluster batch jobs.

A stage that touches data runs as ``num_tasks`` independent tasks; task ``i`` does a
deterministic share, so any scheduler (a Slurm array, Ray, a shell loop) can run them in any
order or in parallel and the output is byte-identical to a single process: tokenize tasks
split the input *files* (each file is tokenized into its own shards, and global document ids
are assigned later from the files' order and document counts), write tasks split the output
*Parquet files*.
"""

from __future__ import annotations

import os

from packcli.errors import ConfigError


def slurm_task() -> tuple[int, int] | None:
    """``(task_index, num_tasks)`` from Slurm's array variables, when running in an array."""
    task_id = os.environ.get("SLURM_ARRAY_TASK_ID")
    count = os.environ.get("SLURM_ARRAY_TASK_COUNT")
    if task_id is None or count is None:
        return None
    first = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
    return int(task_id) - first, int(count)


def resolve_task(task_index: int | None, num_tasks: int | None) -> tuple[int, int]:
    """Explicit flags win; else Slurm's array variables; else a single task."""
    if task_index is None and num_tasks is None:
        slurm = slurm_task()
        if slurm is not None:
            task_index, num_tasks = slurm
    task_index = 0 if task_index is None else task_index
    num_tasks = 1 if num_tasks is None else num_tasks
    if num_tasks < 1 or not 0 <= task_index < num_tasks:
        raise ConfigError(
            f"--task-index must be in 0..{num_tasks - 1} and --num-tasks >= 1, "
            f"got task {task_index} of {num_tasks}"
        )
    return task_index, num_tasks


def assign_by_size(sizes: list[int], num_tasks: int) -> list[int]:
    """Task of each item: largest first onto the least loaded task (ties: lowest index).

    Balances bytes across tasks (longest-processing-time rule) and depends only on the sizes
    and ``num_tasks``, so every task computes the same assignment independently.
    """
    load = [0] * num_tasks
    task = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        t = min(range(num_tasks), key=lambda t: (load[t], t))
        task[i] = t
        load[t] += sizes[i]
    return task
