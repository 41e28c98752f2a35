"""The commands that make an output: ``pack`` (all stages) and its four stages, ``tokenize``,
``plan``, ``write`` and ``finalize``, each one task of a cluster job.

A command takes a config section's flags as one typed value (``packcli.cli.flags``); they
become a ``RunFlags`` and then the ``RunConfig`` (``config_from_flags``); e.g. ``--short-len``
travels as ``PlanFlags.short_len`` to ``PlanConfig.short_len``, which the planner reads.
Heavy modules (the pipeline, numpy, pyarrow) are imported inside the commands so ``packcli
--help`` stays fast.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from packcli.cli.flags import PlanFlags, RunFlags, SourceFlags, WriteFlags, config_from_flags
from packcli.cli.options import (
    ConfigFile,
    NumTasks,
    Out,
    Quiet,
    TaskIndex,
    TokensPerStep,
    WorkDir,
)
from packcli.config import RunConfig
from packcli.errors import ConfigError
from packcli.stages.tasks import resolve_task

if TYPE_CHECKING:
    from packcli.stages.run import RunResult

PACK_EPILOG = (
    "Examples:\n\n"
    "  packcli pack 'corpus/*.jsonl.zst' --tokenizer path/to/tokenizer.json --out out/\n\n"
    "  packcli pack data/ --tokenizer meta-llama/Llama-3.1-8B --out out/ --overlong drop\n\n"
    "  packcli pack a.jsonl b.jsonl.gz -t tok/ -o out/ --config configs/pretrain.yaml "
    "--short-len 2048 --long-len 32768\n\n"
    "  packcli pack 'shards/*.parquet' -t tok/ -o out/ --text-field content\n\n"
    "  packcli pack hf-dataset:HuggingFaceFW/fineweb-edu/sample/10BT -t tok/ -o out/\n\n"
    "  packcli pack 's3://bucket/corpus/*.jsonl.zst' -t tok/ -o s3://bucket/packed/"
)
TOKENIZE_EPILOG = (
    "Examples (a Slurm array sets the task flags itself):\n\n"
    "  packcli tokenize 'corpus/*.jsonl.zst' -t tok.json -o out/ --task-index 3 "
    "--num-tasks 16\n\n"
    "  bash scripts/slurm/pack.sh  # the four stages as Slurm jobs: scripts/slurm/README.md"
)
PLAN_EPILOG = "Examples:\n\n  packcli plan -o out/ --short-len 4096 --long-len 131072"
WRITE_EPILOG = "Examples:\n\n  packcli write -o out/ --task-index 0 --num-tasks 8"
FINALIZE_EPILOG = "Examples:\n\n  packcli finalize -o out/ && packcli verify out/"


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")
    return value


def _command() -> str:
    from packcli.fs import redact_text

    # Recorded in packcli.json: a URL's embedded secret (if any) must not be.
    return redact_text("packcli " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


def pack_command(
    *,
    out: Out,
    config: ConfigFile = None,
    source: SourceFlags,
    plan: PlanFlags = PlanFlags(),
    write: WriteFlags = WriteFlags(),
    work_dir: WorkDir = None,
    overwrite: Annotated[
        bool, typer.Option(help="Allow writing into a non-empty folder that is not ours.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON instead of a table.")
    ] = False,
    executor: Annotated[
        str, typer.Option(help="Run tokenize/write tasks here (local) or on Ray (ray).")
    ] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Existing Ray cluster [start a local one].")
    ] = None,
    num_tasks: Annotated[
        int | None, typer.Option(help="Tokenize/write tasks [1 local; Ray: cluster CPUs].")
    ] = None,
    dp_size: Annotated[
        int | None,
        typer.Option(
            help="Report: the simulated idle GPU share at this many data-parallel ranks, rows "
            "in the output's order against PackedDistributedSampler's schedule (as packcli "
            "stats computes it)."
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Read, tokenize, two-tier pack and write a Hugging Face dataset to OUT (all stages)."""
    from packcli.stages.executors import Executor
    from packcli.stages.run import run_pack

    flags = RunFlags(out=out, work_dir=work_dir, source=source, plan=plan, write=write)
    cfg = config_from_flags(config, flags)
    result = run_pack(
        cfg,
        quiet=quiet,
        overwrite=overwrite,
        command=_command(),
        executor=Executor(executor, ray_address),
        num_tasks=None if num_tasks is None else _positive(num_tasks, "--num-tasks"),
    )
    schedule = None
    if dp_size is not None:
        from packcli.publish.stats import schedule_report

        # From the rows written, not stored in packcli.json: the schedule is the training
        # job's choice, and every figure there is one verify derives again.
        schedule = schedule_report(cfg.out_path, (_positive(dp_size, "--dp-size"),))
    if (mix := result.report.get("mixture")) is not None:
        from packcli.publish.report import mixture_warnings

        for line in mixture_warnings(mix):  # on stderr, so --json's stdout stays JSON
            typer.echo(line, err=True)
    if json_out:
        report = result.report if schedule is None else {**result.report, "schedule": schedule}
        typer.echo(json.dumps(report, indent=2))
        return
    _echo_pack_result(cfg, result, schedule)


