"""Check every packing invariant of an output folder; the same checker backs the tests.

It runs as tasks on an executor (``verify_part``: one part of the plan at a time, each
against its own shards; ``--executor ray`` spreads them over a cluster), and combines their
reduced results here: summed figures and order-independent comparisons of the pieces the
groups left to the tail. No process holds more than one part's segments (~40 bytes per
segment of a part) and no disk holds the dataset: an output or work folder on object storage
is read file by file. What is proved:

* per row: ``num_tokens == len(input_ids) == len(segment_ids) == sum(seq_lengths)``,
  ``1 <= num_tokens <= capacity``, ``segment_ids`` run 1..k contiguously with run lengths
  ``seq_lengths``, ``len(doc_ids) == len(seq_lengths)``, token ids inside the vocabulary;
  for chat outputs, ``labels`` has one entry per token, -100 at every segment start, and
  equals ``input_ids`` wherever it is not -100; for preference outputs, ``seq_roles`` pairs
  every prompt+chosen (1) with the prompt+rejected (2) right after it in its row, with the
  same doc id and the same leading untrained (prompt) tokens, and the pair is then compared
  as one document; for context-parallel outputs (``config.plan.cp_size`` > 1), every
  segment is its real tokens then the fewest pad tokens (``seq_pad``, all the run's EOS, all
  label -100) that make its length a multiple of ``2 * cp_size``, and the padding is left
  out of everything below (conservation holds for the real tokens; ``report.cp_padding``
  counts the padding);
* conservation: each segment is summarised as (doc id, length, 64-bit polynomial hash of its
  tokens in order). Against the tokenized shards, the multiset of segments of each config
  must equal the expected pieces of every document (whole documents; for ``split`` the
  consecutive ``long_len`` slices; for ``truncate`` the prefix) - so every token appears
  exactly once, in order, and nothing else appears; each segment's piece tag (``seq_pieces``,
  ``seq_last``) is part of its summary, so every document's pieces are numbered 0..k-1 in
  token order, once each, and only the k-th says it is the last;
* with a cost model (``run.cost_model``): each row's ``cost`` is the model's cost of its
  ``seq_lengths``;
* nesting: every short pack appears intact and contiguous inside exactly one long row (of
  its own part), and every short-sized segment of the long config belongs to a short pack;
* the shards themselves: each one's bytes have the sha256 recorded as it was written (an
  edited shard is named; it is hashed once, as it is read);
* bookkeeping: every figure ``packcli.json`` states (counts, sizes, hashes, efficiencies, the
  step plan, the quarantine) is derived again from the data it describes and the first that
  differs is named by its key (``figures.py`` says what comes from where, and what no data
  determines).

The expected pieces are derived here independently of the planner, so a planner bug cannot
hide itself. The first failure raises ``VerifyError`` with a precise message.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, MARKER, TOKENS_DIR, WORK_DIR
from packcli.pack.mixture import StepSums
from packcli.publish.figures import (
    ConfigScan,
    DocFigures,
    ShardFigures,
    check_figures,
    derive,
    rejected_counts,
)
from packcli.publish.marker import (
    Marker,
    ReportShape,
    TierCounts,
    read_json_object,
    read_marker,
    recorded_work_dir,
    work_folder,
)
from packcli.publish.verify_part import (
    PartResult,
    VerifyJob,
    cat_pieces,
    difference,
    differs,
    misnumbered,
    parts_of,
    reworded,
    verify_task,
)
from packcli.publish.verify_rows import Segments, fail
from packcli.records import OldRecordError, RecordError
from packcli.tokenize.records import SUCCESS, ShardIndex


def verify_remote(
    url: str, *, use_shards: bool = True, executor: Any = None, num_tasks: int | None = None
) -> dict[str, Any]:
    """Verify an output on object storage: its ``packcli.json`` (and ``rejected.jsonl``) are
    downloaded to a temp folder; the tasks read its data files from the store one at a time
    (``verify_copy``); messages name the URL."""
    from packcli.fs import download_output

    with tempfile.TemporaryDirectory(prefix="packcli-verify-") as tmp:
        local = Path(tmp) / "out"
        download_output(url, local, card=False, data=lambda rel: False)
        return verify_copy(
            local, url, Path(tmp), use_shards=use_shards, executor=executor, num_tasks=num_tasks
        )


def verify_copy(
    local: Path,
    url: str,
    scratch: Path,
    *,
    use_shards: bool = True,
    executor: Any = None,
    num_tasks: int | None = None,
) -> dict[str, Any]:
    """Verify the output at ``url`` from ``local``, a copy of its ``packcli.json`` (and, when
    there, of its data files, which are then read here instead of from the store;
    ``scratch``: a temp folder). The tokenized shards are those of the work folder the
    output names when it is on the store (read by the tasks), else this machine's staging
    folder of ``url`` (``fs.staging_root``) when it holds the same run's. Every message, and
    every path in the summary, names the URL and the work folder's URL, never the copies."""
    from packcli.fs import is_url, staging_root

    marker = read_marker(local)
    meta = marker.to_json()  # the whole file, for the checks and the tasks (``_verify``)
    names: dict[Path, str] = {local: url}
    recorded = recorded_work_dir(marker)
    copied = all((local / rel).is_file() for rel in _listed(marker))
    out = str(local) if copied else url
    try:
        found = _found_files(local) if copied else _remote_files(url)
        if use_shards and is_url(recorded):  # the work folder is on the store (workstore.py)
            from packcli.stages.workstore import WorkStore

            work = scratch / "work"
            WorkStore(recorded, work, url, scratch / "mirror-out").pull_records(TOKENS_DIR)
            names[work] = recorded
            shards = _shards_at(marker, work / TOKENS_DIR, recorded, use_shards)
        else:
            staged = staging_root(url) / WORK_DIR / TOKENS_DIR
            shards = _shards_at(marker, staged, None, use_shards, strict=False)
        summary = _verify(meta, local, out, found, shards, executor, num_tasks)
    except VerifyError as exc:
        raise VerifyError(reworded(str(exc), names)) from None
    renamed: dict[str, Any] = json.loads(reworded(json.dumps(summary), names))
    return renamed


