"""The finalize stage: checks every output file is written, removes strays, gathers the
quarantined lines, builds the report and the card, and writes ``packcli.json`` last (then
uploads a remote output)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli import __version__
from packcli.atomic import atomic_write_bytes, atomic_write_json
from packcli.config import RunConfig
from packcli.errors import PackcliError
from packcli.faults import crash_point
from packcli.fs import redact
from packcli.names import CONFIG_NAMES, MARKER, STATS_DIR
from packcli.pack.plan import RowLayout, RowTotals
from packcli.publish.card import render_card
from packcli.publish.marker import Marker, MarkerFiles, MarkerPart
from packcli.publish.report import (
    LengthStats,
    build_report,
    cp_padding_report,
    mixture_report,
)
from packcli.publish.report_records import InputFiles, Provenance
from packcli.records import read_record
from packcli.stages.index import gather_rejects, index_tokens
from packcli.stages.plan import PlanSet, load_part, load_plan, stored_config
from packcli.stages.plan_records import PLAN
from packcli.stages.work import owned_outputs, recorded_read, require_out
from packcli.stages.workstore import in_mirror, work_store
from packcli.stages.write import cost_model_of, write_fingerprint, write_tail
from packcli.stages.write_records import WRITE_DIR, FileRecord, Listing, file_record_name
from packcli.tokenize.records import ShardIndex
from packcli.tokenize.shards import TokenShards
from packcli.write import pad_token_id

log = logging.getLogger(__name__)


@in_mirror
def finalize_stage(
    cfg: RunConfig,
    *,
    command: str = "",
    plan: PlanSet | None = None,
    tokens_per_step: int | None = None,
) -> dict[str, Any]:
    """Check every output file is written, remove strays, write the card and the marker.
    ``tokens_per_step``: the report's step-plan target [the plan's ``tokens_per_step``]."""
    out = require_out(cfg)
    store = work_store(cfg)
    store.pull_records(WRITE_DIR)  # index_tokens pulls the tokenize stage's records
    shards = index_tokens(cfg)
    if plan is None:  # else ``pack`` made it in this process, and plan.json is here
        store.pull(PLAN)
        plan = load_plan(cfg.work_path, shards)
    cfg = stored_config(cfg)
    if tokens_per_step is None:
        tokens_per_step = cfg.plan.tokens_per_step
    # The tail's files, when no write task wrote them (separate write tasks write groups).
    write_tail(cfg, plan, shards, quiet=True)
    fingerprint = write_fingerprint(cfg, shards)
    files, versions = _written_files(cfg, plan, fingerprint)
    owned = owned_outputs(cfg)
    _remove_strays(cfg, out, files, owned)
    gather_rejects(cfg, out, shards)
    report = _report(cfg, report_rows(cfg, plan, shards), shards, tokens_per_step)
    run_info: dict[str, Any] = {
        "packcli_version": __version__,
        "command": command,
        "tokenizer": shards.success.tokenizer,
        "tokenizer_backend": shards.success.backend,
        "format": cfg.chat.format,
        "inputs": shards.success.files,
        "tokens_fingerprint": shards.success.fingerprint,
        # Inputs + tokenizer + every setting the Parquet bytes depend on.
        "fingerprint": fingerprint,
        "work_dir": store.record_name(out),
    }
    if (model := cost_model_of(cfg)) is not None:  # the ``cost`` column's coefficients
        run_info["cost_model"] = {"spec": cfg.write.cost_model, **dataclasses.asdict(model)}
    for stale in (out / STATS_DIR).glob("*.png"):  # plots of an earlier run; `stats` remakes them
        stale.unlink()
    crash_point("finalize")
    marker = Marker(_recorded_config(cfg), run_info, report, files, plan_parts(plan)).to_json()
    card = render_card(report, run_info, files, out)
    atomic_write_bytes(out / "README.md", card.encode("utf-8"))
    atomic_write_json(out / MARKER, marker)
    # A remote output: every file is final here, put (or checked) with packcli.json last.
    store.publish(marker["files"], versions, owned=frozenset(owned), threads=cfg.tokenize.threads)
    return report


def plan_parts(plan: PlanSet) -> list[MarkerPart]:
    """``packcli.json``'s ``parts``: each planned part's token shards (none for the tail) and
    the range of each config's files it wrote (files never straddle parts), so ``verify``
    checks the output part by part, each part's files against its own shards."""
    ranges: list[dict[str, tuple[int, int]]] = []
    first = dict.fromkeys(CONFIG_NAMES, 0)
    for part in plan.parts:
        files = {}
        for name in CONFIG_NAMES:
            files[name] = (first[name], first[name] + len(part.files[name]))
            first[name] += len(part.files[name])
        ranges.append(files)
    for name in CONFIG_NAMES:
        if not first[name] and ranges:  # a config without rows: its one empty file (jobs)
            ranges[0][name] = (0, 1)
    return [
        MarkerPart(
            part.name,
            list(part.shards),
            files,
            None if part.slices is None else list(part.slices),
        )
        for part, files in zip(plan.parts, ranges, strict=True)
    ]


