"""The flags that set config values: one frozen dataclass per config section, each field a
flag declared once, beside its name, with its spelling and help.

A command takes a section's flags as one typed parameter (``plan: PlanFlags``) and
``packcli.cli.options.grouped`` spreads the fields into the options typer reads, in the order
written here (so ``--help`` lists a command's flags section by section, as a config file is
laid out). Field names are the section's keys (a test checks), so ``--short-len`` travels as
``PlanFlags.short_len`` into ``RunFlags.plan`` and from there, by ``config_from_flags`` (the one
step from typed flags to names: the YAML file merges by key), to ``PlanConfig.short_len``,
which the planner reads.

A field defaults to None ("not given"): the YAML file (``--config``) or the config
dataclass default applies, so typer cannot show the default; the help says it in brackets,
read from the config dataclasses (and ``CHAT_DEFAULTS`` where chat and preference differ), so
the help cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from packcli.config import (
    AUTO_FILES,
    CHAT_DEFAULTS,
    ChatConfig,
    PlanConfig,
    ReadConfig,
    RunConfig,
    SourceConfig,
    TokenizeConfig,
    WriteConfig,
    build_config,
    load_yaml,
)

_CHAT_EOS = CHAT_DEFAULTS["tokenize"]["eos"]
_CHAT_OVERLONG = CHAT_DEFAULTS["plan"]["overlong"]


@dataclass(frozen=True)
class ReadFlags:
    """Section ``read``: what the documents are and how the input is read."""

    text_field: Annotated[
        str | None,
        typer.Option(
            help=f"JSON field (Parquet/Arrow: column) holding the text [{ReadConfig.text_field}]."
        ),
    ] = None
    batch_size: Annotated[
        int | None, typer.Option(help=f"Documents per tokenizer batch [{ReadConfig.batch_size}].")
    ] = None
    on_bad_line: Annotated[
        str | None,
        typer.Option(
            help="Bad input lines: error (stop at file:line) or skip (quarantine) "
            f"[{ReadConfig.on_bad_line}]."
        ),
    ] = None
    split_bytes: Annotated[
        int | None,
        typer.Option(
            help="Tokenize uncompressed files larger than this as byte spans, one unit of work "
            "each (0 = never, else at least 1 MiB) [1 GiB]."
        ),
    ] = None
    input_format: Annotated[
        str | None,
        typer.Option(
            help="auto (by file name; save_to_disk folders), jsonl, parquet, arrow, hf-disk or "
            f"hub (every input is a Hub dataset id) [{ReadConfig.input_format}]."
        ),
    ] = None


@dataclass(frozen=True)
class TokenizeFlags:
    """Section ``tokenize``: the tokenizer, the special tokens around a document, the backend."""

    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", "-t", help="tokenizer.json, its folder, or a Hub repo id."),
    ] = None
    eos: Annotated[
        str | None,
        typer.Option(
            help="EOS appended to every document: token, id, auto or none "
            f"[{TokenizeConfig.eos}; chat and preference: {_CHAT_EOS}]."
        ),
    ] = None
    bos: Annotated[
        str | None,
        typer.Option(
            help=f"BOS prepended to every document: token, id, auto or none [{TokenizeConfig.bos}]."
        ),
    ] = None
    backend: Annotated[
        str | None,
        typer.Option(
            "--tokenizer-backend",
            help="auto: the fastest of fastokens, gigatoken that reproduces HF ids on a "
            "sample, else hf; or name one (tiktoken = fastokens) "
            f"[{TokenizeConfig.backend}].",
        ),
    ] = None
    num_proc: Annotated[
        int | None,
        typer.Option(
            help="Threads per process for tokenizing and for writing output files, and chat "
            f"template rendering workers (0 = all cores) [{TokenizeConfig.num_proc}]."
        ),
    ] = None
    special_in_text: Annotated[
        str | None,
        typer.Option(
            help="Special-token strings inside documents (e.g. <|endoftext|> in scraped text): "
            "encoded as plain text, or as the special tokens (special) "
            f"[{TokenizeConfig.special_in_text}]."
        ),
    ] = None


@dataclass(frozen=True)
class ChatFlags:
    """Section ``chat``: what a record is (text, dialogue, preference pair) and its loss."""

    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="text (pretraining), chat (SFT dialogues) or preference (DPO pairs: prompt, "
            f"chosen, rejected) [{ChatConfig.format}].",
        ),
    ] = None
    messages_field: Annotated[
        str | None,
        typer.Option(
            help=f"Chat: JSON field (column) holding the messages [{ChatConfig.messages_field}]."
        ),
    ] = None
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="Chat: template file or built-in name (chatml) [the tokenizer's own template]."
        ),
    ] = None
    train_on: Annotated[
        str | None,
        typer.Option(
            help="Chat: loss on assistant turns, the last one, or all tokens "
            f"[{ChatConfig.train_on}]."
        ),
    ] = None


@dataclass(frozen=True)
class PlanFlags:
    """Section ``plan``: the two tiers' sizes and how documents are packed into them."""

    short_len: Annotated[
        int | None, typer.Option(help=f"Short-pack capacity in tokens [{PlanConfig.short_len}].")
    ] = None
    long_len: Annotated[
        int | None,
        typer.Option(help=f"Long-row capacity in tokens, at most 2**24 [{PlanConfig.long_len}]."),
    ] = None
    overlong: Annotated[
        str | None,
        typer.Option(
            help="Documents longer than --long-len: split, truncate or drop "
            f"[{PlanConfig.overlong}; chat and preference: {_CHAT_OVERLONG}]."
        ),
    ] = None
    algorithm: Annotated[
        str | None,
        typer.Option(help=f"Bin packing: bfd, ffd or wrapped [{PlanConfig.algorithm}]."),
    ] = None
    seed: Annotated[
        int | None, typer.Option(help=f"Seed for the row shuffle [{PlanConfig.seed}].")
    ] = None
    balance: Annotated[
        str | None,
        typer.Option(
            help="attention: move long documents out of the costliest long rows "
            f"[{PlanConfig.balance}]."
        ),
    ] = None
    group_tokens: Annotated[
        int | None,
        typer.Option(
            help="Tokens per group of token shards planned and written on its own (a write "
            f"task reads only its groups' shards) [{PlanConfig.group_tokens}]."
        ),
    ] = None
    cp_size: Annotated[
        int | None,
        typer.Option(
            help="Context-parallel size C: pad every segment to a multiple of 2*C (masked from "
            "loss and attention; Transformer Engine THD with CP needs it) "
            f"[{PlanConfig.cp_size}: no padding]."
        ),
    ] = None
    tokens_per_step: Annotated[
        int | None,
        typer.Option(
            help="Real tokens per optimizer step: a mixture's rows are ordered so every step "
            "holds each source near its share; the report's step plan aims at it (rows a "
            f"step, steps an epoch) [{PlanConfig.tokens_per_step:,}]."
        ),
    ] = None


