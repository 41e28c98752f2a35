"""Run the real CLI for end-to-end tests (one helper for every test module): in-process
(``invoke``), or as a process of its own that a test can kill (``run_process``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from typer.testing import CliRunner

from packcli.cli import app
from packcli.tokenize.shards import sha256_file

runner = CliRunner()

# ``python -c TINY_SPANS ARGS``: ``packcli ARGS`` with spans of any size allowed (real runs
# refuse spans under 1 MiB), so a small corpus is read as several byte spans.
TINY_SPANS = (
    "import sys, packcli.config as c; c.MIN_SPLIT_BYTES = 1; from packcli.cli import main; main()"
)


def invoke(*args: object) -> tuple[int, str]:
    """Exit code and output; an exception that is not a clean exit is re-raised."""
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def invoke_ok(*args: object) -> str:
    """Output of a command that must succeed."""
    code, output = invoke(*args)
    assert code == 0, output
    return output


def run_process(
    args: Sequence[object],
    *,
    env: Mapping[str, str] | None = None,
    crash: str | None = None,
    entry: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``packcli ARGS`` as a process of its own, so it can be SIGKILLed mid-run: at the point
    ``crash`` names (``PACKCLI_CRASH_AT``; never one inherited from the caller's environment),
    with ``env`` over this process's environment. ``entry``: Python code run instead of
    ``-m packcli`` (one that patches a constant first, e.g. ``TINY_SPANS``)."""
    full = {**os.environ, **(env or {})}
    full.pop("PACKCLI_CRASH_AT", None)
    if crash:
        full["PACKCLI_CRASH_AT"] = crash
    start = ["-c", entry] if entry is not None else ["-m", "packcli"]
    cmd = [sys.executable, *start, *map(str, args)]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)


def run_pack(
    corpus: Path, tok: Path, out: Path, cfg: Path, crash: str | None = None, spans: bool = False
) -> subprocess.CompletedProcess[str]:
    """``packcli -v pack CORPUS -t TOK -o OUT -c CFG -q`` as a process (``run_process``);
    ``spans``: with spans of any size (``TINY_SPANS``)."""
    args = ["-v", "pack", corpus, "-t", tok, "-o", out, "-c", cfg, "-q"]
    return run_process(args, crash=crash, entry=TINY_SPANS if spans else None)


def data_hashes(out: Path) -> dict[str, str]:
    """The sha256 of each Parquet file under ``out``, by its path there: two outputs with
    equal hashes have the same bytes."""
    return {str(p.relative_to(out)): sha256_file(p) for p in sorted(out.rglob("*.parquet"))}