def verify_folder(
    out: Path,
    url: str | None = None,
    *,
    use_shards: bool = True,
    executor: Any = None,
    num_tasks: int | None = None,
) -> dict[str, Any]:
    """The checks ``verify`` runs, for every caller that must refuse what verify refuses
    (``push``, ``push --dry-run``): ``out`` itself, or with ``url`` a downloaded copy of the
    output there (shards included when present, as verify finds them)."""
    if url is None:
        return verify_output(out, use_shards=use_shards, executor=executor, num_tasks=num_tasks)
    with tempfile.TemporaryDirectory(prefix="packcli-verify-") as tmp:
        return verify_copy(
            out, url, Path(tmp), use_shards=use_shards, executor=executor, num_tasks=num_tasks
        )


def verify_output(
    out: Path,
    *,
    use_shards: bool = True,
    work: Path | None = None,
    executor: Any = None,
    num_tasks: int | None = None,
) -> dict[str, Any]:
    """Verify the output folder ``out``; returns a summary dict or raises ``VerifyError``.
    ``work``: a work folder to look for the tokenized shards in, used only when they are
    this run's; ``executor`` (``stages.executors.Executor``, local when None) and
    ``num_tasks``: where the part checks run, and as how many tasks."""
    marker = read_marker(out)
    tokens_dir = work_folder(out, marker) / TOKENS_DIR
    shards = _shards_at(marker, tokens_dir, None, use_shards)
    if work is not None and use_shards:
        there = _shards_at(marker, work / TOKENS_DIR, None, use_shards, strict=False)
        shards = there if there.folder is not None else shards
    meta = marker.to_json()  # the whole file, for the checks and the tasks (``_verify``)
    return _verify(meta, out, str(out), _found_files(out), shards, executor, num_tasks)


def _listed(marker: Marker) -> list[str]:
    return [f"data/{n}/{f.file}" for n in CONFIG_NAMES for f in marker.files.of(n)]