def _echo_pack_result(
    cfg: RunConfig, result: RunResult, schedule: dict[str, Any] | None = None
) -> None:
    """The report table (with ``--dp-size``, the simulated idle share), the time each stage
    took and how to load the output."""
    from packcli.publish.report import format_report

    typer.echo(format_report(result.report))
    if schedule is not None:
        from packcli.publish.stats import format_schedule

        typer.echo("\n".join(format_schedule(schedule)))
    t = result.timings
    reused = " (reused tokenized shards)" if result.reused_tokens else ""
    typer.echo(
        f"\ntime      tokenize {t['tokenize']:.1f}s{reused}, plan {t['plan']:.2f}s, "
        f"write {t['write']:.1f}s"
    )
    if result.tokenize_times and not result.reused_tokens:
        busy = ", ".join(f"{k} {v:.1f}s" for k, v in result.tokenize_times.items())
        busy = busy.replace("wait", "idle waiting for the tokenizer")
        typer.echo(f"          tokenize busy: {busy} (threads overlap)")
    out = cfg.out
    if cfg.remote_out:
        from packcli.fs import redact

        url = redact(out).rstrip("/")
        typer.echo(
            f"wrote     {url}  (load with datasets.load_dataset('parquet', "
            f"data_files='{url}/data/long/*.parquet', split='train'))"
        )
        return
    typer.echo(f"wrote     {out}  (load with datasets.load_dataset({out!r}, 'long'))")


def tokenize_command(
    *,
    out: Out,
    config: ConfigFile = None,
    source: SourceFlags,
    work_dir: WorkDir = None,
    task_index: TaskIndex = None,
    num_tasks: NumTasks = None,
    quiet: Quiet = False,
) -> None:
    """Stage 1 of 4: tokenize this task's share of the input files into shards."""
    from packcli.stages.lock import hold
    from packcli.stages.prepare import prepare_tokenize
    from packcli.stages.tokenize import tokenize_task
    from packcli.stages.work import check_output, claim_output

    flags = RunFlags(out=out, work_dir=work_dir, source=source)
    cfg = config_from_flags(config, flags)
    index, count = resolve_task(task_index, num_tasks)
    check_output(cfg)
    prepared = prepare_tokenize(cfg)
    claim_output(cfg)
    # Tasks of this stage run side by side by design: a shared lock, and one for this task.
    with hold(cfg.out_path, cfg.work_path, shared=True, task=("tokenize", index)):
        reused = tokenize_task(
            cfg, task_index=index, num_tasks=count, quiet=quiet, prepared=prepared
        )
    typer.echo(f"tokenize task {index} of {count} done" + (" (reused)" if reused else ""))


def plan_command(
    out: Out,
    config: ConfigFile = None,
    plan: PlanFlags = PlanFlags(),
    write: WriteFlags = WriteFlags(),
    work_dir: WorkDir = None,
    task_index: TaskIndex = None,
    num_tasks: NumTasks = None,
    quiet: Quiet = False,
) -> None:
    """Stage 2 of 4: the plan over all documents' lengths, group by group of shards, then the
    tail. With --task-index/--num-tasks (given explicitly), only that task's groups; a plain
    `packcli plan` afterwards reuses them and plans the tail."""
    from packcli.stages.lock import hold
    from packcli.stages.plan import plan_stage, plan_task

    flags = RunFlags(out=out, work_dir=work_dir, plan=plan, write=write)
    cfg = config_from_flags(config, flags)
    if task_index is not None or num_tasks is not None:
        index, count = resolve_task(task_index, num_tasks)
        with hold(cfg.out_path, cfg.work_path, shared=True, task=("plan", index)):
            plan_task(cfg, task_index=index, num_tasks=count, quiet=quiet)
        typer.echo(f"plan task {index} of {count} done")
        return
    with hold(cfg.out_path, cfg.work_path):
        planned, _ = plan_stage(cfg, quiet=quiet)
    capacity = {"short": cfg.plan.short_len, "long": cfg.plan.long_len}
    for name in ("short", "long"):
        rows = sum(p.rows[name] for p in planned.parts)
        tokens = sum(p.tokens[name] for p in planned.parts)
        bound = -(-tokens // capacity[name])
        ratio = rows / bound if bound else 1.0
        typer.echo(f"{name:<6}{rows:>12,} rows  {ratio:.5f}x lower bound")


def write_command(
    out: Out,
    config: ConfigFile = None,
    work_dir: WorkDir = None,
    task_index: TaskIndex = None,
    num_tasks: NumTasks = None,
    quiet: Quiet = False,
) -> None:
    """Stage 3 of 4: write this task's share of the Parquet files from the saved plan."""
    from packcli.stages.lock import hold
    from packcli.stages.work import check_output
    from packcli.stages.write import write_stage

    cfg = config_from_flags(config, RunFlags(out=out, work_dir=work_dir))
    index, count = resolve_task(task_index, num_tasks)
    check_output(cfg)
    with hold(cfg.out_path, cfg.work_path, shared=True, task=("write", index)):
        write_stage(cfg, task_index=index, num_tasks=count, quiet=quiet)
    typer.echo(f"write task {index} of {count} done")


def finalize_command(
    out: Out,
    work_dir: WorkDir = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    tokens_per_step: TokensPerStep = None,
) -> None:
    """Stage 4 of 4: check all files are written; write the dataset card and packcli.json."""
    from packcli.publish.report import format_report
    from packcli.stages.finalize import finalize_stage
    from packcli.stages.lock import hold
    from packcli.stages.work import check_output

    cfg = config_from_flags(None, RunFlags(out=out, work_dir=work_dir))
    check_output(cfg)
    with hold(cfg.out_path, cfg.work_path):
        report = finalize_stage(
            cfg,
            command=_command(),
            tokens_per_step=(
                None if tokens_per_step is None else _positive(tokens_per_step, "--tokens-per-step")
            ),
        )
    typer.echo(json.dumps(report, indent=2) if json_out else format_report(report))
