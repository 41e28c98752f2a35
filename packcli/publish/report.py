"""The run report: what packing did to the corpus, as data (``packcli.json``) and as text.

Every token of the input is accounted for: ``input.tokens`` = tokens written to the long
config + ``policy.truncated_tokens`` + ``policy.dropped_tokens``. The overlong policy acts in
two places: the planner cuts or drops text documents, and the chat and preference encoders
cut or drop dialogues and pairs before planning (a pair is never split, and a cut must fall
between turns). ``policy`` counts both, so it is the one account of what the length limit
removed; the ``chat`` / ``preference`` sections say the same figures in their own words.
The report holds no timings, so the same inputs and config give a byte-identical
``packcli.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from packcli.config import TOKENS_PER_STEP
from packcli.names import MARKER
from packcli.pack.mixture import SourceCounts, WindowSpread
from packcli.pack.plan import RowTotals, TierFigures
from packcli.publish.report_records import (
    InputFiles,
    InputReport,
    LargestDocument,
    Provenance,
    SourceShare,
)
from packcli.publish.steps import plan_totals
from packcli.tokenize.records import SourceCount

# ``report.policy``'s counts, in the order ``packcli.json`` holds them (its bytes depend on
# it); the plan's counts of each, plus the chat or preference encoder's (``encoder_policy``).
POLICY_KEYS = (
    "split_docs",
    "split_pieces",
    "split_tokens",
    "truncated_docs",
    "truncated_tokens",
    "dropped_docs",
    "dropped_tokens",
    "empty_docs",
)


def training_hints(totals: RowTotals, tokens_per_step: int) -> dict[str, Any] | None:
    """Samples per row and the step plan of one config: what a batch size written for
    unpacked training becomes on these rows (None for a config without rows)."""
    if totals.rows == 0:
        return None
    return step_totals(totals.rows, totals.units, totals.tokens, tokens_per_step)


def step_totals(rows: int, documents: int, tokens: int, tokens_per_step: int) -> dict[str, Any]:
    """The ``training`` figures of one config from its rows' totals (documents: a preference
    pair counts once): the report's, and ``verify``'s from the rows it read."""
    p = plan_totals(rows, documents, tokens, tokens_per_step=tokens_per_step)
    return {
        "samples_per_row": round(p.samples_per_row, 4),
        "tokens_per_row": round(p.tokens_per_row, 1),
        "tokens_per_step": tokens_per_step,
        "rows_per_step": p.rows_per_step,
        "steps_per_epoch": p.steps_per_epoch,
        "documents_per_step": round(p.documents_per_step, 2),
        "unpacked_batch_size": p.unpacked_batch_size,
        "unpacked_steps_per_epoch": p.unpacked_steps_per_epoch,
    }


def larger(a: Any, b: Any) -> Any:
    """Of two sums with a ``largest`` document (doc id, -1 for none) and its
    ``largest_tokens``, the one whose largest wins: more tokens, ties to the smaller doc id,
    so a sum of parts does not depend on their order."""
    if a.largest < 0:
        return b
    if b.largest < 0:
        return a
    return a if (a.largest_tokens, -a.largest) >= (b.largest_tokens, -b.largest) else b


@dataclass(frozen=True)
class LengthStats:
    """What the report says of the documents' lengths, summed shard by shard (so no process
    holds every length, and in any order of shards): counts by tier, tokens, the overlong
    documents' tokens, and the largest document (the first of the largest, as ``argmax``
    picks)."""

    documents: int = 0
    tokens: int = 0
    short: int = 0
    long: int = 0
    overlong: int = 0
    empty: int = 0
    overlong_tokens: int = 0
    largest: int = -1  # doc id
    largest_tokens: int = 0

    @classmethod
    def of(
        cls, lengths: np.ndarray, short_len: int, long_len: int, first_doc: int = 0
    ) -> LengthStats:
        lengths = np.asarray(lengths, dtype=np.int64)
        top = int(lengths.argmax()) if lengths.size else -1
        return cls(
            documents=int(lengths.size),
            tokens=int(lengths.sum()),
            short=int(((lengths > 0) & (lengths <= short_len)).sum()),
            long=int(((lengths > short_len) & (lengths <= long_len)).sum()),
            overlong=int((lengths > long_len).sum()),
            overlong_tokens=int(lengths[lengths > long_len].sum()),
            empty=int((lengths == 0).sum()),
            largest=first_doc + top if top >= 0 else -1,
            largest_tokens=int(lengths[top]) if top >= 0 else 0,
        )

    def __add__(self, other: LengthStats) -> LengthStats:
        """These documents and ``other``'s (ties keep the smaller doc id, so the sum does
        not depend on the order)."""
        top = larger(self, other)
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("largest", "largest_tokens")  # the larger's, not a sum
        }
        return LengthStats(**summed, largest=top.largest, largest_tokens=top.largest_tokens)


def build_report(
    tiers: dict[str, RowTotals],
    stats: dict[str, Any],
    lengths: LengthStats,
    *,
    input_stats: InputFiles,
    largest_provenance: Provenance | None,
    chat: dict[str, Any] | None = None,
    tokenizer: dict[str, Any] | None = None,
    preference: dict[str, Any] | None = None,
    tokens_per_step: int = TOKENS_PER_STEP,
    cp_padding: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``preference``: the preference path's counts (``PreferenceStats``); the report gets a
    ``preference`` section only then, so other reports keep their bytes. ``cp_padding``
    (``cp_padding_report``): likewise, only for rows padded for context parallelism.
    ``tokens_per_step``: the target of the ``training`` section's step plan. ``tiers``:
    each config's rows summed (``RowTotals``); ``stats``: the plan's counts; ``input_stats``:
    what reading gave; ``largest_provenance``: where the largest document was read."""
    encoded = encoder_policy(preference if preference is not None else chat)
    report = {
        "input": InputReport.of(
            input_stats,
            documents=lengths.documents,
            tokens=lengths.tokens + encoded["truncated_tokens"] + encoded["dropped_tokens"],
        ).to_json(),
        "documents_by_length": {
            "short": lengths.short,
            "long": lengths.long,
            "overlong": lengths.overlong,
            "empty": lengths.empty,
        },
        "policy": {k: stats[k] + encoded.get(k, 0) for k in POLICY_KEYS},
        "tiers": {
            "short": tiers["short"].summary().to_json(),
            # Attention cost balance: max/mean over rows of sum(segment length^2).
            "long": {
                **tiers["long"].summary().to_json(),
                "attention_balance": stats.get("long_attention_balance"),
            },
        },
        "largest_document": LargestDocument.at(
            lengths.largest, lengths.largest_tokens, largest_provenance
        ).to_json(),
        # Chat: what was removed while tokenizing (dialogues kept as empty documents, so
        # `documents_by_length.empty` counts them too). None for text.
        "chat": chat,
        # Tokenizer-file settings packcli turned off, and special-token strings in documents.
        "tokenizer": tokenizer,
        # Per config: documents (pairs, for preference data) per row, and the rows per step,
        # steps per epoch and unpacked batch size (same documents per step) at the target.
        "training": {
            name: training_hints(tiers[name], tokens_per_step) for name in ("short", "long")
        },
    }
    if preference is not None:
        # Each pair is one document of the plan (two segments in the output).
        report["preference"] = preference
    if cp_padding is not None:
        report["cp_padding"] = cp_padding
    return report


