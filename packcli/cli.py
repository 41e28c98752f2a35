"""The ``packcli`` command line: a thin layer over ``pipeline`` and ``verify``.

One place (``main``) maps ``PackcliError`` to a one-line message and exit status 1; usage
errors exit with 2 (typer's convention); success is 0.
"""

from __future__ import annotations

import functools
import json
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from packcli import __version__
from packcli.config import RunConfig, build_config, load_yaml
from packcli.errors import ConfigError, PackcliError
from packcli.tasks import resolve_task

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Pack jsonl corpora into two-tier packed Hugging Face datasets with segment columns.",
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def _errors_to_exit(func: Callable[..., None]) -> Callable[..., None]:
    """The one place user-facing errors become a message on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            func(*args, **kwargs)
        except PackcliError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:  # full disk, permissions, read-only file systems
            where = f" {exc.filename}" if exc.filename else ""
            typer.echo(
                f"error: cannot access{where}: {exc.strerror or exc}; nothing was marked "
                "complete, rerun the same command to resume once this is fixed",
                err=True,
            )
            raise typer.Exit(1) from None

    return wrapper


def _special(value: str | None) -> str | int | None:
    if value is None:
        return None
    return int(value) if value.isdigit() else value


# Options shared by several commands, declared once.
Inputs = Annotated[
    list[str],
    typer.Argument(
        help="jsonl / jsonl.gz / jsonl.zst, Parquet or Arrow files, folders (also "
        "save_to_disk ones) or globs, local or as fsspec URLs (s3://, gs://, hf://...); "
        "hf-dataset:OWNER/NAME[@REV][/PATH] for a Hub dataset."
    ),
]
Out = Annotated[
    str,
    typer.Option(
        "--out",
        "-o",
        help="Output dataset folder, or a URL (s3://, gs://, hf://...): made in a local "
        "folder (--work-dir, else a cache folder named after the URL), each file uploaded "
        "whole when final, packcli.json last.",
    ),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option("--tokenizer", "-t", help="tokenizer.json, its folder, or a Hub repo id."),
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config; flags override it.")
]
TextField = Annotated[
    str | None, typer.Option(help="JSON field (Parquet/Arrow: column) holding the text [text].")
]
Eos = Annotated[
    str | None,
    typer.Option(help="EOS appended to every document: token, id, auto or none [auto]."),
]
Bos = Annotated[
    str | None,
    typer.Option(help="BOS prepended to every document: token, id, auto or none [none]."),
]
ShortLen = Annotated[int | None, typer.Option(help="Short-pack capacity in tokens [4096].")]
LongLen = Annotated[
    int | None, typer.Option(help="Long-row capacity in tokens, at most 2**24 [131072].")
]
Overlong = Annotated[
    str | None,
    typer.Option(help="Documents longer than --long-len: split, truncate or drop [split]."),
]
Algorithm = Annotated[str | None, typer.Option(help="Bin packing: bfd, ffd or wrapped [bfd].")]
Seed = Annotated[int | None, typer.Option(help="Seed for the row shuffle [0].")]
Balance = Annotated[
    str | None,
    typer.Option(help="attention: move long documents out of the costliest long rows [none]."),
]
BatchSize = Annotated[int | None, typer.Option(help="Documents per tokenizer batch [1024].")]
NumProc = Annotated[
    int | None,
    typer.Option(
        help="Threads per process for tokenizing and for writing output files, and chat "
        "template rendering workers (0 = all cores) [0]."
    ),
]
Backend = Annotated[
    str | None,
    typer.Option(
        "--tokenizer-backend",
        help="auto: the fastest of fastokens, gigatoken that reproduces HF ids on a sample, "
        "else hf; or name one (tiktoken = fastokens) [auto].",
    ),
]
SpecialInText = Annotated[
    str | None,
    typer.Option(
        help="Special-token strings inside documents (e.g. <|endoftext|> in scraped text): "
        "encoded as plain text, or as the special tokens (special) [text]."
    ),
]
WorkDir = Annotated[
    str | None,
    typer.Option(
        help="Work folder for shards and plan [OUT/.packcli]; with a URL --out, the local "
        "folder the output is made in [~/.cache/packcli/outputs/NAME-HASH]."
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
TokensPerStep = Annotated[
    int,
    typer.Option(
        help="Report: the step plan's target of tokens per optimizer step (rows a step, steps "
        "an epoch, the unpacked batch size with the same documents a step)."
    ),
]
OnBadLine = Annotated[
    str | None,
    typer.Option(help="Bad input lines: error (stop at file:line) or skip (quarantine) [error]."),
]
InputFormat = Annotated[
    str | None,
    typer.Option(
        help="auto (by file name; save_to_disk folders), jsonl, parquet, arrow, hf-disk or "
        "hub (every input is a Hub dataset id) [auto]."
    ),
]
SplitBytes = Annotated[
    int | None,
    typer.Option(
        help="Tokenize uncompressed files larger than this as byte spans, one unit of work "
        "each (0 = never, else at least 1 MiB) [1 GiB]."
    ),
]
Format = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="text (pretraining), chat (SFT dialogues) or preference (DPO pairs: prompt, "
        "chosen, rejected) [text].",
    ),
]
MessagesField = Annotated[
    str | None, typer.Option(help="Chat: JSON field (column) holding the messages [messages].")
]
ChatTemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Chat: template file or built-in name (chatml) [the tokenizer's own template]."
    ),
]
TrainOn = Annotated[
    str | None,
    typer.Option(help="Chat: loss on assistant turns, the last one, or all tokens [assistant]."),
]
TaskIndex = Annotated[
    int | None,
    typer.Option(help="This task's index, 0-based [SLURM_ARRAY_TASK_ID, else 0]."),
]
NumTasks = Annotated[
    int | None, typer.Option(help="Number of tasks [SLURM_ARRAY_TASK_COUNT, else 1].")
]


def _config(config: Path | None, **sections: dict[str, Any]) -> RunConfig:
    file_values: dict[str, Any] = load_yaml(config) if config else {}
    return build_config(file_values, sections, source=str(config) if config else "options")


def _tokenize_sections(flags: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The read, chat and tokenize sections from the flags ``pack`` and ``tokenize`` share
    (their parameters have the same names; pass the command's ``locals()``)."""
    return {
        "read": {
            "inputs": tuple(flags["inputs"]),
            "text_field": flags["text_field"],
            "batch_size": flags["batch_size"],
            "on_bad_line": flags["on_bad_line"],
            "split_bytes": flags["split_bytes"],
            "input_format": flags["input_format"],
        },
        "chat": {
            "format": flags["format_"],
            "messages_field": flags["messages_field"],
            "chat_template": flags["chat_template"],
            "train_on": flags["train_on"],
        },
        "tokenize": {
            "tokenizer": flags["tokenizer"],
            "eos": _special(flags["eos"]),
            "bos": _special(flags["bos"]),
            "backend": flags["tokenizer_backend"],
            "num_proc": flags["num_proc"],
            "special_in_text": flags["special_in_text"],
        },
    }


