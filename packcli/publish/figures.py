"""Every figure ``packcli.json`` states, derived again from the data it describes, so that
``verify`` can say which one differs (a report that vouches for other data is wrong data).

What each figure is derived from:

* the Parquet files (always): per file ``rows``, ``tokens``, ``bytes``, ``sha256`` and the
  number of files; per config every ``tiers`` figure (rows, tokens, segments, capacity,
  efficiency, lower bound, rows over it, largest row, the long config's attention balance
  ``ratio`` / ``after`` / ``floor``) and every ``training`` figure (from each row's documents
  and tokens at the stated ``tokens_per_step``); ``policy.split_*`` (documents in several
  pieces); ``documents_by_length.short``; ``preference.kept_pairs``; with ``--overlong split``
  also ``documents_by_length.overlong`` and ``largest_document`` (doc id and tokens);
* ``rejected.jsonl`` (when there; else the index, with the shards): ``input.rejected_lines``
  and ``input.rejected`` by reason;
* ``run.inputs`` (always): ``input.files`` and ``input.bytes``;
* the tokenized shards, when verify reads them: ``input.documents``, ``input.tokens``, every
  ``documents_by_length`` and ``policy`` count (the overlong rule applied to each document's
  length), ``largest_document`` with its file and line (row); and from the tokenize stage's
  index the counts made while reading and encoding that the data no longer shows:
  ``input.blank_lines``, ``input.corrupt_streams``, ``chat``, ``preference`` (but
  ``kept_pairs``) and ``tokenizer.special_strings``.

Not checked (no data to derive them from): ``config`` and ``run`` (settings, the command,
versions, fingerprints, the tokenizer and backend chosen, the inputs' identity, which verify's
re-encoding uses), ``tokenizer.disabled_settings`` / ``special_in_text`` (settings),
``training.*.tokens_per_step`` (the target asked for) and the attention balancer's ``before``
and ``moves`` (the rows before it moved documents). ``UNCHECKED`` lists them; a test holds
every other figure of a real ``packcli.json`` to a check.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, MARKER
from packcli.pack.mixture import StepSums
from packcli.pack.plan import RowTotals
from packcli.publish.report import cp_padding_report, encoder_policy, larger, step_totals
from packcli.stages.write_records import Listing
from packcli.tokenize.records import ShardIndex

# Figures of packcli.json no data determines (glob patterns over the dotted keys).
UNCHECKED = (
    "config.*",
    "run.*",
    "report.tokenizer.disabled_settings*",
    "report.tokenizer.special_in_text",
    "report.training.*.tokens_per_step",
    "report.tiers.long.attention_balance.before",
    "report.tiers.long.attention_balance.moves",
)
# Without the shards, these are known only through the shards or the tokenize stage's index.
NEEDS_SHARDS = (
    "report.input.documents",
    "report.input.tokens",
    "report.input.blank_lines",
    "report.input.corrupt_streams*",
    "report.input.rejected*",
    "report.documents_by_length.*",
    "report.policy.*",
    "report.largest_document.*",
    "report.chat*",
    "report.preference.*",
    "report.tokenizer.special_strings.*",
)


@dataclass(frozen=True)
class ScannedFile:
    """One output file as verify read it: its place in ``packcli.json``'s list (parts are
    scanned apart and sorted back by it) and what the data says of it, as a listing."""

    index: int
    listing: Listing


@dataclass
class ConfigScan:
    """What verify read of one config, summed file by file (and part by part): each file's
    figures, the segments as stored (a preference pair is two) and the rows' totals that
    the tier, training and balance figures come from, so no process holds a value per row
    or per segment of the whole config."""

    totals: RowTotals
    files: list[ScannedFile] = field(default_factory=list)
    segments: int = 0
    pad_tokens: int = 0  # context-parallel padding (not in ``totals``, which are real tokens)
    # A mixture: tokens per source in the step windows, of each batch of rows read
    # (``StepSums.combined`` once, where the figures are derived).
    steps: tuple[StepSums, ...] = ()

    def __add__(self, other: ConfigScan) -> ConfigScan:
        return ConfigScan(
            self.totals + other.totals,
            sorted([*self.files, *other.files], key=lambda f: f.index),
            self.segments + other.segments,
            self.pad_tokens + other.pad_tokens,
            self.steps + other.steps,
        )


@dataclass(frozen=True)
class DocFigures:
    """The long config's per-document figures: documents in several pieces, their pieces
    and tokens, documents that fit a short pack, those over ``long_len`` and the largest.
    From a part's units when that part holds every piece of its documents (an output of one
    part), or from the shards' lengths by the overlong rule (what the output must then
    hold, which the conservation check proves it does)."""

    split_docs: int = 0
    split_pieces: int = 0
    split_tokens: int = 0
    short: int = 0
    overlong: int = 0
    largest: int = -1
    largest_tokens: int = 0

    @classmethod
    def of_units(
        cls, doc: np.ndarray, length: np.ndarray, short_len: int, long_len: int
    ) -> DocFigures:
        docs, inverse, pieces = np.unique(doc, return_inverse=True, return_counts=True)
        tokens = np.bincount(inverse, weights=length, minlength=docs.size).astype(np.int64)
        return cls._of(docs, pieces, tokens, short_len, long_len)

    @classmethod
    def of_lengths(
        cls, lengths: np.ndarray, first_doc: int, short_len: int, long_len: int, policy: str
    ) -> DocFigures:
        lengths = lengths.astype(np.int64)
        keep = lengths > 0
        if policy == "drop":
            keep &= lengths <= long_len
        docs = np.flatnonzero(keep) + first_doc
        tokens = lengths[keep]
        if policy == "truncate":
            tokens = np.minimum(tokens, long_len)
        pieces = -(-tokens // long_len) if policy == "split" else np.ones_like(tokens)
        return cls._of(docs, pieces, tokens, short_len, long_len)

    @classmethod
    def _of(
        cls, docs: np.ndarray, pieces: np.ndarray, tokens: np.ndarray, short_len: int, long_len: int
    ) -> DocFigures:
        split = pieces > 1
        top = int(tokens.argmax()) if tokens.size else -1
        return cls(
            split_docs=int(split.sum()),
            split_pieces=int(pieces[split].sum()),
            split_tokens=int(tokens[split].sum()),
            short=int((tokens <= short_len).sum()),
            overlong=int((tokens > long_len).sum()),
            largest=int(docs[top]) if top >= 0 else -1,
            largest_tokens=int(tokens[top]) if top >= 0 else 0,
        )

    def __add__(self, other: DocFigures) -> DocFigures:
        top = larger(self, other)
        counts = ("split_docs", "split_pieces", "split_tokens", "short", "overlong")
        summed = {k: getattr(self, k) + getattr(other, k) for k in counts}
        return DocFigures(**summed, largest=top.largest, largest_tokens=top.largest_tokens)


@dataclass(frozen=True)
class ShardFigures:
    """What the shards say of the documents' lengths (summed shard by shard), and where the
    largest document came from (its input file's index and line or row)."""

    lengths: Any  # publish.report.LengthStats
    largest_file: int = -1
    largest_line: int = -1


def flatten(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) of a JSON value; list items as ``key[i]``; an empty dict or
    list, and None, are leaves."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from flatten(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for i, v in enumerate(value):
            yield from flatten(v, f"{key}[{i}]")
    else:
        yield key, value


def _balance(totals: RowTotals, stated: Any) -> dict[str, Any]:
    """The long config's attention cost: max / mean over rows of the sum of its units'
    squared lengths (a short pack's documents count each; a pair counts whole, as planned)."""
    mean = totals.cost / totals.rows if totals.rows else 0.0
    out: dict[str, Any] = {}
    keys = stated.keys() if isinstance(stated, dict) else ("ratio",)
    for key in ("ratio", "after"):
        if key in keys:
            out[key] = totals.balance
    if "floor" in keys:
        out["floor"] = totals.max_unit_cost / mean if totals.max_unit_cost and mean else 1.0
    return out


def rejected_counts(out: Path) -> Counter[str] | None:
    """Quarantined lines of ``OUT/rejected.jsonl`` by reason; None when it is not there (a
    run that rejected nothing leaves none, and a user may delete it: then the counts are
    checked against the tokenize stage's index, when verify reads the shards)."""
    found: Counter[str] = Counter()
    path = out / "rejected.jsonl"
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                found[str(json.loads(line)["reason"])] += 1
            except (ValueError, KeyError, TypeError) as exc:
                raise VerifyError(f"{path}: line {n} is not a quarantine record ({exc})") from exc
    return found


def derive(
    meta: dict[str, Any],
    out: Path,
    scans: dict[str, ConfigScan],
    docs: DocFigures | None = None,
    shards: ShardFigures | None = None,
    index: ShardIndex | None = None,
    rejected: Counter[str] | None = None,
    held: tuple[int, list[int]] | None = None,
) -> dict[str, Any]:
    """The figures the data gives, by the dotted key ``packcli.json`` states them under.
    ``docs``: the long config's per-document figures, when known (``DocFigures``);
    ``shards`` and ``index`` (the tokenize stage's ``_SUCCESS.json``): when verify read the
    shards; ``rejected``: ``rejected.jsonl``'s lines by reason, when there; ``held``: a
    grouped mixture's groups, and how many of them hold each source in their long rows."""
    plan = meta["config"]["plan"]
    report = meta["report"]
    got: dict[str, Any] = {}
    for name in CONFIG_NAMES:
        scan = scans[name]
        for i, scanned in enumerate(scan.files):
            for k, v in scanned.listing.to_json().items():
                got[f"files.{name}[{i}].{k}"] = v
        # The segments as stored: a preference pair is two (the plan's units count it once).
        tier = replace(scan.totals.summary(), segments=scan.segments)
        for k, v in tier.to_json().items():
            got[f"report.tiers.{name}.{k}"] = v
        training = report.get("training") or {}
        stated = training.get(name)
        rows = scan.totals
        if not rows.rows:  # a config without rows has no step plan
            got[f"report.training.{name}"] = None
        elif not isinstance(stated, dict):
            raise VerifyError(
                f"{MARKER}: report.training.{name} is {stated!r}, but the config has "
                f"{rows.rows} rows"
            )
        else:
            target = stated.get("tokens_per_step")
            if not isinstance(target, int) or isinstance(target, bool) or target < 1:
                raise VerifyError(
                    f"{MARKER}: report.training.{name}.tokens_per_step is {target!r}, not a "
                    "positive int"
                )
            for k, v in step_totals(rows.rows, rows.units, rows.tokens, target).items():
                got[f"report.training.{name}.{k}"] = v
    long = scans["long"]
    balance = report["tiers"]["long"].get("attention_balance")
    for k, v in _balance(long.totals, balance).items():
        got[f"report.tiers.long.attention_balance.{k}"] = v
    if docs is not None:
        got["report.policy.split_docs"] = docs.split_docs
        got["report.policy.split_pieces"] = docs.split_pieces
        got["report.policy.split_tokens"] = docs.split_tokens
        got["report.documents_by_length.short"] = docs.short
        if plan["overlong"] == "split" and shards is None and docs.largest >= 0:
            got["report.documents_by_length.overlong"] = docs.overlong
            got["report.largest_document.doc_id"] = docs.largest
            got["report.largest_document.tokens"] = docs.largest_tokens
    cp = int(plan.get("cp_size", 1))
    if cp > 1:
        from packcli.write import pad_token_id

        got["report.cp_padding"] = cp_padding_report(
            cp,
            2 * cp,
            pad_token_id(meta["run"]["tokenizer"]),
            {n: scans[n].totals.tokens for n in CONFIG_NAMES},
            {n: scans[n].pad_tokens for n in CONFIG_NAMES},
        )
    if (mix := report.get("mixture")) is not None:
        got.update(_mixture_steps(mix, scans, held))
    if "preference" in report:
        got["report.preference.kept_pairs"] = long.segments - long.totals.units
    if rejected is not None:
        got["report.input.rejected_lines"] = sum(rejected.values())
        got["report.input.rejected"] = dict(sorted(rejected.items()))
    inputs = meta["run"].get("inputs") or []
    got["report.input.files"] = len(inputs)
    got["report.input.bytes"] = sum(int(f.get("size", 0)) for f in inputs)
    if shards is not None and index is not None:
        got.update(_from_shards(meta, index, shards, rejected is not None))
    return got


def _mixture_steps(
    mix: dict[str, Any], scans: dict[str, ConfigScan], held: tuple[int, list[int]] | None
) -> dict[str, Any]:
    """A mixture's per-source shares and step deviations, from the tokens of each source in
    each of the output's step windows as the rows hold them (``StepSums.deviation``: the
    plan stage's definition, over the same integer sums)."""
    got: dict[str, Any] = {}
    for name in CONFIG_NAMES:
        scan = scans[name]
        if not scan.steps or name not in (mix["sources"][0] if mix["sources"] else {}):
            continue
        steps = StepSums.combined(scan.steps)
        dev = steps.deviation(scan.totals.rows)
        tokens = steps.sums.sum(axis=0)
        total = int(tokens.sum())
        for k in range(len(mix["sources"])):
            at = f"report.mixture.sources[{k}].{name}"
            got[f"{at}.tokens"] = int(tokens[k])
            got[f"{at}.share"] = round(int(tokens[k]) / total, 6) if total else 0.0
            got[f"{at}.window_max_deviation"] = dev.max_deviation[k]
            got[f"{at}.window_p99_deviation"] = dev.p99_deviation[k]
    if held is not None:
        groups, holding = held
        got["report.mixture.groups"] = groups
        for k, n in enumerate(holding):
            got[f"report.mixture.sources[{k}].groups"] = n
    return got


def _from_shards(
    meta: dict[str, Any], index: ShardIndex, shards: ShardFigures, quarantined: bool
) -> dict[str, Any]:
    """The figures only the shards (and their index) know: every document's length, so the
    overlong rule's counts, and what reading and encoding counted (the quarantine's counts
    too, unless ``quarantined``: ``rejected.jsonl`` gave them)."""
    plan = meta["config"]["plan"]
    long_len = int(plan["long_len"])
    lengths = shards.lengths
    n_over, over_tokens = lengths.overlong, lengths.overlong_tokens
    policy = {"truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 0, "dropped_tokens": 0}
    if plan["overlong"] == "truncate":
        policy.update(truncated_docs=n_over, truncated_tokens=over_tokens - n_over * long_len)
    elif plan["overlong"] == "drop":
        policy.update(dropped_docs=n_over, dropped_tokens=over_tokens)
    policy["empty_docs"] = lengths.empty
    # What the chat / preference encoders cut or dropped before planning, as the report
    # counts it (one account of the length limit).
    pref = index.preference
    encoded = encoder_policy(pref if pref is not None else index.chat)
    for k, v in encoded.items():
        policy[k] = policy.get(k, 0) + v
    if meta["report"].get("mixture") is not None:
        # Per-source policies: the multiset check proved each document's pieces by its own.
        policy = {"empty_docs": lengths.empty}
    got: dict[str, Any] = {f"report.policy.{k}": v for k, v in policy.items()}
    got["report.input.documents"] = lengths.documents
    got["report.input.tokens"] = (
        lengths.tokens + encoded["truncated_tokens"] + encoded["dropped_tokens"]
    )
    for k, v in {
        "short": lengths.short,
        "long": lengths.long,
        "overlong": n_over,
        "empty": lengths.empty,
    }.items():
        got[f"report.documents_by_length.{k}"] = v
    if lengths.largest >= 0:
        got["report.largest_document.doc_id"] = lengths.largest
        got["report.largest_document.tokens"] = lengths.largest_tokens
        entry = index.files[shards.largest_file]
        got["report.largest_document.file"] = entry["path"]
        where = "row" if "format" in entry else "line"
        got[f"report.largest_document.{where}"] = shards.largest_line
    read = index.read_stats
    got["report.input.blank_lines"] = read.get("blank_lines")
    # Stated only when a file failed, so other reports stay as they were.
    got["report.input.corrupt_streams"] = read.get("corrupt_streams") or None
    if not quarantined:  # no rejected.jsonl: the index's counts
        rejected = read.get("rejected") or {}
        got["report.input.rejected_lines"] = sum(rejected.values())
        got["report.input.rejected"] = dict(sorted(rejected.items()))
    got["report.chat"] = index.chat
    for k, v in (index.preference or {}).items():
        got[f"report.preference.{k}"] = v
    found = index.special_strings
    got["report.tokenizer.special_strings.occurrences"] = sum(found.values())
    top = dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))[:20])
    got["report.tokenizer.special_strings.by_token"] = top
    return got