def cp_padding_report(
    cp_size: int, multiple: int, pad_id: int, tokens: dict[str, int], padding: dict[str, int]
) -> dict[str, Any]:
    """The context-parallel padding of each config: its pad tokens and their share of the
    tokens its rows hold (real + padding). ``tiers.*.tokens`` and ``efficiency`` count real
    tokens only, so padding shows there as room. The report's and ``verify``'s."""
    out: dict[str, Any] = {"cp_size": cp_size, "multiple": multiple, "pad_id": pad_id}
    for name in ("short", "long"):
        held = tokens[name] + padding[name]
        out[name] = {"pad_tokens": padding[name], "share": padding[name] / held if held else 0.0}
    return out


def encoder_policy(counts: dict[str, Any] | None) -> dict[str, int]:
    """What the chat or preference encoder's length policy did, in ``policy``'s keys. A
    dialogue or pair it dropped is kept as an empty document (the plan counts it among
    ``empty_docs``): it is counted dropped instead, once."""
    if not counts:
        return {"truncated_tokens": 0, "dropped_tokens": 0}
    dropped = int(counts.get("truncate_dropped", 0))
    return {
        "truncated_docs": int(counts.get("truncated", 0)),
        "truncated_tokens": int(counts.get("truncated_tokens", 0)),
        "dropped_docs": dropped,
        "dropped_tokens": int(counts.get("truncate_dropped_tokens", 0)),
        "empty_docs": -dropped,
    }


