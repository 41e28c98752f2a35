"""The commands that read a finished output: ``verify``, ``stats`` and ``inspect``.

The work is in ``packcli.publish.verify``, ``packcli.publish.stats`` and
``packcli.publish.rowview`` (no CLI code there), imported inside the commands (every command
imports this module: ``rowview`` and ``stats`` cost ~35 ms that ``pack`` does not need).
(Not named ``inspect.py``: inside the package that would still read as the standard library.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from packcli.errors import ConfigError
from packcli.names import PREVIEW_CHARS

VERIFY_EPILOG = (
    "Examples:\n\n  packcli verify out/\n\n  packcli verify out/ --no-shards --json\n\n"
    "  packcli verify s3://bucket/packed/\n\n"
    "  packcli verify s3://bucket/packed/ --executor ray --ray-address auto"
)
STATS_EPILOG = (
    "Examples:\n\n  packcli stats out/\n\n  packcli stats out/ --json --no-plots\n\n"
    "  packcli stats s3://bucket/packed/"
)
# A finished output, read by stats and inspect: a folder, or its URL (downloaded to a temp
# folder, as verify and push do).
OutSpec = Annotated[
    str,
    typer.Argument(help="Output folder written by packcli pack, or its s3:// (fsspec) URL."),
]
INSPECT_EPILOG = (
    "Examples:\n\n"
    "  packcli inspect out/ --row 0\n\n"
    "  packcli inspect out/ --config short --row 17 --json\n\n"
    "  packcli inspect out/ --row 3 --tokenizer path/to/tokenizer.json\n\n"
    "  packcli inspect s3://bucket/packed/ --row 0\n\n"
    "  packcli inspect out/ --doc 1234"
)


def verify_command(
    out: Annotated[
        str,
        typer.Argument(help="Output folder written by packcli pack, or its s3:// (fsspec) URL."),
    ],
    shards: Annotated[
        bool,
        typer.Option(help="Also check every token against the tokenized shards when present."),
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    executor: Annotated[
        str, typer.Option(help="Run the part checks here (local) or on Ray (ray).")
    ] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Existing Ray cluster [start a local one].")
    ] = None,
    num_tasks: Annotated[
        int | None, typer.Option(help="Check tasks [1 local; Ray: cluster CPUs; at most parts].")
    ] = None,
) -> None:
    """Check every packing invariant of OUT; exit 1 with a precise message on the first failure.

    The checks run part by part of the plan (a group of shards, or the tail) as tasks, each
    reading only its files and shards; an output on object storage is read file by file."""
    from packcli.fs import is_url, local_path, redact
    from packcli.publish.marker import TierCounts
    from packcli.publish.verify import verify_folder, verify_remote
    from packcli.stages.executors import Executor

    if num_tasks is not None and num_tasks < 1:
        raise ConfigError(f"--num-tasks must be >= 1, got {num_tasks}")
    run = Executor(executor, ray_address)
    if is_url(out):
        summary = verify_remote(out, use_shards=shards, executor=run, num_tasks=num_tasks)
        shown = redact(out).rstrip("/")
    else:
        folder = Path(local_path(out))
        summary = verify_folder(folder, use_shards=shards, executor=run, num_tasks=num_tasks)
        shown = local_path(out)
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
        return
    for name, s in summary["configs"].items():
        c = TierCounts.from_json(s, "packcli verify", prefix=f"configs.{name}.")
        typer.echo(
            f"{name:<6} {c.rows:>10,} rows {c.tokens:>15,} tokens {c.segments:>12,} segments"
        )
    shards_state = summary["shards"]
    if summary["checked_against_shards"]:
        against = "and against the tokenized shards"
    elif not shards:
        against = "(tokenized shards skipped on request, --no-shards: token identity checked "
        against += "between configs only)"
    else:
        against = "(tokenized shards not present: token identity checked between configs only)"
    typer.echo(f"OK: all invariants hold {against}")
    typer.echo(f"    output {shown}; tokenized shards {shards_state}")
    typer.echo(f"    {len(summary['figures_checked'])} figures of packcli.json match the data")
    typer.echo(f"    checked as {summary['parts']} part(s) in {summary['tasks']} task(s)")
    recheck = summary["checked_against_input"]
    if "checked" in recheck:
        typer.echo(f"    {recheck['checked']} input documents encoded again match the output")
    else:
        typer.echo(f"    input documents not encoded again: {recheck['skipped']}")


def stats_command(
    out: OutSpec,
    json_out: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
    plots: Annotated[
        bool,
        typer.Option(
            "--plots/--no-plots",
            help="Write PNG plots to OUT/stats/ (needs pip install 'packcli[stats]'; not for "
            "a URL, which stats only reads).",
        ),
    ] = True,
) -> None:
    """Row fill, document lengths, documents per row and attention cost of OUT, with plots."""
    from packcli.fs import is_url, redact
    from packcli.publish.remote import local_output
    from packcli.publish.stats import compute_stats, render_tables, write_plots

    remote = is_url(out)
    with local_output(out, card=False, plots=False) as folder:
        numbers, tiers = compute_stats(folder)
        # An output on the store is only read: its plots and card stay as they are.
        numbers["plots"] = write_plots(folder, tiers, numbers) if plots and not remote else []
    if numbers["plots"]:
        from packcli.publish.card import refresh_card  # the card embeds the new plots

        refresh_card(folder)
    if json_out:
        typer.echo(json.dumps(numbers, indent=2))
        return
    tables = render_tables(numbers)
    from rich.console import Console  # render_tables checked that rich is installed

    console = Console()
    for table in tables:
        console.print(table)
    if numbers["plots"]:
        console.print(f"plots: {', '.join(str(folder / p) for p in numbers['plots'])}")
    elif remote and plots:
        console.print(
            f"plots: not written for {redact(out)} (stats only reads an output on object "
            "storage); run packcli stats on a local copy for them"
        )


def inspect_command(
    out: OutSpec,
    row: Annotated[
        int | None, typer.Option("--row", "-r", help="Row index within the config, from 0.")
    ] = None,
    config: Annotated[str, typer.Option(help="Dataset config: long or short.")] = "long",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", "-t", help="Tokenizer to decode with [the one in packcli.json]."
        ),
    ] = None,
    chars: Annotated[
        int, typer.Option(help="Characters of text shown on each side of a boundary.")
    ] = PREVIEW_CHARS,
    doc: Annotated[
        int | None,
        typer.Option("--doc", help="Instead of a row: the source file and line of this doc id."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the row as JSON.")] = False,
) -> None:
    """Show one row of OUT: segments, doc ids, offsets, no-loss spans and boundary text; or
    with --doc, where a document came from (file and line)."""
    from packcli.fs import is_url
    from packcli.publish.remote import local_output
    from packcli.publish.rowview import inspect_row, locate_doc, locate_row, render_row
    from packcli.publish.stats import read_meta

    if (row is None) == (doc is None):
        raise ConfigError("pass one of --row ROW or --doc DOC_ID")
    if chars < 0:
        raise ConfigError(f"--chars must be >= 0, got {chars}")
    if doc is not None:
        if is_url(out):
            raise ConfigError("--doc reads the run's work folder: pass a local output folder")
        found = locate_doc(Path(out), doc)
        if json_out:
            typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
        else:
            at = f"line {found['line']}" if "line" in found else f"row {found['row']}"
            typer.echo(f"doc {doc}: {found['file']} {at}")
        return
    assert row is not None
    wanted = None
    if is_url(out):  # fetch only the Parquet file that holds the row
        with local_output(out, card=False, plots=False, data=lambda rel: False) as folder:
            file, _ = locate_row(read_meta(folder), config, row)
        wanted = f"data/{config}/{file}"
    with local_output(out, card=False, plots=False, data=lambda rel: rel == wanted) as folder:
        view = inspect_row(folder, config, row, tokenizer=tokenizer, chars=chars)
    if json_out:
        # json escapes C0 controls itself; C1 (U+0080-U+009F) too, so no raw CSI reaches a
        # terminal.
        text = json.dumps(view, indent=2, ensure_ascii=False)
        typer.echo("".join(f"\\u{ord(c):04x}" if 0x80 <= ord(c) < 0xA0 else c for c in text))
        return
    renderables = render_row(view)
    from rich.console import Console  # render_row checked that rich is installed

    console = Console()
    for r in renderables:
        console.print(r)
