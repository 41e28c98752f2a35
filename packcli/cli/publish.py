"""``packcli push``: the typer face of ``packcli.publish.push`` (which holds no CLI code)."""

from __future__ import annotations

from typing import Annotated

import typer

PUSH_EPILOG = (
    "Examples:\n\n"
    "  packcli push out/ user/my-packed-corpus --dry-run\n\n"
    "  packcli push out/ user/my-packed-corpus --private\n\n"
    "  packcli push out/ org/corpus --revision v2\n\n"
    "  packcli push s3://bucket/packed/ user/my-packed-corpus"
)


def push_command(
    out: Annotated[
        str,
        typer.Argument(
            help="Output folder written by packcli pack, or its s3:// (any fsspec) URL."
        ),
    ],
    repo_id: Annotated[
        str, typer.Argument(help="Dataset repo on the Hub, e.g. user/name (created if missing).")
    ],
    private: Annotated[
        bool,
        typer.Option("--private", help="Create the repo private (an existing repo is unchanged)."),
    ] = False,
    revision: Annotated[
        str | None, typer.Option(help="Branch to push to, created if missing [main].")
    ] = None,
    prune: Annotated[
        bool,
        typer.Option(
            help="After the upload, delete data files and plots of an earlier push that OUT "
            "does not have (under data/long/, data/short/ and stats/ only)."
        ),
    ] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Verify and list what would be uploaded; no upload.")
    ] = False,
) -> None:
    """Verify OUT and upload it to a Hugging Face dataset repo; rerun to resume."""
    # Imported here: every command's module is loaded to build the CLI, and ``pack`` needs
    # none of the push side.
    from packcli.fs import is_url
    from packcli.publish.push import (
        check_repo_id,
        format_upload_list,
        load_call,
        prepare_push,
        push,
    )
    from packcli.publish.remote import local_output

    check_repo_id(repo_id)
    url = out if is_url(out) else None
    with local_output(out) as folder:
        if dry_run:
            files = prepare_push(folder, url)
            typer.echo(f"would upload to https://huggingface.co/datasets/{repo_id}:")
            typer.echo(format_upload_list(files))
            if prune:
                typer.echo(
                    "then delete files under data/long/, data/short/ and stats/ in the repo "
                    "that are not listed above (--no-prune keeps them)"
                )
            typer.echo(f"load with: {load_call(repo_id, revision=revision)}")
            return
        result = push(folder, repo_id, private=private, revision=revision, prune=prune, url=url)
    typer.echo(format_upload_list(result.files))
    if result.deleted:
        typer.echo(f"deleted {len(result.deleted)} stale files: {', '.join(result.deleted)}")
    typer.echo(f"pushed to {result.url}")
    typer.echo(f"load with: {load_call(result.repo_id, revision=revision)}")
