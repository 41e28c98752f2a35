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
from packcli.config import build_config, load_yaml
from packcli.errors import PackcliError

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

    return wrapper


def _special(value: str | None) -> str | int | None:
    if value is None:
        return None
    return int(value) if value.isdigit() else value


@app.command(
    epilog=(
        "Examples:\n\n"
        "  packcli pack 'corpus/*.jsonl.zst' --tokenizer path/to/tokenizer.json --out out/\n\n"
        "  packcli pack data/ --tokenizer meta-llama/Llama-3.1-8B --out out/ --overlong drop\n\n"
        "  packcli pack a.jsonl b.jsonl.gz -t tok/ -o out/ --config configs/pretrain.yaml "
        "--short-len 2048 --long-len 32768"
    )
)
@_errors_to_exit
def pack(
    inputs: Annotated[
        list[str], typer.Argument(help="jsonl / jsonl.gz / jsonl.zst files, folders or globs.")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Output dataset folder.")],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", "-t", help="tokenizer.json, a folder holding one, or a Hub id."
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config; flags override it.")
    ] = None,
    text_field: Annotated[
        str | None, typer.Option(help="JSON field holding the text [default: text].")
    ] = None,
    eos: Annotated[
        str | None,
        typer.Option(help="EOS appended to every document: token, id, auto or none [auto]."),
    ] = None,
    bos: Annotated[
        str | None,
        typer.Option(help="BOS prepended to every document: token, id, auto or none [none]."),
    ] = None,
    short_len: Annotated[
        int | None, typer.Option(help="Short-pack capacity in tokens [4096].")
    ] = None,
    long_len: Annotated[
        int | None, typer.Option(help="Long-row capacity in tokens [131072].")
    ] = None,
    overlong: Annotated[
        str | None,
        typer.Option(help="Documents longer than --long-len: split, truncate or drop [split]."),
    ] = None,
    algorithm: Annotated[
        str | None, typer.Option(help="Bin packing: bfd, ffd or wrapped [bfd].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for the row shuffle [0].")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Documents per tokenizer batch [1024].")
    ] = None,
    work_dir: Annotated[
        str | None, typer.Option(help="Folder for tokenized shards [OUT/.packcli].")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Allow writing into a non-empty folder that is not ours.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON instead of a table.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Read, tokenize, two-tier pack and write a Hugging Face dataset to OUT."""
    from packcli.pipeline import run_pack
    from packcli.report import format_report

    file_values: dict[str, Any] = load_yaml(config) if config else {}
    cfg = build_config(
        file_values,
        {
            "run": {"out": out, "work_dir": work_dir},
            "read": {"inputs": tuple(inputs), "text_field": text_field, "batch_size": batch_size},
            "tokenize": {"tokenizer": tokenizer, "eos": _special(eos), "bos": _special(bos)},
            "plan": {
                "short_len": short_len,
                "long_len": long_len,
                "overlong": overlong,
                "algorithm": algorithm,
                "seed": seed,
            },
        },
        source=str(config) if config else "options",
    )
    command = "packcli " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result = run_pack(cfg, quiet=quiet, overwrite=overwrite, command=command)
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
    typer.echo(f"wrote     {out}  (load with datasets.load_dataset({out!r}, 'long'))")


@app.command(
    epilog="Examples:\n\n  packcli verify out/\n\n  packcli verify out/ --no-shards --json"
)
@_errors_to_exit
def verify(
    out: Annotated[Path, typer.Argument(help="Output folder written by packcli pack.")],
    shards: Annotated[
        bool,
        typer.Option(help="Also check every token against the tokenized shards when present."),
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Check every packing invariant of OUT; exit 1 with a precise message on the first failure."""
    from packcli.verify import verify_output

    summary = verify_output(out, use_shards=shards)
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


def main() -> None:
    app()
