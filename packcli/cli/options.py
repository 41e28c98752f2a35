"""The options that are not a config section's, declared once as ``Annotated`` aliases, and
``grouped``, which lets a command take a section's flags (``packcli.cli.flags``) as one value.

A command lists ``name: Alias = default`` in its signature (huggingface_hub's CLI does the
same), so a flag's spelling and help live here once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast, get_type_hints

import typer

# -- where the data is ------------------------------------------------------------------------
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
WorkDir = Annotated[
    str | None,
    typer.Option(
        help="Work folder for shards and plan [OUT/.packcli]; with a URL --out, the local "
        "folder the output is made in [~/.cache/packcli/outputs/NAME-HASH], or a URL: "
        "then every task reads and writes it on the store (machines that share no disk)."
    ),
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config; flags override it.")
]
# A finished output, read by stats and inspect.
OutFolder = Annotated[Path, typer.Argument(help="Output folder written by packcli pack.")]

# -- tasks and output -------------------------------------------------------------------------
TaskIndex = Annotated[
    int | None,
    typer.Option(help="This task's index, 0-based [SLURM_ARRAY_TASK_ID, else 0]."),
]
NumTasks = Annotated[
    int | None, typer.Option(help="Number of tasks [SLURM_ARRAY_TASK_COUNT, else 1].")
]
TokensPerStep = Annotated[
    int | None,
    typer.Option(
        help="Report: the step plan's target of tokens per optimizer step (rows a step, steps "
        "an epoch, the unpacked batch size with the same documents a step) [the plan's "
        "--tokens-per-step]."
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


# -- groups: a config section's flags as one parameter -----------------------------------------

F = TypeVar("F", bound=Callable[..., Any])
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _is_group(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _spread(name: str, hint: Any, default: Any) -> list[inspect.Parameter]:
    """The parameters typer reads for one of a command's parameters: itself, or a group's
    fields (a group's field may be a group), in their order. Keyword-only, so a required one
    (``inputs``) may follow one with a default."""
    if not _is_group(hint):
        return [inspect.Parameter(name, _KEYWORD, default=default, annotation=hint)]
    fields = get_type_hints(hint, include_extras=True)
    return [
        p
        for f in dataclasses.fields(hint)
        for p in _spread(
            f.name,
            fields[f.name],
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
        )
    ]


def _gather(group: type, kwargs: dict[str, Any]) -> Any:
    """The group's value from typer's keyword arguments (taking its fields out of them)."""
    fields = get_type_hints(group, include_extras=True)
    values = {}
    for f in dataclasses.fields(group):
        hint = fields[f.name]
        values[f.name] = _gather(hint, kwargs) if _is_group(hint) else kwargs.pop(f.name)
    return group(**values)


def grouped(fn: F) -> F:
    """Let a command take option groups: each parameter annotated with a dataclass (a section's
    flags, ``packcli.cli.flags``) stands, in the command's signature that typer reads, for the
    dataclass's fields in their order (a field that is a group in turn, as ``SourceFlags``'s
    sections); the command receives the group as one typed value. So
    ``pack``, ``tokenize`` and ``plan`` declare the flags they share once, and a flag reaches
    the config under its field's name."""
    hints = get_type_hints(fn, include_extras=True)
    params = inspect.signature(fn).parameters.values()
    groups = {p.name: hints[p.name] for p in params if _is_group(hints[p.name])}

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        for name, group in groups.items():
            kwargs[name] = _gather(group, kwargs)
        return fn(**kwargs)

    spread = [q for p in params for q in _spread(p.name, hints[p.name], p.default)]
    # What typer reads (``inspect.signature`` honours it); not an attribute of the function type.
    setattr(command, "__signature__", inspect.Signature(spread))  # noqa: B010
    return cast(F, command)  # called as ``fn`` is