_CORRUPT_SHOWN = 5  # damaged files listed on the terminal; packcli.json lists all


def _n(x: int) -> str:
    return f"{x:,}"


def format_report(report: dict[str, Any]) -> str:
    """A compact human-readable report for the terminal."""
    inp = InputReport.from_json(report["input"], MARKER, prefix="report.input.")
    lines = [
        *_corpus_lines(report, inp),
        *_input_problem_lines(inp),
        *_dialogue_lines(report),
        *_tokenizer_lines(report.get("tokenizer") or {}),
    ]
    big = LargestDocument.from_json(
        report["largest_document"], MARKER, prefix="report.largest_document."
    )
    if big.doc_id >= 0:
        where = f" at {big.file}:{big.line}" if big.line is not None else ""
        if big.row is not None:  # a Parquet/Arrow file: rows count from 0
            where = f" at {big.file} row {big.row}"
        lines.append(f"largest   doc {big.doc_id}: {_n(big.tokens)} tokens{where}")
    if (mix := report.get("mixture")) is not None:
        lines += ["", format_mixture(mix)]
    return "\n".join(lines)


def _corpus_lines(report: dict[str, Any], inp: InputReport) -> list[str]:
    """Documents in, rows out per tier, what the overlong policy did, the step plan."""
    pol = report["policy"]
    by_len = report["documents_by_length"]
    lines = [
        f"input     {_n(inp.documents)} documents, {_n(inp.tokens)} tokens "
        f"from {inp.files} file(s)",
        f"          by length: {_n(by_len['short'])} short, {_n(by_len['long'])} long, "
        f"{_n(by_len['overlong'])} overlong, {_n(by_len['empty'])} empty",
        "",
        f"{'tier':<6}{'capacity':>10}{'rows':>12}{'tokens':>16}{'efficiency':>12}"
        f"{'bound':>10}{'rows/bound':>12}",
    ]
    for name, tier in report["tiers"].items():
        t = TierFigures.from_json(tier, MARKER, prefix=f"report.tiers.{name}.")
        lines.append(
            f"{name:<6}{_n(t.capacity):>10}{_n(t.rows):>12}{_n(t.tokens):>16}"
            f"{t.efficiency:>11.4%} {_n(t.lower_bound_rows):>10}{t.rows_over_bound:>12.5f}"
        )
    lines += [
        "",
        f"split     {_n(pol['split_docs'])} documents into {_n(pol['split_pieces'])} pieces "
        f"({_n(pol['split_tokens'])} tokens, all kept)",
        f"truncated {_n(pol['truncated_docs'])} documents ({_n(pol['truncated_tokens'])} "
        "tokens removed)",
        f"dropped   {_n(pol['dropped_docs'])} documents ({_n(pol['dropped_tokens'])} tokens), "
        f"{_n(pol['empty_docs'])} empty",
    ]
    cp = report.get("cp_padding")
    if cp:
        per = ", ".join(
            f"{name} {_n(cp[name]['pad_tokens'])} tokens ({cp[name]['share']:.3%})"
            for name in ("short", "long")
        )
        lines.append(
            f"cp pad    --cp-size {cp['cp_size']}: every segment padded to a multiple of "
            f"{cp['multiple']} with id {cp['pad_id']} (label -100): {per}"
        )
    for name, hint in (report.get("training") or {}).items():
        if hint:
            lines.append(
                f"training  {name}: {hint['samples_per_row']:,.2f} documents a row; at "
                f"{_n(hint['tokens_per_step'])} tokens a step, {_n(hint['rows_per_step'])} rows "
                f"a step, {_n(hint['steps_per_epoch'])} steps an epoch (unpacked: batch size "
                f"{_n(hint['unpacked_batch_size'])} for the same documents a step)"
            )
    return lines