@dataclass(frozen=True)
class WriteFlags:
    """Section ``write``: how the output Parquet files are cut (when planning)."""

    min_files: Annotated[
        int | None,
        typer.Option(
            help="Files per config at least, e.g. one per streaming dataloader worker [up to "
            f"{AUTO_FILES}, one per {WriteConfig.row_group_tokens:,} tokens]."
        ),
    ] = None
    cost_model: Annotated[
        str | None,
        typer.Option(
            help="Add a per-row `cost` column (training compute: per token plus per squared "
            "segment length, causal flash) by this model: llama-1b, llama-8b, llama-70b or a "
            "transformers config.json [none: no column]."
        ),
    ] = None


@dataclass(frozen=True)
class SourceFlags:
    """What the tokenize stage reads and how, for ``pack`` and ``tokenize``: the inputs (the
    ``read`` section's ``inputs``, given as arguments) and three sections' flags."""

    inputs: Annotated[
        list[str] | None,
        typer.Argument(
            help="jsonl / jsonl.gz / jsonl.zst, Parquet or Arrow files, folders (also "
            "save_to_disk ones) or globs, local or as fsspec URLs (s3://, gs://, hf://...); "
            "hf-dataset:OWNER/NAME[@REV][/PATH] for a Hub dataset. Leave out with --source "
            "or a config's sources:."
        ),
    ] = None
    sources: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="A mixture's source, NAME:WEIGHT=INPUT[,INPUT...] (repeat per source): WEIGHT "
            "an epoch multiplier (2, 0.5) or a target share of output tokens (30%); per-source "
            "EOS/BOS, text field and overlong policy go in a config's sources: (README "
            "'Mixtures'). Replaces the config's sources.",
        ),
    ] = None
    read: ReadFlags = ReadFlags()
    tokenize: TokenizeFlags = TokenizeFlags()
    chat: ChatFlags = ChatFlags()


@dataclass(frozen=True)
class RunFlags:
    """What one command's flags set (a command without a stage's flags leaves them out)."""

    out: str
    work_dir: str | None = None
    source: SourceFlags | None = None
    plan: PlanFlags = PlanFlags()
    write: WriteFlags = WriteFlags()


def special_token(value: str | None) -> str | int | None:
    """``--eos``/``--bos``: a token id when all digits, else a token string or a keyword (a
    YAML file says which it means by its type; a flag has only text)."""
    if value is None:
        return None
    return int(value) if value.isdigit() else value


def config_from_flags(config_file: Path | None, flags: RunFlags) -> RunConfig:
    """The run config of a command: ``config_file`` (YAML) with the given flags winning."""
    file_values: dict[str, Any] = load_yaml(config_file) if config_file else {}
    sections: dict[str, Any] = {  # section name -> its values; "sources" -> SourceConfigs
        "plan": dataclasses.asdict(flags.plan),
        "write": dataclasses.asdict(flags.write),
    }
    source = flags.source
    if source is not None:
        tokenize = source.tokenize
        sections["read"] = {**dataclasses.asdict(source.read), "inputs": source.inputs or None}
        if source.sources:
            sections["sources"] = [SourceConfig.parse(s) for s in source.sources]
        sections["tokenize"] = {
            **dataclasses.asdict(tokenize),
            "eos": special_token(tokenize.eos),
            "bos": special_token(tokenize.bos),
        }
        sections["chat"] = dataclasses.asdict(source.chat)
    return build_config(
        file_values,
        {"run": {"out": flags.out, "work_dir": flags.work_dir}, **sections},
        source=str(config_file) if config_file else "options",
    )