@dataclass(frozen=True)
class PlanRows:
    """What the report needs of the plan: each config's rows summed (``RowTotals``: rows,
    pieces, tokens, the largest row, attention costs), the plan's counts, and the pairs each
    config holds. Summed part by part, so finalize holds one part's plan at a time and
    O(parts) figures, never a value per row or piece of the corpus."""

    tiers: dict[str, RowTotals]
    stats: dict[str, Any]
    pairs: dict[str, int]
    padding: dict[str, int]  # context-parallel pad tokens per config


def report_rows(cfg: RunConfig, planset: PlanSet, shards: TokenShards) -> PlanRows:
    """Read each part's plan in turn and keep only its rows' sums (one part in memory)."""
    capacity = {"short": planset.config.short_len, "long": planset.config.long_len}
    tiers = {name: RowTotals(capacity[name]) for name in CONFIG_NAMES}
    pairs = dict.fromkeys(CONFIG_NAMES, 0)
    padding = dict.fromkeys(CONFIG_NAMES, 0)
    preference = shards.success.preference is not None
    for part in planset.parts:
        work_store(cfg).pull(*part.arrays)
        plan, _ = load_part(cfg.work_path, planset, part)
        for name in CONFIG_NAMES:
            layout: RowLayout = getattr(plan, name)
            totals = RowTotals.of(layout, plan.piece_len)
            tiers[name] = tiers[name] + totals
            padding[name] += int(layout.row_tokens.sum()) - totals.tokens
            if preference:
                docs = plan.piece_doc[layout.row_pieces]
                pairs[name] += int((shards.column_at("chosen_len", docs) > 0).sum())
        del plan
    stats = dict(planset.stats)
    if len(planset.parts) > 1:  # one part: its own figure (the balancer's, when it ran)
        stats["long_attention_balance"] = {"ratio": tiers["long"].balance}
    return PlanRows(tiers, stats, pairs, padding)


def length_stats(cfg: RunConfig, shards: TokenShards) -> LengthStats:
    """The documents' length figures, shard by shard (one shard's lengths in memory)."""
    total = LengthStats()
    for s in range(len(shards)):
        lengths = shards.shard_column(s, "length")
        first = int(shards.first_doc_ids[s])
        total = total + LengthStats.of(lengths, cfg.plan.short_len, cfg.plan.long_len, first)
    return total


def _written_files(
    cfg: RunConfig, plan: PlanSet, fingerprint: str
) -> tuple[MarkerFiles, dict[str, dict[str, str]]]:
    """Every output file's write record (what ``packcli.json`` lists), per config, and the
    store's version of each file a write task put on the store itself (by relative path);
    fails naming one that is missing or was written for another plan or settings."""
    files: dict[str, list[Listing]] = {name: [] for name in CONFIG_NAMES}
    versions: dict[str, dict[str, str]] = {}
    missing = []
    for job in plan.jobs():
        name = file_record_name(job.config, job.index)
        record = read_record(FileRecord, cfg.work_path / WRITE_DIR / name)  # None: not done
        if record is None or record.fingerprint != fingerprint:
            missing.append(name.removesuffix(".json"))
            continue
        if record.store_version is not None:
            versions[f"data/{job.config}/{record.file}"] = record.store_version
        files[job.config].append(record.listing())
    if missing:
        raise PackcliError(
            f"write task(s) not finished: {len(missing)} output file(s) missing, "
            f"e.g. {missing[0]}; run `packcli write` for every task first"
        )
    return MarkerFiles(**files), versions