def _found_files(out: Path) -> dict[str, list[str]]:
    folders = {name: out / "data" / name for name in CONFIG_NAMES}
    return {
        name: sorted(p.name for p in f.glob("*.parquet")) if f.is_dir() else []
        for name, f in folders.items()
    }


def _remote_files(url: str) -> dict[str, list[str]]:
    from packcli.fs import listing, locate

    fs, prefix = locate(url)
    there = listing(fs, prefix)
    found: dict[str, list[str]] = {name: [] for name in CONFIG_NAMES}
    for rel in there:
        parts = rel.split("/")
        if len(parts) == 3 and parts[:1] == ["data"] and parts[1] in found:
            found[parts[1]] += [parts[2]] if parts[2].endswith(".parquet") else []
    return {name: sorted(v) for name, v in found.items()}


@dataclass(frozen=True)
class _Shards:
    """Where the tokenized shards are (a folder, or a store's mirror of their records with
    the store's URL) and their index, or why they are not read (``folder`` None)."""

    folder: Path | None
    store: str | None
    index: ShardIndex | None
    state: str


def _shards_at(
    marker: Marker,
    tokens_dir: Path,
    store: str | None,
    use_shards: bool,
    *,
    strict: bool = True,
) -> _Shards:
    """The shards in ``tokens_dir`` (with ``store``: its mirror of the store's records) when
    they are this run's; another run's fail verify, unless not ``strict`` (a folder that
    may hold them, not the one the output names): then they are not read."""
    if not use_shards:
        return _Shards(None, None, None, "not read (--no-shards)")
    shown = f"{store.rstrip('/')}/{TOKENS_DIR}" if store else str(tokens_dir)
    success = tokens_dir / SUCCESS
    data = read_json_object(success) if success.is_file() else {}
    absent = _Shards(None, None, None, f"not found (no completed tokenize stage in {shown})")
    if not data:
        return absent
    try:
        index = ShardIndex.from_json(data, success)
    except OldRecordError:
        if not strict:
            return absent
        raise VerifyError(
            f"{shown}: tokenized shards of another packcli version: rerun the same packcli pack"
        ) from None
    except RecordError as exc:
        if not strict:
            return absent
        raise VerifyError(f"the tokenize stage's index is damaged: {exc}") from None
    this_run = index.fingerprint == marker.run.get("tokens_fingerprint")
    if not this_run and not strict:
        return absent
    if not this_run:
        fail(shown, "tokenized shards belong to another run")
    return _Shards(tokens_dir, store, index, f"checked: {len(index.shards)} shard(s) in {shown}")


