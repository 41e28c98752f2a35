"""``packcli export``: the typer face of ``packcli.export`` (which holds no CLI code)."""

from __future__ import annotations

from typing import Annotated

import typer

from packcli.cli.options import Quiet

EXPORT_EPILOG = (
    "Examples:\n\n"
    "  packcli export out/ --to megatron\n\n"
    "  packcli export out/ --to olmo --dest /data/olmo/my-corpus\n\n"
    "  packcli export out/ --to megatron-bridge --config long\n\n"
    "  packcli export s3://bucket/out --to olmo\n\n"
    "  packcli export s3://bucket/out --to megatron-bridge --dest /data/bridge\n\n"
    "megatron and olmo take whole documents from the pack's tokenized shards (its work "
    "folder must be there); megatron-bridge takes the packed rows of data/long and "
    "data/short. OUT and --dest may be URLs (s3://, gs://, ...): a pack on the store is "
    "read one file at a time, an export to the store is made part by part in a local "
    "staging folder and put (a URL OUT's export goes to OUT/export/TO on the store unless "
    "--dest says otherwise). A rerun skips the files already complete."
)


def export_command(
    out: Annotated[
        str, typer.Argument(help="Output folder or URL written by packcli pack (its --out).")
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="megatron (.bin/.idx, text packs), olmo (token memmaps, document "
            "boundaries, label masks for chat) or megatron-bridge (packed Parquet).",
        ),
    ],
    dest: Annotated[
        str | None,
        typer.Option(help="Folder or URL to write the export to [OUT/export/TO]."),
    ] = None,
    config: Annotated[
        str,
        typer.Option(help="megatron-bridge: which packed rows, long, short or both."),
    ] = "both",
    work_dir: Annotated[
        str | None,
        typer.Option(
            "--work-dir",
            help="For a URL OUT packed with a local --work-dir: that folder (the tokenized "
            "shards are there) [the cache folder pack staged the URL in]. A work folder on "
            "the store is found through OUT's packcli.json.",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Write a finished pack in another training stack's format, without tokenizing again."""
    from packcli.export import export_pack

    result = export_pack(out, to, dest, config=config, work_dir=work_dir, quiet=quiet)
    m = result.marker
    typer.echo(
        f"exported  {m['documents']:,} {'segments' if to == 'megatron-bridge' else 'documents'}"
        f", {m['tokens']:,} tokens to {result.dest} ({result.written} part(s) written, "
        f"{result.reused} already complete)"
    )
