"""The commands that make an output: ``pack`` (all stages) and its four stages, ``tokenize``,
``plan``, ``write`` and ``finalize``, each one task of a cluster job.

Flags become a ``RunFlags`` (typed, one dataclass per config section) and then the
``RunConfig`` (``packcli.config.config_from_flags``); e.g. ``--short-len`` travels as
``PlanFlags.short_len`` to ``PlanConfig.short_len``, which the planner reads. Heavy modules
(the pipeline, numpy, pyarrow) are imported inside the commands so ``packcli --help`` stays
fast.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from packcli.cli.options import (
    Algorithm,
    Backend,
    Balance,
    BatchSize,
    Bos,
    ChatTemplateOpt,
    ConfigFile,
    Eos,
    Format,
    InputFormat,
    Inputs,
    LongLen,
    MessagesField,
    NumProc,
    NumTasks,
    OnBadLine,
    Out,
    Overlong,
    Quiet,
    Seed,
    ShortLen,
    SpecialInText,
    SplitBytes,
    TaskIndex,
    TextField,
    TokenizerOpt,
    TokensPerStep,
    TrainOn,
    WorkDir,
)
from packcli.config import (
    TOKENS_PER_STEP,
    ChatFlags,
    PlanFlags,
    ReadFlags,
    RunConfig,
    RunFlags,
    TokenizeFlags,
    config_from_flags,
)
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
    "  sbatch --array=0-15 scripts/slurm/tokenize.sbatch"
)
PLAN_EPILOG = "Examples:\n\n  packcli plan -o out/ --short-len 4096 --long-len 131072"
WRITE_EPILOG = "Examples:\n\n  packcli write -o out/ --task-index 0 --num-tasks 8"
FINALIZE_EPILOG = "Examples:\n\n  packcli finalize -o out/ && packcli verify out/"


def _special(value: str | None) -> str | int | None:
    """``--eos``/``--bos``: a token id when all digits, else a token string or a keyword."""
    if value is None:
        return None
    return int(value) if value.isdigit() else value


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")
    return value


def _command() -> str:
    from packcli.fs import redact_text

    # Recorded in packcli.json: a URL's embedded secret (if any) must not be.
    return redact_text("packcli " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


def _source_flags(
    out: str,
    work_dir: str | None,
    *,
    inputs: list[str],
    tokenizer: str | None,
    text_field: str | None,
    eos: str | None,
    bos: str | None,
    batch_size: int | None,
    tokenizer_backend: str | None,
    num_proc: int | None,
    special_in_text: str | None,
    on_bad_line: str | None,
    split_bytes: int | None,
    input_format: str | None,
    format_: str | None,
    messages_field: str | None,
    chat_template: str | None,
    train_on: str | None,
    plan: PlanFlags | None = None,
) -> RunFlags:
    """The read, tokenize and chat flags that ``pack`` and ``tokenize`` share, by section."""
    return RunFlags(
        out=out,
        work_dir=work_dir,
        read=ReadFlags(
            inputs=tuple(inputs),
            text_field=text_field,
            batch_size=batch_size,
            on_bad_line=on_bad_line,
            split_bytes=split_bytes,
            input_format=input_format,
        ),
        tokenize=TokenizeFlags(
            tokenizer=tokenizer,
            eos=_special(eos),
            bos=_special(bos),
            backend=tokenizer_backend,
            num_proc=num_proc,
            special_in_text=special_in_text,
        ),
        chat=ChatFlags(
            format=format_,
            messages_field=messages_field,
            chat_template=chat_template,
            train_on=train_on,
        ),
        plan=plan or PlanFlags(),
    )


# Long by its signature and the typed hand-off of each flag (one line each); the work is
# run_pack's, the printing _echo_pack_result's.
def pack_command(
    inputs: Inputs,
    out: Out,
    tokenizer: TokenizerOpt = None,
    config: ConfigFile = None,
    text_field: TextField = None,
    eos: Eos = None,
    bos: Bos = None,
    short_len: ShortLen = None,
    long_len: LongLen = None,
    overlong: Overlong = None,
    algorithm: Algorithm = None,
    seed: Seed = None,
    balance: Balance = None,
    batch_size: BatchSize = None,
    tokenizer_backend: Backend = None,
    num_proc: NumProc = None,
    special_in_text: SpecialInText = None,
    on_bad_line: OnBadLine = None,
    split_bytes: SplitBytes = None,
    input_format: InputFormat = None,
    format_: Format = None,
    messages_field: MessagesField = None,
    chat_template: ChatTemplateOpt = None,
    train_on: TrainOn = None,
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
    tokens_per_step: TokensPerStep = TOKENS_PER_STEP,
    quiet: Quiet = False,
) -> None:
    """Read, tokenize, two-tier pack and write a Hugging Face dataset to OUT (all stages)."""
    from packcli.stages.executors import Executor
    from packcli.stages.run import run_pack

    plan = PlanFlags(
        short_len=short_len,
        long_len=long_len,
        overlong=overlong,
        algorithm=algorithm,
        seed=seed,
        balance=balance,
    )
    flags = _source_flags(
        out,
        work_dir,
        inputs=inputs,
        tokenizer=tokenizer,
        text_field=text_field,
        eos=eos,
        bos=bos,
        batch_size=batch_size,
        tokenizer_backend=tokenizer_backend,
        num_proc=num_proc,
        special_in_text=special_in_text,
        on_bad_line=on_bad_line,
        split_bytes=split_bytes,
        input_format=input_format,
        format_=format_,
        messages_field=messages_field,
        chat_template=chat_template,
        train_on=train_on,
        plan=plan,
    )
    cfg = config_from_flags(config, flags)
    result = run_pack(
        cfg,
        quiet=quiet,
        overwrite=overwrite,
        command=_command(),
        executor=Executor(executor, ray_address),
        num_tasks=None if num_tasks is None else _positive(num_tasks, "--num-tasks"),
        tokens_per_step=_positive(tokens_per_step, "--tokens-per-step"),
    )
    if json_out:
        typer.echo(json.dumps(result.report, indent=2))
        return
    _echo_pack_result(cfg, result)


def _echo_pack_result(cfg: RunConfig, result: RunResult) -> None:
    """The report table, the time each stage took and how to load the output."""
    from packcli.report import format_report

    typer.echo(format_report(result.report))
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
    inputs: Inputs,
    out: Out,
    tokenizer: TokenizerOpt = None,
    config: ConfigFile = None,
    text_field: TextField = None,
    eos: Eos = None,
    bos: Bos = None,
    batch_size: BatchSize = None,
    tokenizer_backend: Backend = None,
    num_proc: NumProc = None,
    special_in_text: SpecialInText = None,
    on_bad_line: OnBadLine = None,
    split_bytes: SplitBytes = None,
    input_format: InputFormat = None,
    format_: Format = None,
    messages_field: MessagesField = None,
    chat_template: ChatTemplateOpt = None,
    train_on: TrainOn = None,
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

    flags = _source_flags(
        out,
        work_dir,
        inputs=inputs,
        tokenizer=tokenizer,
        text_field=text_field,
        eos=eos,
        bos=bos,
        batch_size=batch_size,
        tokenizer_backend=tokenizer_backend,
        num_proc=num_proc,
        special_in_text=special_in_text,
        on_bad_line=on_bad_line,
        split_bytes=split_bytes,
        input_format=input_format,
        format_=format_,
        messages_field=messages_field,
        chat_template=chat_template,
        train_on=train_on,
    )
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
    short_len: ShortLen = None,
    long_len: LongLen = None,
    overlong: Overlong = None,
    algorithm: Algorithm = None,
    seed: Seed = None,
    balance: Balance = None,
    work_dir: WorkDir = None,
    quiet: Quiet = False,
) -> None:
    """Stage 2 of 4: the global plan over all documents' lengths (one task)."""
    from packcli.plan import tier_summary
    from packcli.stages.lock import hold
    from packcli.stages.plan import plan_stage

    plan = PlanFlags(
        short_len=short_len,
        long_len=long_len,
        overlong=overlong,
        algorithm=algorithm,
        seed=seed,
        balance=balance,
    )
    cfg = config_from_flags(config, RunFlags(out=out, work_dir=work_dir, plan=plan))
    with hold(cfg.out_path, cfg.work_path):
        planned, _ = plan_stage(cfg, quiet=quiet)
    for name in ("short", "long"):
        t = tier_summary(getattr(planned, name))
        typer.echo(f"{name:<6}{t['rows']:>12,} rows  {t['rows_over_bound']:.5f}x lower bound")


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
    tokens_per_step: TokensPerStep = TOKENS_PER_STEP,
) -> None:
    """Stage 4 of 4: check all files are written; write the dataset card and packcli.json."""
    from packcli.report import format_report
    from packcli.stages.finalize import finalize_stage
    from packcli.stages.lock import hold
    from packcli.stages.work import check_output

    cfg = config_from_flags(None, RunFlags(out=out, work_dir=work_dir))
    check_output(cfg)
    with hold(cfg.out_path, cfg.work_path):
        report = finalize_stage(
            cfg,
            command=_command(),
            tokens_per_step=_positive(tokens_per_step, "--tokens-per-step"),
        )
    typer.echo(json.dumps(report, indent=2) if json_out else format_report(report))