def _remove_strays(cfg: RunConfig, out: Path, files: MarkerFiles, owned: set[str]) -> None:
    """Parquet files of an earlier, different plan (only those packcli's records say it
    wrote: ``owned``), temp files of crashes, records a killed task was writing (every
    write task is done now, so none is live). Any other file is left where it is."""
    for name in CONFIG_NAMES:
        keep = {f.file for f in files.of(name)}
        for f in (out / "data" / name).glob("*"):
            if f.name in keep:
                continue
            if ".tmp-" in f.name or f"data/{name}/{f.name}" in owned:
                f.unlink()
            else:
                log.warning("%s: not packcli's, left alone", f)
    for f in (cfg.work_path / WRITE_DIR).glob(".*.tmp-*"):
        f.unlink()


def _report(
    cfg: RunConfig, rows: PlanRows, shards: TokenShards, tokens_per_step: int
) -> dict[str, Any]:
    """The run's report, from the plan's rows, the documents' lengths and the stage's index."""
    lengths = length_stats(cfg, shards)
    largest = lengths.largest
    read_stats = shards.success.read_stats
    entry = shards.success.files[shards.value("file_index", largest)]
    report = build_report(
        rows.tiers,
        rows.stats,
        lengths,
        input_stats=InputFiles(
            files=len(shards.success.files),
            blank_lines=read_stats["blank_lines"],
            bytes=sum(f["size"] for f in shards.success.files),
            rejected_lines=sum(read_stats.get("rejected", {}).values()),
            rejected=read_stats.get("rejected", {}),
            corrupt_streams=read_stats.get("corrupt_streams") or None,
        ),
        chat=shards.success.chat,
        tokenizer=tokenizer_report(shards.success),
        largest_provenance=(
            # A row (0-based) of a Parquet/Arrow file, a line (1-based) of a jsonl file.
            Provenance(entry["path"], row=shards.value("line", largest))
            if "format" in entry
            else Provenance(entry["path"], line=shards.value("line", largest))
        ),
        preference=shards.success.preference,
        tokens_per_step=tokens_per_step,
        cp_padding=cp_padding_report(
            cfg.plan.cp_size,
            cfg.plan.pad_multiple,
            pad_token_id(shards.success.tokenizer),
            {name: rows.tiers[name].tokens for name in CONFIG_NAMES},
            rows.padding,
        )
        if cfg.plan.cp_size > 1
        else None,
    )
    if "mixture_spec" in rows.stats:  # a mixture: its sources and the token account
        report["mixture"] = mixture_report(
            rows.stats, shards.success.sources or [], cfg.plan.tokens_per_step
        )
        report["mixture"]["mode"] = cfg.mix_mode or "epochs"
        report["policy"]["repeat_tokens"] = report["mixture"]["repeat_tokens"]
        report["policy"]["subsampled_tokens"] = report["mixture"]["subsampled_tokens"]
    if shards.success.preference is not None:
        # The plan places a pair as one piece; the output holds it as two segments, which is
        # what ``tiers.*.segments`` counts (and ``preference.kept_pairs``, the pairs written).
        for name in CONFIG_NAMES:
            report["tiers"][name]["segments"] += rows.pairs[name]
        report["preference"]["kept_pairs"] = rows.pairs["long"]
    return report


def _recorded_config(cfg: RunConfig) -> dict[str, Any]:
    """``cfg`` as ``packcli.json`` records it (URLs redacted)."""
    data = cfg.to_dict()
    data["out"] = redact(data["out"])
    data["read"] = recorded_read(cfg.read)
    return data


def tokenizer_report(index: ShardIndex) -> dict[str, Any]:
    """What the tokenizer did that the user should know: settings of the tokenizer file that
    were turned off, and special-token strings met inside documents (by token, most first)."""
    info = index.tokenizer
    found = index.special_strings
    return {
        "disabled_settings": info.get("disabled", []),
        "special_in_text": info.get("special_in_text"),
        "special_strings": {
            "occurrences": sum(found.values()),
            "by_token": dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))[:20]),
        },
    }
