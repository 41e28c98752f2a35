"""Run configuration: one frozen dataclass per stage, combined into ``RunConfig``.

Values come from three layers, later ones winning: the dataclass defaults, a YAML file
(``configs/pretrain.yaml`` style, one mapping per stage), and CLI flags. Validation lives in
``__post_init__`` so a bad value fails before any work starts, with a message that says what
to change. The resolved config is echoed into ``packcli.json`` of every output, so a dataset
always says how it was made.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packcli.errors import ConfigError, require_one_of
from packcli.names import (
    BACKEND_ALIASES,
    BACKENDS,
    BAD_LINE_POLICIES,
    COMPRESSIONS,
    DATA_FORMATS,
    INPUT_FORMATS,
    OVERLONG_POLICIES,
    SPECIAL_IN_TEXT,
    TRAIN_ON,
    WORK_DIR,
    TrainOn,
    one_of,
)

# The plan's settings live beside the planner (packcli.pack must not import this YAML reader);
# re-exported here, where the other stages' settings are.
from packcli.pack.plan_config import MAX_LONG_LEN as MAX_LONG_LEN
from packcli.pack.plan_config import MAX_SEED as MAX_SEED
from packcli.pack.plan_config import TOKENS_PER_STEP as TOKENS_PER_STEP
from packcli.pack.plan_config import PlanConfig as PlanConfig

# Smaller byte spans only add per-unit overhead (a folder, records, threads): --split-bytes 1
# made 280k units of a 280 KB file (12 minutes, 3.3 GB of work folder).
MIN_SPLIT_BYTES = 1 << 20


@dataclass(frozen=True)
class ReadConfig:
    inputs: tuple[str, ...] = ()
    text_field: str = "text"
    batch_size: int = 1024
    # A batch also ends at this many bytes of jsonl (0 = no limit): bounds tokenize memory
    # when documents are huge (ids come back from the tokenizer as Python lists).
    batch_bytes: int = 32 << 20
    on_bad_line: str = "error"  # error | skip (quarantined in OUT/rejected.jsonl)
    # Uncompressed files larger than this are tokenized as byte spans of this size, each its
    # own unit of work (so tasks can share one huge file); 0 = never split. Output unchanged.
    split_bytes: int = 1 << 30
    # auto | jsonl | parquet | arrow | hf-disk | hub (packcli/read/columnar.py). Parquet and
    # Arrow files larger than split_bytes are split into row-group ranges the same way.
    input_format: str = "auto"

    def __post_init__(self) -> None:
        require_one_of("read.input_format", self.input_format, INPUT_FORMATS)
        if self.on_bad_line not in BAD_LINE_POLICIES:
            raise ConfigError(
                f"read.on_bad_line must be {one_of(BAD_LINE_POLICIES)}, got {self.on_bad_line!r}"
            )
        object.__setattr__(self, "inputs", tuple(str(i) for i in self.inputs))
        if not self.text_field:
            raise ConfigError("read.text_field must be a non-empty field name")
        if self.batch_size < 1:
            raise ConfigError(f"read.batch_size must be >= 1, got {self.batch_size}")
        if self.batch_bytes < 0:
            raise ConfigError(
                f"read.batch_bytes must be >= 0 (0 = no limit), got {self.batch_bytes}"
            )
        if self.split_bytes < 0 or 0 < self.split_bytes < MIN_SPLIT_BYTES:
            raise ConfigError(
                f"read.split_bytes must be 0 (never split) or at least {MIN_SPLIT_BYTES} "
                f"(1 MiB; smaller spans only add overhead), got {self.split_bytes}"
            )


@dataclass(frozen=True)
class TokenizeConfig:
    """``eos``/``bos``: a token string, an id, ``"auto"`` (detect) or ``"none"``."""

    tokenizer: str = ""
    eos: str | int = "auto"
    bos: str | int = "none"
    shard_tokens: int = 64 * 1024 * 1024
    backend: str = "auto"  # auto | hf | fastokens | gigatoken (see packcli/tokenize/backends.py)
    num_proc: int = 0  # tokenizer threads; 0 = all cores
    # Special-token strings inside documents: plain text (safe) or the special tokens (text
    # format only; chat templates write their markers, which must stay special).
    special_in_text: str = "text"

    @property
    def threads(self) -> int:
        return self.num_proc or os.cpu_count() or 1

    def __post_init__(self) -> None:
        if self.num_proc < 0:
            raise ConfigError(
                f"tokenize.num_proc must be >= 0 (0 = all cores), got {self.num_proc}"
            )
        if self.backend not in (*BACKENDS, *BACKEND_ALIASES):
            raise ConfigError(f"tokenize.backend must be {one_of(BACKENDS)}, got {self.backend!r}")
        if self.special_in_text not in SPECIAL_IN_TEXT:
            raise ConfigError(
                f"tokenize.special_in_text must be {one_of(SPECIAL_IN_TEXT)}, "
                f"got {self.special_in_text!r}"
            )
        if self.shard_tokens < 1024:
            raise ConfigError(f"tokenize.shard_tokens must be >= 1024, got {self.shard_tokens}")
        for name in ("eos", "bos"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ConfigError(f"tokenize.{name} must be a token string or an id, got {value!r}")
            if isinstance(value, int) and value < 0:
                raise ConfigError(f"tokenize.{name} id must be >= 0, got {value}")


# ``write.min_files`` unset: a config is cut into up to this many files, one per row group's
# tokens at most (so a config under one row group, 16M tokens by default, stays one file).
AUTO_FILES = 8


@dataclass(frozen=True)
class WriteConfig:
    shard_tokens: int = 256 * 1024 * 1024
    row_group_tokens: int = 16 * 1024 * 1024
    compression: str = "zstd"
    compression_level: int = 3
    # Files per config at least, so a streaming reader can give every dataloader worker files
    # of its own and the writer compresses a config on every core (``write.files_wanted``):
    # None cuts a config into up to AUTO_FILES files, one per row group of tokens; a number
    # asks for that many (at most one per row).
    min_files: int | None = None
    # Rows add a ``cost`` column by this cost model (``packcli.pack.schedule``): a preset's
    # name (llama-1b, llama-8b, llama-70b) or a transformers config.json. None: no column.
    cost_model: str | None = None

    def __post_init__(self) -> None:
        if self.cost_model is not None:
            from packcli.pack.schedule import resolve_cost_model  # numpy: only when asked

            try:
                resolve_cost_model(self.cost_model)
            except ValueError as exc:
                raise ConfigError(f"write.cost_model: {exc}") from None
        if self.shard_tokens < 1:
            raise ConfigError(f"write.shard_tokens must be >= 1, got {self.shard_tokens}")
        if self.min_files is not None and self.min_files < 1:
            raise ConfigError(f"write.min_files must be >= 1 (or null: auto), got {self.min_files}")
        if self.row_group_tokens < 1:
            raise ConfigError(f"write.row_group_tokens must be >= 1, got {self.row_group_tokens}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"write.compression must be {one_of(COMPRESSIONS)}, got {self.compression!r}"
            )


@dataclass(frozen=True)
class ChatConfig:
    """``format: chat`` reads one dialogue per line (``messages_field``), renders it with a
    chat template and trains only on ``train_on`` tokens (see ``packcli.chat``).
    ``format: preference`` reads one preference pair per line (TRL's ``prompt``/``chosen``/
    ``rejected``; see ``packcli.chat.preference``); ``messages_field`` and ``train_on`` do not
    apply to it."""

    format: str = "text"
    messages_field: str = "messages"
    chat_template: str | None = None
    train_on: TrainOn = "assistant"

    def __post_init__(self) -> None:
        require_one_of("chat.format", self.format, DATA_FORMATS)
        require_one_of("chat.train_on", self.train_on, TRAIN_ON)
        if not self.messages_field:
            raise ConfigError("chat.messages_field must be a non-empty field name")
        if self.format == "preference" and self.train_on != "assistant":
            raise ConfigError(
                f"chat.train_on {self.train_on!r} does not apply to preference pairs: their "
                "responses are trained and their prompts never; leave --train-on out"
            )

    @property
    def uses_template(self) -> bool:
        """Rendered with a chat template, with labels: ``chat`` and ``preference`` (they share
        the template, the defaults and the rule that a record is never split)."""
        return self.format in ("chat", "preference")

    @property
    def is_preference(self) -> bool:
        return self.format == "preference"


@dataclass(frozen=True)
class SourceConfig:
    """One source of a pretraining mixture (``sources:``, issue 26): its inputs (any input
    kind), its weight and its own settings, each ``None`` meaning the run's (``read``,
    ``tokenize``, ``plan`` sections).

    ``weight`` is an epoch multiplier: every document ``floor(weight)`` times plus a seeded
    subset of fraction ``weight - floor(weight)`` (``packcli.pack.mixture``); ``share`` is
    a target share of the output tokens instead (all sources then give one; they are
    normalized). Neither: weight 1."""

    name: str
    inputs: tuple[str, ...]
    weight: float | None = None
    share: float | None = None
    eos: str | int | None = None
    bos: str | int | None = None
    text_field: str | None = None
    overlong: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in ":=,"):
            raise ConfigError(f"a source needs a name (no ':', '=' or ','), got {self.name!r}")
        given: object = self.inputs  # YAML and callers may give one string
        if isinstance(given, str):
            object.__setattr__(self, "inputs", (given,))
        object.__setattr__(self, "inputs", tuple(str(i) for i in self.inputs))
        if not self.inputs:
            raise ConfigError(f"source {self.name}: give its inputs (files, folders, globs)")
        if self.weight is not None and self.share is not None:
            raise ConfigError(f"source {self.name}: give a weight or a share, not both")
        from packcli.pack.mixture import MAX_WEIGHT

        for key in ("weight", "share"):
            v = getattr(self, key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_WEIGHT:
                raise ConfigError(
                    f"source {self.name}: {key} must be a number in 0..{MAX_WEIGHT:g}, got {v!r}"
                )
            object.__setattr__(self, key, float(v))
        if self.overlong is not None:
            require_one_of(f"source {self.name}: overlong", self.overlong, OVERLONG_POLICIES)
        if self.text_field is not None and not self.text_field:
            raise ConfigError(f"source {self.name}: text_field must be a non-empty field name")
        for key in ("eos", "bos"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, str | int)):
                raise ConfigError(f"source {self.name}: {key} must be a token string or an id")

    @classmethod
    def parse(cls, spec: str) -> SourceConfig:
        """``--source NAME:WEIGHT=INPUT[,INPUT...]``: WEIGHT an epoch multiplier (``2``,
        ``0.5``) or a share with ``%`` (``30%``); ``NAME=INPUTS`` is weight 1."""
        head, sep, inputs = spec.partition("=")
        if not sep or not head or not inputs:
            raise ConfigError(
                f"--source {spec!r}: expected NAME:WEIGHT=INPUT[,INPUT...] (e.g. "
                "web:0.5=corpus/web/ or code:30%=code/*.jsonl)"
            )
        name, _, weight = head.partition(":")
        values: dict[str, Any] = {"name": name, "inputs": tuple(inputs.split(","))}
        try:
            if weight.endswith("%"):
                values["share"] = float(weight[:-1]) / 100.0
            elif weight:
                values["weight"] = float(weight)
        except ValueError:
            raise ConfigError(f"--source {spec!r}: {weight!r} is not a number") from None
        return cls(**values)

    @classmethod
    def of(cls, value: Any, where: str) -> SourceConfig:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: each source must be a mapping with name and inputs")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(value) - known):
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        if "name" not in value or "inputs" not in value:
            raise ConfigError(f"{where}: a source needs a name and inputs")
        return cls(**value)


@dataclass(frozen=True)
class RunConfig:
    out: str = ""
    work_dir: str = ""
    read: ReadConfig = field(default_factory=ReadConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    # A pretraining mixture (issue 26): empty = all inputs are one pool, as before.
    sources: tuple[SourceConfig, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "sources",
            tuple(s if isinstance(s, SourceConfig) else SourceConfig(**s) for s in self.sources),
        )
        if self.sources:
            self._check_sources()
        if self.remote_work and self.out and not self.remote_out:
            from packcli.fs import redact

            raise ConfigError(
                f"--work-dir {redact(self.remote_work)} is on object storage, so --out "
                "must be too: write tasks put the Parquet files there (e.g. --out "
                "s3://bucket/out)"
            )
        if self.chat.is_preference and self.plan.overlong == "split":
            raise ConfigError(
                "a preference pair is never split between rows: use --overlong drop (default "
                "for preference) or --overlong truncate (cut both responses to one budget)"
            )
        if self.chat.is_preference and self.plan.cp_size > 1:
            # The planner places a pair as one piece, but each of its two sequences would
            # need its own padding; not built yet.
            raise ConfigError(
                "--cp-size does not apply to preference pairs yet (each of a pair's two "
                "sequences would need its own padding): leave --cp-size out"
            )
        if self.chat.uses_template and self.plan.overlong == "split":
            raise ConfigError(
                "a dialogue is never split between rows: use --overlong drop (default for "
                "chat) or --overlong truncate (cut after the last whole turn that fits)"
            )

    def _check_sources(self) -> None:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"source names must be unique, got {names}")
        if self.read.inputs:
            raise ConfigError(
                "give inputs either as arguments (one pool) or per source (sources:), not both"
            )
        if self.chat.format != "text":
            raise ConfigError("sources (mixtures) are for text pretraining: chat.format text")
        shares = [s.share is not None for s in self.sources]
        if any(shares) and not all(shares):
            raise ConfigError(
                "give every source a share (target share of output tokens) or none: "
                f"{', '.join(s.name for s in self.sources if s.share is None)} have none"
            )
        if all(shares) and not sum(s.share or 0.0 for s in self.sources) > 0:
            raise ConfigError("the sources' shares must not all be 0")

    @property
    def mix_mode(self) -> str:
        """``epochs`` (weights are multipliers), ``share`` (target token shares), or ``""``."""
        if not self.sources:
            return ""
        return "share" if self.sources[0].share is not None else "epochs"

    def source_settings(self, k: int) -> dict[str, Any]:
        """Source ``k``'s read/tokenize/plan settings, the run's where it gives none."""
        s = self.sources[k]
        return {
            "text_field": s.text_field or self.read.text_field,
            "eos": self.tokenize.eos if s.eos is None else s.eos,
            "bos": self.tokenize.bos if s.bos is None else s.bos,
            "overlong": s.overlong or self.plan.overlong,
        }

    @property
    def remote_out(self) -> str | None:
        """The output URL when ``out`` is on object storage (``s3://...``), else None."""
        from packcli.fs import is_url

        return self.out if is_url(self.out) else None

    @property
    def remote_work(self) -> str | None:
        """The work folder URL when ``work_dir`` is on object storage, else None: then every
        stage reads and writes the work folder through the store
        (``packcli/stages/workstore.py``)."""
        from packcli.fs import is_url

        return self.work_dir if is_url(self.work_dir) else None

    @property
    def out_path(self) -> Path:
        """The local output folder: ``out``, or for a remote ``out`` the local folder it is
        made in and uploaded from (``--work-dir``, else a cache folder named after the URL;
        ``packcli/fs/urls.py``); with a URL work folder, this process's mirror of the output."""
        from packcli.fs import local_path, mirror_root, staging_root

        if self.remote_work:
            return mirror_root(self.remote_work) / "out"
        if self.remote_out:
            return staging_root(self.out, self.work_dir)
        return Path(local_path(self.out))

    @property
    def work_path(self) -> Path:
        """Work folder for tokenized shards; hidden inside the output unless set (a remote
        output's: inside its local staging folder); a URL one's: this process's mirror."""
        if self.remote_work:
            from packcli.fs import mirror_root

            return mirror_root(self.remote_work) / "work"
        if self.remote_out:
            return self.out_path / WORK_DIR
        return Path(self.work_dir) if self.work_dir else self.out_path / WORK_DIR

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.sources:  # a run without a mixture records what it always did
            del out["sources"]
        return out


_SECTIONS: dict[str, type] = {
    "read": ReadConfig,
    "tokenize": TokenizeConfig,
    "plan": PlanConfig,
    "write": WriteConfig,
    "chat": ChatConfig,
}


# Defaults that differ for ``format: chat`` and ``preference``, by section: the template
# writes the turn markers (so no EOS of ours), and a dialogue is never split. Explicit values
# still win. The CLI's help says them from here.
CHAT_DEFAULTS: dict[str, dict[str, Any]] = {
    "plan": {"overlong": "drop"},
    "tokenize": {"eos": "none"},
}


_TYPE_NAMES = {int: "an integer", str: "a string", float: "a number", bool: "true or false"}


def _type_ok(value: Any, tp: Any) -> bool | None:
    """Whether ``value`` has type ``tp``; None for types validated by the class itself."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if set(args) - {str, type(None)}:
            return None  # eos/bos: str | int, checked with its own message
        return value is None or isinstance(value, str)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp in (str, bool):
        return isinstance(value, tp)
    if origin is typing.Literal:  # a choice: a string here, its value checked by the class
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    return None


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "a string"
    if typing.get_origin(tp) is tuple:
        return "a list of strings"
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return "a string or null"
    return _TYPE_NAMES.get(tp, str(tp))


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    # YAML gives whatever the user wrote (``seed: "abc"``, ``short_len: 512.5``); a wrong type
    # must fail here with the key's name, not as a traceback deep in the planner.
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if _type_ok(value, hints[key]) is False:
            raise ConfigError(f"{where}: {key} must be {_type_name(hints[key])}, got {value!r}")
    try:
        return cls(**values)
    except TypeError as exc:  # wrong types that dataclasses reject
        raise ConfigError(f"{where}: {exc}") from exc


def load_yaml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a config file into ``{section: {key: value}}`` after checking its shape."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections")
    top_level = {"out", "work_dir", "sources"}
    unknown = sorted(set(data) - set(_SECTIONS) - top_level)
    if unknown:
        raise ConfigError(
            f"{p}: unknown section(s) {', '.join(unknown)}; known: "
            f"{', '.join([*_SECTIONS, *sorted(top_level)])}"
        )
    for name in _SECTIONS:
        if not isinstance(data.get(name, {}) or {}, dict):
            raise ConfigError(f"{p}: section {name!r} must be a mapping")
    if not isinstance(data.get("sources") or [], list):
        raise ConfigError(f"{p}: sources must be a list of mappings (name, inputs, weight...)")
    return data


def build_config(
    file_values: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    source: str = "config",
) -> RunConfig:
    """Merge YAML values with CLI overrides (``None`` override = not given) into a RunConfig:
    ``overrides`` maps a section's name to its values, and ``sources`` to the SourceConfigs
    of ``--source`` flags."""
    file_values = file_values or {}
    overrides = overrides or {}
    merged_values: dict[str, dict[str, Any]] = {}
    for name in _SECTIONS:
        merged = dict(file_values.get(name) or {})
        merged.update({k: v for k, v in (overrides.get(name) or {}).items() if v is not None})
        merged_values[name] = merged
    if merged_values["chat"].get("format") in ("chat", "preference"):
        for name, defaults in CHAT_DEFAULTS.items():
            for key, value in defaults.items():
                merged_values[name].setdefault(key, value)
    sections = {
        name: _section(cls, merged_values[name], f"{source}: section {name!r}")
        for name, cls in _SECTIONS.items()
    }
    top = {k: file_values.get(k) for k in ("out", "work_dir") if file_values.get(k) is not None}
    top.update({k: v for k, v in (overrides.get("run") or {}).items() if v is not None})
    given = overrides.get("sources")  # --source flags replace the file's list
    sources = (
        tuple(given)
        if given
        else tuple(
            SourceConfig.of(v, f"{source}: sources[{i}]")
            for i, v in enumerate(file_values.get("sources") or [])
        )
    )
    values: dict[str, Any] = {**{k: str(v) for k, v in top.items()}, **sections}
    return RunConfig(**values, sources=sources)
