"""The run report: what packing did to the corpus, as data (``packcli.json``) and as text.

Every token of the input is accounted for: ``input.tokens`` = tokens written to the long
config + ``policy.truncated_tokens`` + ``policy.dropped_tokens``. The report holds no
timings, so the same inputs and config give a byte-identical ``packcli.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packcli.plan import Plan, tier_summary


def build_report(
    plan: Plan,
    lengths: np.ndarray,
    *,
    short_len: int,
    long_len: int,
    input_stats: dict[str, Any],
    largest_provenance: dict[str, Any] | None,
    chat: dict[str, Any] | None = None,
    tokenizer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    lengths = np.asarray(lengths, dtype=np.int64)
    stats = plan.stats
    largest = int(lengths.argmax()) if lengths.size else -1
    return {
        "input": {
            **input_stats,
            "documents": int(lengths.size),
            "tokens": int(lengths.sum()),
        },
        "documents_by_length": {
            "short": int(((lengths > 0) & (lengths <= short_len)).sum()),
            "long": int(((lengths > short_len) & (lengths <= long_len)).sum()),
            "overlong": int((lengths > long_len).sum()),
            "empty": int((lengths == 0).sum()),
        },
        "policy": {
            k: stats[k]
            for k in (
                "split_docs",
                "split_pieces",
                "split_tokens",
                "truncated_docs",
                "truncated_tokens",
                "dropped_docs",
                "dropped_tokens",
                "empty_docs",
            )
        },
        "tiers": {
            "short": tier_summary(plan.short),
            # Attention cost balance: max/mean over rows of sum(segment length^2).
            "long": {
                **tier_summary(plan.long),
                "attention_balance": stats.get("long_attention_balance"),
            },
        },
        "largest_document": {
            "doc_id": largest,
            "tokens": int(lengths[largest]) if largest >= 0 else 0,
            **(largest_provenance or {}),
        },
        # Chat: what was removed while tokenizing (dialogues kept as empty documents, so
        # `documents_by_length.empty` counts them too). None for text.
        "chat": chat,
        # Tokenizer-file settings packcli turned off, and special-token strings in documents.
        "tokenizer": tokenizer,
    }


_CORRUPT_SHOWN = 5  # damaged files listed on the terminal; packcli.json lists all


def _n(x: int) -> str:
    return f"{x:,}"


def format_report(report: dict[str, Any]) -> str:
    """A compact human-readable report for the terminal."""
    inp = report["input"]
    pol = report["policy"]
    by_len = report["documents_by_length"]
    lines = [
        f"input     {_n(inp['documents'])} documents, {_n(inp['tokens'])} tokens "
        f"from {inp.get('files', '?')} file(s)",
        f"          by length: {_n(by_len['short'])} short, {_n(by_len['long'])} long, "
        f"{_n(by_len['overlong'])} overlong, {_n(by_len['empty'])} empty",
        "",
        f"{'tier':<6}{'capacity':>10}{'rows':>12}{'tokens':>16}{'efficiency':>12}"
        f"{'bound':>10}{'rows/bound':>12}",
    ]
    for name, t in report["tiers"].items():
        lines.append(
            f"{name:<6}{_n(t['capacity']):>10}{_n(t['rows']):>12}{_n(t['tokens']):>16}"
            f"{t['efficiency']:>11.4%} {_n(t['lower_bound_rows']):>10}"
            f"{t['rows_over_bound']:>12.5f}"
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
    rejected = inp.get("rejected") or {}
    if rejected:
        reasons = ", ".join(f"{k} {v:,}" for k, v in rejected.items())
        lines.append(f"rejected  {_n(inp['rejected_lines'])} lines ({reasons}): rejected.jsonl")
    corrupt = inp.get("corrupt_streams") or []
    for entry in corrupt[:_CORRUPT_SHOWN]:
        lines.append(
            f"corrupt   {entry['file']}: kept its first {_n(entry['kept_lines'])} lines, "
            f"discarded the rest ({entry['reason']})"
        )
    if len(corrupt) > _CORRUPT_SHOWN:
        lines.append(f"          and {len(corrupt) - _CORRUPT_SHOWN} more file(s): packcli.json")
    chat = report.get("chat")
    if chat:
        lines.append(
            f"chat      {_n(chat['dialogues'])} dialogues; dropped {_n(chat['no_trainable'])} "
            f"with nothing to train, {_n(chat['truncate_dropped'])} too long for one turn; "
            f"truncated {_n(chat['truncated'])} at a turn ({_n(chat['truncated_tokens'])} "
            "tokens removed)"
        )
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
    tok = report.get("tokenizer") or {}
    for what in tok.get("disabled_settings", []):
        lines.append(f"tokenizer the tokenizer file enables {what}: turned off, nothing was cut")
    found = (tok.get("special_strings") or {}).get("occurrences", 0)
    if found:
        mode = tok.get("special_in_text")
        as_what = "plain text" if mode == "text" else "special tokens"
        names = ", ".join(f"{k} {v:,}" for k, v in tok["special_strings"]["by_token"].items())
        lines.append(
            f"specials  {_n(found)} special-token strings inside documents, encoded as "
            f"{as_what} (--special-in-text {mode}): {names}"
        )
    big = report["largest_document"]
    if big["doc_id"] >= 0:
        where = f" at {big['file']}:{big['line']}" if "line" in big else ""
        if "row" in big:  # a Parquet/Arrow file: rows count from 0
            where = f" at {big['file']} row {big['row']}"
        lines.append(f"largest   doc {big['doc_id']}: {_n(big['tokens'])} tokens{where}")
    return "\n".join(lines)