def _verify(
    meta: dict[str, Any],
    local: Path,
    out: str,
    found: dict[str, list[str]],
    shards: _Shards,
    executor: Any,
    num_tasks: int | None,
) -> dict[str, Any]:
    """The checks: files listed, then every part on the executor, then what combines them."""
    from packcli.publish.recheck import SAMPLE_DOCS, check_against_input
    from packcli.stages.executors import Executor

    for name in CONFIG_NAMES:
        listed = [f["file"] for f in meta["files"][name]]
        if found[name] != sorted(listed):
            stray = [i for i, f in enumerate(listed) if f not in found[name]]
            named = f"files.{name}[{stray[0]}].file" if stray else f"files.{name}"
            fail(
                f"data/{name}",
                f"files {found[name]} do not match packcli.json's {named} {sorted(listed)}",
            )
    read = shards.folder is not None and shards.index is not None
    rows = None if shards.index is None else [m.num_docs for m in shards.index.shards]
    parts = parts_of(meta, rows)
    largest = (meta["report"].get("largest_document") or {}).get("doc_id")
    wanted = tuple(range(SAMPLE_DOCS)) + ((int(largest),) if isinstance(largest, int) else ())
    job = VerifyJob(
        out=out,
        meta=meta,
        parts=tuple(parts),
        tokens=str(shards.folder) if read and shards.store is None else None,
        store=shards.store,
        wanted=wanted,
    )
    executor = executor or Executor("local")
    tasks = max(1, min(len(parts), num_tasks or executor.default_tasks()))
    results = [r for batch in executor.map(verify_task, (job,), tasks) for r in batch]
    first, rest = results[0], results[1:]
    scans = {name: sum((r.scans[name] for r in rest), first.scans[name]) for name in CONFIG_NAMES}
    summary: dict[str, Any] = {
        "configs": {
            name: TierCounts(s.totals.rows, s.totals.tokens, s.totals.units).to_json()
            for name, s in scans.items()
        },
        "parts": len(parts),
        "tasks": tasks,
        "checked_against_shards": read,
        "shards": shards.state,
    }
    docs = first.docs  # None unless the output is one part
    figures: ShardFigures | None = None
    if read:
        _check_leftovers(results, scans)
        docs = sum((r.shard_docs for r in results if r.shard_docs is not None), DocFigures())
        figures = _largest([r.shard_figures for r in results if r.shard_figures is not None])
    held = None
    if meta["report"].get("mixture") is not None and "groups" in meta["report"]["mixture"]:
        held = _groups_holding(results)
    derived = derive(
        meta,
        local,
        scans,
        docs,
        figures,
        shards.index if read else None,
        rejected_counts(local),
        held,
    )
    summary["figures_checked"] = check_figures(meta, derived)
    report = ReportShape.from_json(meta["report"], MARKER, prefix="report.")
    pol = report.policy
    kept = report.input.tokens - pol.truncated_tokens - pol.dropped_tokens
    # A mixture's weights add repeats and remove a subset (counted in the plan, and the
    # multiset check above proved each document's copies one by one).
    kept += pol.repeat_tokens - pol.subsampled_tokens
    if scans["long"].totals.tokens != kept:
        fail(
            "config long",
            f"holds {scans['long'].totals.tokens} tokens; packcli.json's report.input.tokens minus "
            f"report.policy.truncated_tokens and dropped_tokens is {kept}",
        )
    # The shards came out of the same tokenize stage: also encode some input again.
    doc, length, digest, tags = cat_pieces([r.wanted for r in results])
    e = np.zeros(doc.size, np.int64)
    if meta["report"].get("mixture") is not None:
        # Not yet source-aware (per-source EOS, subsampled documents): left out (issue 26).
        summary["checked_against_input"] = {"skipped": "mixture"}
    else:
        summary["checked_against_input"] = check_against_input(
            meta, Segments(doc, length, digest, e, e, tags), wanted=frozenset(wanted)
        )
    return summary


def _largest(figures: list[ShardFigures]) -> ShardFigures | None:
    """The parts' length figures summed, with the file and line of the largest document."""
    if not figures:
        return None
    lengths = sum((f.lengths for f in figures[1:]), figures[0].lengths)
    top = next((f for f in figures if f.lengths.largest == lengths.largest), figures[0])
    return ShardFigures(lengths, top.largest_file, top.largest_line)


def _groups_holding(results: list[PartResult]) -> tuple[int, list[int]]:
    """A grouped mixture's groups, and how many hold each source in their long rows."""
    groups = [r.scans["long"].steps for r in results if not r.tail]
    holding = sum((StepSums.combined(s).sums.sum(axis=0) > 0).astype(np.int64) for s in groups if s)
    return len(groups), [int(x) for x in np.atleast_1d(holding)]


def _check_leftovers(results: list[PartResult], scans: dict[str, ConfigScan]) -> None:
    """The pieces the groups' files do not hold must be exactly those the tails hold (an
    output of one part: none), compared as multisets, so in any order of parts and tasks."""
    for name in CONFIG_NAMES:
        groups = [r.left[name] for r in results if r.left is not None and not r.tail]
        tails = [r.left[name] for r in results if r.left is not None and r.tail]
        found, expected = cat_pieces(tails), cat_pieces(groups)
        extra, missing = difference(found, expected)
        if missing[0].size:
            first = int(missing[0].min())
            extra = first if extra is None else min(extra, first)
        if extra is not None:
            if found[0].size == expected[0].size:  # the same tokens, other piece numbers?
                misnumbered(name + " (tail)", found, expected)
            want = sum(r.expected[name] for r in results)
            differs(name, extra, scans[name].totals.units, want)


__all__ = ["read_marker", "verify_folder", "verify_output", "verify_remote"]