def _input_problem_lines(inp: InputFiles) -> list[str]:
    """Lines quarantined by ``--on-bad-line skip`` and compressed files cut short."""
    lines = []
    if inp.rejected:
        reasons = ", ".join(f"{k} {v:,}" for k, v in inp.rejected.items())
        lines.append(f"rejected  {_n(inp.rejected_lines)} lines ({reasons}): rejected.jsonl")
    corrupt = inp.corrupt_streams or []
    for entry in corrupt[:_CORRUPT_SHOWN]:
        if "rows" in entry:  # a Parquet/Arrow file: a range of rows, later ones kept
            first, end = entry["rows"]
            left_out = f"rows {_n(first)}-{_n(end - 1)}" if end else f"rows from {_n(first)} on"
            lines.append(f"corrupt   {entry['file']}: left out {left_out} ({entry['reason']})")
            continue
        lines.append(
            f"corrupt   {entry['file']}: kept its first {_n(entry['kept_lines'])} lines, "
            f"discarded the rest ({entry['reason']})"
        )
    if len(corrupt) > _CORRUPT_SHOWN:
        lines.append(f"          and {len(corrupt) - _CORRUPT_SHOWN} more file(s): packcli.json")
    return lines


def _removed(counts: dict[str, Any], policy: dict[str, Any], what: str) -> str:
    """What the chat and the preference paths removed. Every document of such a run is a
    dialogue or a pair, so the length limit's figures are ``policy``'s (the encoder's cuts
    and the planner's drops alike): the same numbers as the report's policy lines."""
    return (
        f"dropped {_n(counts['no_trainable'])} with nothing to train, "
        f"{_n(policy['dropped_docs'])} too long ({_n(policy['dropped_tokens'])} tokens); "
        f"truncated {_n(policy['truncated_docs'])}{what} "
        f"({_n(policy['truncated_tokens'])} tokens removed)"
    )


def _dialogue_lines(report: dict[str, Any]) -> list[str]:
    """Chat: dialogues and what was removed, BOS/EOS added; preference: the pairs."""
    lines = []
    chat = report.get("chat")
    if chat:
        removed = _removed(chat, report["policy"], " at a turn")
        lines.append(f"chat      {_n(chat['dialogues'])} dialogues; {removed}")
        # --bos/--eos (absent from reports of older versions, which did not apply them)
        added = [
            f"{name} added to {_n(chat.get(f'{key}_added', 0))}{extra} "
            f"({_n(chat.get(f'{key}_in_template', 0))} had it from the template)"
            for name, key, extra in (
                ("BOS", "bos", ""),
                ("EOS", "eos", f", trained in {_n(chat.get('eos_trained', 0))}"),
            )
            if chat.get(f"{key}_added", 0) or chat.get(f"{key}_in_template", 0)
        ]
        if added:
            lines.append(f"          {'; '.join(added)}")
    pref = report.get("preference")
    if pref:
        removed = _removed(pref, report["policy"], "")
        lines.append(
            f"pairs     {_n(pref['pairs'])} preference pairs ({_n(pref['conversational'])} "
            f"conversational, {_n(pref['implicit_prompt'])} with an implicit prompt, "
            f"{_n(pref['identical'])} identical); {removed}"
        )
    return lines