def _same(stated: Any, derived: Any) -> bool:
    if isinstance(stated, bool) or isinstance(derived, bool):
        return stated is derived
    if isinstance(stated, (int, float)) and isinstance(derived, (int, float)):
        if isinstance(stated, float) or isinstance(derived, float):
            return math.isclose(stated, derived, rel_tol=1e-9, abs_tol=1e-12)
        return int(stated) == int(derived)
    return bool(stated == derived)


def _stated(meta: dict[str, Any], key: str) -> Any:
    """The value ``packcli.json`` holds under a dotted key (``files.long[0].rows``), or a
    ``KeyError`` when it holds none."""
    value: Any = meta
    for part in key.replace("[", ".[").split("."):
        if part.startswith("["):
            index = int(part[1:-1])
            if not isinstance(value, list) or index >= len(value):
                raise KeyError(key)
            value = value[index]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(key)
    return value


def check_figures(meta: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """Raise ``VerifyError`` naming the first figure of ``packcli.json`` that differs from
    what the data gives (a section the data gives as a dict: each of its figures, then its
    set of keys). A figure it does not state is not checked (reports of older versions
    state fewer). Returns the figures checked."""
    checked = []
    for key, value in derived.items():
        parts = list(flatten(value, key)) if isinstance(value, dict) else []
        for leaf, v in [*parts, (key, value)]:
            try:
                stated = _stated(meta, leaf)
            except KeyError:  # not stated (a section only some reports have, an older report)
                continue
            if not _same(stated, v):
                raise VerifyError(
                    f"{MARKER}: {leaf} says {stated!r}, but the data gives {v!r} (packcli.json "
                    "does not describe this output: rerun packcli finalize or pack)"
                )
            checked.append(leaf)
    return sorted(set(checked))


def unchecked(key: str, *, with_shards: bool) -> bool:
    """Whether ``key`` is a figure verify does not derive (``UNCHECKED``), or without the
    shards cannot (``NEEDS_SHARDS``)."""
    patterns = UNCHECKED if with_shards else UNCHECKED + NEEDS_SHARDS
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)
