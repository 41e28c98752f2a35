"""Run the real CLI in-process for end-to-end tests (one helper for every test module)."""

from __future__ import annotations

from typer.testing import CliRunner

from packcli.cli import app

runner = CliRunner()


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