def _tokenizer_lines(tok: dict[str, Any]) -> list[str]:
    """Tokenizer-file settings turned off; special-token strings found inside documents."""
    lines = [
        f"tokenizer the tokenizer file enables {what}: turned off, nothing was cut"
        for what in tok.get("disabled_settings", [])
    ]
    found = (tok.get("special_strings") or {}).get("occurrences", 0)
    if found:
        mode = tok.get("special_in_text")
        as_what = "plain text" if mode == "text" else "special tokens"
        names = ", ".join(f"{k} {v:,}" for k, v in tok["special_strings"]["by_token"].items())
        lines.append(
            f"specials  {_n(found)} special-token strings inside documents, encoded as "
            f"{as_what} (--special-in-text {mode}): {names}"
        )
    return lines


def mixture_report(
    stats: dict[str, Any], sources: list[SourceCount], window_tokens: int
) -> dict[str, Any]:
    """A mixture's section of the report: per source what its weight did (documents, tokens,
    copies, repeats, drops), its realised share of each config's tokens, and that share's
    largest and 99th-percentile deviation over the output's windows of one step
    (``window_rows`` rows of ``window_tokens``, the plan's ``tokens_per_step``, from its first
    row, against the output's share, a grouped plan's too; in the long config also the piece
    bound, what no order of its rows can beat), and for a grouped plan how many of its
    ``groups`` hold each source (``mixture_warnings`` says why that matters). Token account:
    ``long tokens = input.tokens - truncated - dropped + repeat_tokens - subsampled_tokens``."""
    spec = stats["mixture_spec"]
    counts = {
        name: SourceCounts.from_json(c, "plan.json", f"stats.mixture.{name}.")
        for name, c in stats["mixture"].items()
    }
    windows = {
        name: WindowSpread.from_json(w, "plan.json", f"stats.mixture_windows.{name}.")
        for name, w in stats.get("mixture_windows", {}).items()
    }
    held = stats.get("mixture_groups")  # a grouped plan: how many groups hold each source
    rows = []
    for k, name in enumerate(spec["names"]):
        c = counts[name].to_json() if name in counts else {}
        row: dict[str, Any] = {
            "name": name,
            "source_id": k,
            "multiplier": round(float(spec["multipliers"][k]), 6),
            "overlong": spec["overlong"][k],
            "eos_id": sources[k].eos,
            "bos_id": sources[k].bos,
            "first_doc": int(spec["first_doc"][k]),
            **{key: int(c[key]) for key in sorted(c)},
        }
        for tier, w in windows.items():
            row[tier] = SourceShare.of(w, k).to_json()
        if held is not None:
            row["groups"] = int(held["holding"][k])
        rows.append(row)
    extra = {} if held is None else {"groups": int(held["groups"])}
    return {
        **extra,
        "mode": "epochs",
        "seed": int(spec["seed"]),
        "window_tokens": window_tokens,
        "window_rows": {tier: w.window_rows for tier, w in windows.items()},
        "repeat_tokens": sum(c.repeat_tokens for c in counts.values()),
        "subsampled_tokens": sum(c.subsampled_tokens for c in counts.values()),
        "sources": rows,
    }


# A source this large a share of the mix should be within this of its share in every step
# (issue 26's goal).
WARN_SHARE = 0.05
WARN_DEVIATION = 0.005


