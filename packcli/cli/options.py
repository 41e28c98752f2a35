"""The options that several commands share, declared once as ``Annotated`` aliases.

A command lists ``name: Alias = default`` in its signature (huggingface_hub's CLI does the
same), so a flag's spelling and help live here once. Section options default to None ("not
given"): the YAML file (``--config``) or the config dataclass default applies, so their
defaults cannot be shown by typer; the help says them in brackets, read from the dataclasses
in ``packcli.config`` (and ``CHAT_DEFAULTS`` where chat and preference differ), so the help
cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from packcli.config import CHAT_DEFAULTS, ChatConfig, PlanConfig, ReadConfig, TokenizeConfig

_CHAT_EOS = CHAT_DEFAULTS["tokenize"]["eos"]
_CHAT_OVERLONG = CHAT_DEFAULTS["plan"]["overlong"]

# -- where the data is ------------------------------------------------------------------------
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

# -- read (ReadConfig) ------------------------------------------------------------------------
TextField = Annotated[
    str | None,
    typer.Option(
        help=f"JSON field (Parquet/Arrow: column) holding the text [{ReadConfig.text_field}]."
    ),
]
BatchSize = Annotated[
    int | None, typer.Option(help=f"Documents per tokenizer batch [{ReadConfig.batch_size}].")
]
OnBadLine = Annotated[
    str | None,
    typer.Option(
        help="Bad input lines: error (stop at file:line) or skip (quarantine) "
        f"[{ReadConfig.on_bad_line}]."
    ),
]
SplitBytes = Annotated[
    int | None,
    typer.Option(
        help="Tokenize uncompressed files larger than this as byte spans, one unit of work "
        "each (0 = never, else at least 1 MiB) [1 GiB]."
    ),
]
InputFormat = Annotated[
    str | None,
    typer.Option(
        help="auto (by file name; save_to_disk folders), jsonl, parquet, arrow, hf-disk or "
        f"hub (every input is a Hub dataset id) [{ReadConfig.input_format}]."
    ),
]

# -- tokenize (TokenizeConfig) ----------------------------------------------------------------
TokenizerOpt = Annotated[
    str | None,
    typer.Option("--tokenizer", "-t", help="tokenizer.json, its folder, or a Hub repo id."),
]
Eos = Annotated[
    str | None,
    typer.Option(
        help="EOS appended to every document: token, id, auto or none "
        f"[{TokenizeConfig.eos}; chat and preference: {_CHAT_EOS}]."
    ),
]
Bos = Annotated[
    str | None,
    typer.Option(
        help=f"BOS prepended to every document: token, id, auto or none [{TokenizeConfig.bos}]."
    ),
]
Backend = Annotated[
    str | None,
    typer.Option(
        "--tokenizer-backend",
        help="auto: the fastest of fastokens, gigatoken that reproduces HF ids on a sample, "
        f"else hf; or name one (tiktoken = fastokens) [{TokenizeConfig.backend}].",
    ),
]
NumProc = Annotated[
    int | None,
    typer.Option(
        help="Threads per process for tokenizing and for writing output files, and chat "
        f"template rendering workers (0 = all cores) [{TokenizeConfig.num_proc}]."
    ),
]
SpecialInText = Annotated[
    str | None,
    typer.Option(
        help="Special-token strings inside documents (e.g. <|endoftext|> in scraped text): "
        f"encoded as plain text, or as the special tokens (special) "
        f"[{TokenizeConfig.special_in_text}]."
    ),
]

# -- chat (ChatConfig) ------------------------------------------------------------------------
Format = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="text (pretraining), chat (SFT dialogues) or preference (DPO pairs: prompt, "
        f"chosen, rejected) [{ChatConfig.format}].",
    ),
]
MessagesField = Annotated[
    str | None,
    typer.Option(
        help=f"Chat: JSON field (column) holding the messages [{ChatConfig.messages_field}]."
    ),
]
ChatTemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Chat: template file or built-in name (chatml) [the tokenizer's own template]."
    ),
]
TrainOn = Annotated[
    str | None,
    typer.Option(
        help=f"Chat: loss on assistant turns, the last one, or all tokens [{ChatConfig.train_on}]."
    ),
]

# -- plan (PlanConfig) ------------------------------------------------------------------------
ShortLen = Annotated[
    int | None, typer.Option(help=f"Short-pack capacity in tokens [{PlanConfig.short_len}].")
]
LongLen = Annotated[
    int | None,
    typer.Option(help=f"Long-row capacity in tokens, at most 2**24 [{PlanConfig.long_len}]."),
]
Overlong = Annotated[
    str | None,
    typer.Option(
        help="Documents longer than --long-len: split, truncate or drop "
        f"[{PlanConfig.overlong}; chat and preference: {_CHAT_OVERLONG}]."
    ),
]
Algorithm = Annotated[
    str | None, typer.Option(help=f"Bin packing: bfd, ffd or wrapped [{PlanConfig.algorithm}].")
]
Seed = Annotated[int | None, typer.Option(help=f"Seed for the row shuffle [{PlanConfig.seed}].")]
Balance = Annotated[
    str | None,
    typer.Option(
        help="attention: move long documents out of the costliest long rows "
        f"[{PlanConfig.balance}]."
    ),
]

# -- tasks and output -------------------------------------------------------------------------
TaskIndex = Annotated[
    int | None,
    typer.Option(help="This task's index, 0-based [SLURM_ARRAY_TASK_ID, else 0]."),
]
NumTasks = Annotated[
    int | None, typer.Option(help="Number of tasks [SLURM_ARRAY_TASK_COUNT, else 1].")
]
TokensPerStep = Annotated[
    int,
    typer.Option(
        help="Report: the step plan's target of tokens per optimizer step (rows a step, steps "
        "an epoch, the unpacked batch size with the same documents a step)."
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


# -- groups: options several commands take together ---------------------------------------------


@dataclass(frozen=True)
class DocumentOptions:
    """What a document is: its text field and the special tokens around it."""

    text_field: TextField = None
    eos: Eos = None
    bos: Bos = None


@dataclass(frozen=True)
class EncodeOptions:
    """How the input is read and encoded (``pack`` and ``tokenize``)."""

    batch_size: BatchSize = None
    tokenizer_backend: Backend = None
    num_proc: NumProc = None
    special_in_text: SpecialInText = None
    on_bad_line: OnBadLine = None
    split_bytes: SplitBytes = None
    input_format: InputFormat = None
    format_: Format = None
    messages_field: MessagesField = None
    chat_template: ChatTemplateOpt = None
    train_on: TrainOn = None


@dataclass(frozen=True)
class PlanOptions:
    """The planner's settings (``pack`` and ``plan``)."""

    short_len: ShortLen = None
    long_len: LongLen = None
    overlong: Overlong = None
    algorithm: Algorithm = None
    seed: Seed = None
    balance: Balance = None


F = TypeVar("F", bound=Callable[..., Any])


def grouped(fn: F) -> F:
    """Let a command take option groups: each parameter annotated with one of the groups
    above stands, in the command's signature that typer reads, for the group's options in
    their order; the command receives the group as one typed value. So ``pack`` and
    ``tokenize`` (and ``pack`` and ``plan``) declare their shared options once, here, and
    keep their order in ``--help``."""
    hints = get_type_hints(fn, include_extras=True)
    groups = {
        name: hint
        for name, hint in hints.items()
        if dataclasses.is_dataclass(hint) and isinstance(hint, type)
    }
    spread: list[inspect.Parameter] = []
    for param in inspect.signature(fn).parameters.values():
        group = groups.get(param.name)
        if group is None:
            spread.append(param.replace(annotation=hints.get(param.name, param.annotation)))
            continue
        fields = get_type_hints(group, include_extras=True)
        spread += [
            inspect.Parameter(
                f.name, param.POSITIONAL_OR_KEYWORD, default=f.default, annotation=fields[f.name]
            )
            for f in dataclasses.fields(group)
        ]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        for name, group in groups.items():
            kwargs[name] = group(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(group)})
        return fn(**kwargs)

    command.__signature__ = inspect.Signature(spread)  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]