def _plan_section(
    short_len: int | None,
    long_len: int | None,
    overlong: str | None,
    algorithm: str | None,
    seed: int | None,
    balance: str | None,
) -> dict[str, Any]:
    return {
        "short_len": short_len,
        "long_len": long_len,
        "overlong": overlong,
        "algorithm": algorithm,
        "seed": seed,
        "balance": balance,
    }


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")
    return value


def _command() -> str:
    from packcli.fs import redact_text

    # Recorded in packcli.json: a URL's embedded secret (if any) must not be.
    return redact_text("packcli " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


@app.command(
    epilog=(
        "Examples:\n\n"
        "  packcli pack 'corpus/*.jsonl.zst' --tokenizer path/to/tokenizer.json --out out/\n\n"
        "  packcli pack data/ --tokenizer meta-llama/Llama-3.1-8B --out out/ --overlong drop\n\n"
        "  packcli pack a.jsonl b.jsonl.gz -t tok/ -o out/ --config configs/pretrain.yaml "
        "--short-len 2048 --long-len 32768\n\n"
        "  packcli pack 'shards/*.parquet' -t tok/ -o out/ --text-field content\n\n"
        "  packcli pack hf-dataset:HuggingFaceFW/fineweb-edu/sample/10BT -t tok/ -o out/\n\n"
        "  packcli pack 's3://bucket/corpus/*.jsonl.zst' -t tok/ -o s3://bucket/packed/"
    )
)
@_errors_to_exit
def pack(
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
    tokens_per_step: TokensPerStep = 1 << 20,
    quiet: Quiet = False,
) -> None:
    """Read, tokenize, two-tier pack and write a Hugging Face dataset to OUT (all stages)."""
    from packcli.executors import Executor
    from packcli.pipeline import run_pack
    from packcli.report import format_report

    cfg = _config(
        config,
        run={"out": out, "work_dir": work_dir},
        **_tokenize_sections(locals()),
        plan=_plan_section(short_len, long_len, overlong, algorithm, seed, balance),
    )
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
    if cfg.remote_out:
        from packcli.fs import redact

        url = redact(out).rstrip("/")
        typer.echo(
            f"wrote     {url}  (load with datasets.load_dataset('parquet', "
            f"data_files='{url}/data/long/*.parquet', split='train'))"
        )
        return
    typer.echo(f"wrote     {out}  (load with datasets.load_dataset({out!r}, 'long'))")


@app.command(
    epilog=(
        "Examples (a Slurm array sets the task flags itself):\n\n"
        "  packcli tokenize 'corpus/*.jsonl.zst' -t tok.json -o out/ --task-index 3 "
        "--num-tasks 16\n\n"
        "  sbatch --array=0-15 scripts/slurm/tokenize.sbatch"
    )
)
@_errors_to_exit
def tokenize(
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
    from packcli.lock import hold
    from packcli.pipeline import check_output, claim_output, prepare_tokenize, tokenize_task

    cfg = _config(
        config,
        run={"out": out, "work_dir": work_dir},
        **_tokenize_sections(locals()),
    )
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


@app.command(epilog="Examples:\n\n  packcli plan -o out/ --short-len 4096 --long-len 131072")
@_errors_to_exit
def plan(
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
    from packcli.lock import hold
    from packcli.pipeline import plan_stage
    from packcli.plan import tier_summary

    cfg = _config(
        config,
        run={"out": out, "work_dir": work_dir},
        plan=_plan_section(short_len, long_len, overlong, algorithm, seed, balance),
    )
    with hold(cfg.out_path, cfg.work_path):
        planned, _ = plan_stage(cfg, quiet=quiet)
    for name in ("short", "long"):
        t = tier_summary(getattr(planned, name))
        typer.echo(f"{name:<6}{t['rows']:>12,} rows  {t['rows_over_bound']:.5f}x lower bound")


@app.command(epilog="Examples:\n\n  packcli write -o out/ --task-index 0 --num-tasks 8")
@_errors_to_exit
def write(
    out: Out,
    config: ConfigFile = None,
    work_dir: WorkDir = None,
    task_index: TaskIndex = None,
    num_tasks: NumTasks = None,
    quiet: Quiet = False,
) -> None:
    """Stage 3 of 4: write this task's share of the Parquet files from the saved plan."""
    from packcli.lock import hold
    from packcli.pipeline import check_output, write_stage

    cfg = _config(config, run={"out": out, "work_dir": work_dir})
    index, count = resolve_task(task_index, num_tasks)
    check_output(cfg)
    with hold(cfg.out_path, cfg.work_path, shared=True, task=("write", index)):
        write_stage(cfg, task_index=index, num_tasks=count, quiet=quiet)
    typer.echo(f"write task {index} of {count} done")


@app.command(epilog="Examples:\n\n  packcli finalize -o out/ && packcli verify out/")
@_errors_to_exit
def finalize(
    out: Out,
    work_dir: WorkDir = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    tokens_per_step: TokensPerStep = 1 << 20,
) -> None:
    """Stage 4 of 4: check all files are written; write the dataset card and packcli.json."""
    from packcli.lock import hold
    from packcli.pipeline import check_output, finalize_stage
    from packcli.report import format_report

    cfg = _config(None, run={"out": out, "work_dir": work_dir})
    check_output(cfg)
    with hold(cfg.out_path, cfg.work_path):
        report = finalize_stage(
            cfg,
            command=_command(),
            tokens_per_step=_positive(tokens_per_step, "--tokens-per-step"),
        )
    typer.echo(json.dumps(report, indent=2) if json_out else format_report(report))


@app.command(
    epilog="Examples:\n\n  packcli verify out/\n\n  packcli verify out/ --no-shards --json\n\n"
    "  packcli verify s3://bucket/packed/"
)
@_errors_to_exit
def verify(
    out: Annotated[
        str,
        typer.Argument(help="Output folder written by packcli pack, or its s3:// (fsspec) URL."),
    ],
    shards: Annotated[
        bool,
        typer.Option(help="Also check every token against the tokenized shards when present."),
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Check every packing invariant of OUT; exit 1 with a precise message on the first failure."""
    from packcli.fs import is_url, local_path
    from packcli.verify import verify_output, verify_remote

    if is_url(out):
        summary = verify_remote(out, use_shards=shards)
    else:
        summary = verify_output(Path(local_path(out)), use_shards=shards)
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
        return
    for name, s in summary["configs"].items():
        typer.echo(
            f"{name:<6} {s['rows']:>10,} rows {s['tokens']:>15,} tokens "
            f"{s['segments']:>12,} segments"
        )
    against = (
        "and against the tokenized shards"
        if summary["checked_against_shards"]
        else ("(tokenized shards not present: token identity checked between configs only)")
    )
    typer.echo(f"OK: all invariants hold {against}")
    recheck = summary["checked_against_input"]
    if "checked" in recheck:
        typer.echo(f"    {recheck['checked']} input documents encoded again match the output")
    else:
        typer.echo(f"    input documents not encoded again: {recheck['skipped']}")


def _register_tools() -> None:
    from packcli.publish import PUSH_EPILOG, push_command
    from packcli.rowview import INSPECT_EPILOG, inspect_command
    from packcli.stats import STATS_EPILOG, stats_command

    app.command("push", epilog=PUSH_EPILOG)(_errors_to_exit(push_command))
    app.command("stats", epilog=STATS_EPILOG)(_errors_to_exit(stats_command))
    app.command("inspect", epilog=INSPECT_EPILOG)(_errors_to_exit(inspect_command))


_register_tools()


def main() -> None:
    app()