def mixture_warnings(mix: dict[str, Any]) -> list[str]:
    """Per source of at least ``WARN_SHARE`` of a config, off its share by more than
    ``WARN_DEVIATION`` in some step: a line naming it, the deviation and the causes we know,
    with their cures: a step too small for its largest piece (the piece bound), or fewer
    groups holding it than the plan has. Why the latter: a grouped plan orders each
    group's rows for the mix, but a group can only give what it holds; each group holds
    ``1/G`` of every source's tokens (``packcli.pack.groups.source_slices``), but a source of
    fewer documents than groups sits in only some, and every step of the others lacks it."""
    out = []
    groups = mix.get("groups")
    shares = {
        (s["name"], tier): SourceShare.from_json(
            s[tier], MARKER, prefix=f"report.mixture.sources.{tier}."
        )
        for s in mix["sources"]
        for tier in ("long", "short")
        if s.get(tier)
    }
    # Per config, the source whose largest piece is furthest over its share of a step: the
    # steps holding such a piece move every other source's share too.
    coarsest = {
        tier: max(
            ((name, t.piece_bound or 0.0) for (name, c), t in shares.items() if c == tier),
            key=lambda nb: nb[1],
            default=None,
        )
        for tier in ("long", "short")
    }
    for s in mix["sources"]:
        for tier in ("long", "short"):
            if (s["name"], tier) not in shares:
                continue
            t = shares[(s["name"], tier)]
            if t.share < WARN_SHARE or t.window_max_deviation <= WARN_DEVIATION:
                continue
            line = (
                f"warning: source {s['name']} is up to {t.window_max_deviation * 100:.2f} "
                f"points off its {t.share * 100:.2f}% share in some step of the {tier} "
                f"config (goal: {WARN_DEVIATION * 100:.1f})"
            )
            causes = []
            bound = t.piece_bound or 0.0
            other = coarsest[tier]
            if bound > WARN_DEVIATION:
                causes.append(_step_too_small(mix, tier, t.share, bound))
            elif other is not None and other[1] > WARN_DEVIATION:
                causes.append(
                    f"the steps holding one of {other[0]}'s largest pieces (alone "
                    f"{other[1] * 100:.2f} points over its share) move this source's share too"
                )
            if groups is not None and s.get("groups", groups) < groups:
                causes.append(
                    f"its documents sit in {s['groups']} of the {groups} plan groups (a "
                    "document is in one group); raise plan.group_tokens for fewer groups"
                )
            out.append(": ".join([line, "; ".join(causes)]) if causes else line)
    return out


def _step_too_small(mix: dict[str, Any], tier: str, share: float, bound: float) -> str:
    """Why a source is off where its piece bound says no order of rows can do better: its
    largest unit alone is more than its share (plus the goal) of a step. The least step that
    could hold it, in whole rows (a necessary size, not a promise: ``docs/benchmarks.md``,
    "Mixtures", has what the planner reaches)."""
    step = int(mix["window_tokens"])
    row = max(1, step // max(1, int(mix.get("window_rows", {}).get(tier, 1))))
    largest = (bound + share) * step
    need = -(-int(largest / (share + WARN_DEVIATION)) // row) * row
    return (
        f"at this step no order of rows can bring it under {bound * 100:.2f} (its largest "
        f"piece alone is {(bound + share) * 100:.1f}% of a {step:,}-token step); a step needs "
        f"at least {need:,} tokens for it (--tokens-per-step)"
    )


def format_mixture(mix: dict[str, Any]) -> str:
    """The mixture's table for the terminal and the card."""
    lines = [
        "source        weight     docs     copies  repeats  subsampled  long share  "
        "short share  max dev/step (long, short)"
    ]
    for s in mix["sources"]:
        long, short = s.get("long", {}), s.get("short", {})
        lines.append(
            f"{s['name'][:12]:<12} {s['multiplier']:>7.3f} {s['documents']:>8,} "
            f"{s['copies']:>10,} {s['repeats']:>8,} {s['weight_dropped_docs']:>11,} "
            f"{long.get('share', 0) * 100:>10.2f}% {short.get('share', 0) * 100:>11.2f}%  "
            f"{long.get('window_max_deviation', 0) * 100:.2f} / "
            f"{short.get('window_max_deviation', 0) * 100:.2f} pts"
        )
    return "\n".join(lines)
