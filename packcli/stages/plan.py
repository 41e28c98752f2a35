"""The plan stage: the documents' lengths planned by groups of token shards, plus the tail
the groups released (``packcli.pack.groups``; a corpus of one group is one global plan,
``packcli.pack.plan``). Each part is saved with a digest of its arrays, and ``plan.json``
lists the parts and the row ranges of their output files, so a write task loads only the
parts it writes."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli import __version__
from packcli.atomic import atomic_write_json, atomic_writer
from packcli.config import (
    ChatConfig,
    PlanConfig,
    ReadConfig,
    RunConfig,
    SourceConfig,
    TokenizeConfig,
    WriteConfig,
)
from packcli.errors import ConfigError, InputError, PackcliError
from packcli.faults import crash_point
from packcli.names import CONFIG_NAMES, TOKENS_DIR
from packcli.pack.groups import (
    RELEASE_RULE,
    Ballast,
    Pieces,
    Slice,
    balance_tail,
    group_count,
    part_rows_multiple,
    plan_group,
    plan_tail,
    policy_counts,
    shard_groups,
    source_slices,
    whole_shards,
)
from packcli.pack.mixture import (
    MixSpec,
    SourceCounts,
    StepFigures,
    StepSums,
    WindowEdges,
    WindowSpread,
    add_stats,
    copies,
    exchange_plan,
    expand,
    multipliers_from_shares,
    order_plan,
    row_source_tokens,
    source_of,
    straddling_deviation,
    window_edges,
)
from packcli.pack.plan import PLACEMENT_RULE, Plan, RowLayout, plan_two_tier
from packcli.records import OldRecordError, RecordError, read_record
from packcli.stages.index import gather_rejects, index_tokens
from packcli.stages.plan_records import (
    GROUPS,
    PLAN,
    PLAN_DIR,
    STEPS,
    TAIL,
    GroupRecord,
    GroupsRecord,
    PlanInputs,
    PlanPart,
    PlanRecord,
    StepRows,
    StepsRecord,
)
from packcli.stages.progress import progress_bar
from packcli.stages.work import REJECTED, fingerprint, read_json, require_out
from packcli.stages.workstore import LocalWork, in_mirror, work_store
from packcli.stages.write_records import WRITE_DIR, WRITE_SETTINGS, WriteSettings
from packcli.tokenize.records import STAGE, StageRecord
from packcli.tokenize.shards import TokenShards, sha256_file
from packcli.write import file_ranges, files_wanted

log = logging.getLogger(__name__)


def plan_fingerprint(
    plan_cfg: PlanConfig, tokens_fingerprint: str, mix: MixSpec | None = None, step: bool = True
) -> str:
    """What a plan is made from. A mixture's weights and policies change the plan: never
    mixed. So does its step (the windows its rows are ordered for), unless ``step`` is False
    (the groups' cut, which does not depend on it); a plain corpus's rows never do."""
    settings = dataclasses.asdict(plan_cfg)
    tokens_per_step = settings.pop("tokens_per_step")
    mixture = None if mix is None else {**mix.as_record(), "order": MIX_ORDER_RULE}
    if mixture is not None and step:
        mixture["tokens_per_step"] = tokens_per_step
    inputs = PlanInputs(
        tokens_fingerprint,
        settings,
        __version__,
        RELEASE_RULE,
        PLACEMENT_RULE,
        mixture,
    )
    return fingerprint(inputs.to_json())


# The row order's rule for a mixture, as a version (part of the plan's fingerprint).
# 2: long rows' units exchanged between windows (issue 26); 3: a grouped plan's too, on the
# output's windows (the second pass, ``_exchange_groups``).
# 4: the second pass saves each group's tokens per source per row (``_rows_rel``).
# 5: groups are runs of each source's documents, 1/G of its tokens each (``source_slices``).
# 6: a group gives the tail whole rows besides its released pieces (``balance_tail``), and
# the last group counts the tail's rows in the window they share (``StepRows.tail_rows``).
# 7: large long pieces one to a row (``plan_two_tier(spread=True)``).
# 8: a group keeps a multiple of the exchange window's long rows (``balance_tail(align=)``).
MIX_ORDER_RULE = 8


def mix_spec(cfg: RunConfig, shards: TokenShards) -> tuple[MixSpec, np.ndarray] | None:
    """The run's mixture as the planner needs it (share mode: multipliers from the counted
    tokens of each source) and each source's first doc id; None without sources."""
    index = shards.success.sources
    if not cfg.sources:
        return None
    if not index or [s.name for s in index] != [s.name for s in cfg.sources]:
        raise PackcliError(
            "the tokenized shards were made for other sources: run `packcli tokenize` again"
        )
    if cfg.mix_mode == "share":
        tokens = np.array([s.tokens for s in index], np.float64)
        if (tokens == 0).any():
            empty = [s.name for s in index if not s.tokens]
            raise InputError(f"source(s) {', '.join(empty)} have no tokens: no share possible")
        shares = np.array([s.share or 0.0 for s in cfg.sources], np.float64)
        multipliers = multipliers_from_shares(shares, tokens)
    else:
        multipliers = np.array([1.0 if s.weight is None else s.weight for s in cfg.sources])
    try:
        spec = MixSpec(
            tuple(s.name for s in cfg.sources),
            tuple(float(m) for m in multipliers),
            tuple(cfg.source_settings(k)["overlong"] for k in range(len(cfg.sources))),
            cfg.plan.seed,
        )
    except ValueError as exc:
        raise ConfigError(f"sources: {exc} (a share this large needs more of its tokens)") from exc
    return spec, np.array([s.first_doc for s in index], np.int64)


@dataclass(frozen=True)
class PlanSet:
    """The saved plan: its parts in output order (groups, then the tail) and the settings it
    was made with. Parts' arrays are loaded one at a time (``load_part``), so no process
    needs the plan of the whole corpus to write its share."""

    parts: tuple[PlanPart, ...]
    config: PlanConfig
    stats: dict[str, Any]
    shard_tokens: int  # write.shard_tokens the files were cut by
    min_files: int | None = None  # and write.min_files
    cost_model: str | None = None  # write.cost_model as planned (``packcli write`` takes it)

    def jobs(self) -> list[FileJob]:
        """Every output file, in a fixed order: per config, part after part."""
        jobs = []
        for name in CONFIG_NAMES:
            count = sum(len(p.files[name]) for p in self.parts)
            if not count:  # a config with no rows: one empty file, so it still loads
                jobs.append(FileJob(name, 0, 1, 0, 0, 0))
                continue
            i = 0
            for k, part in enumerate(self.parts):
                for r0, r1 in part.files[name]:
                    jobs.append(FileJob(name, i, count, k, r0, r1))
                    i += 1
        return jobs


@dataclass(frozen=True)
class FileJob:
    """One output Parquet file: config, index and count (its name), and which rows of which
    part it holds."""

    config: str
    index: int
    count: int
    part: int
    r0: int
    r1: int

    @property
    def rel(self) -> str:
        return f"data/{self.config}/train-{self.index:05d}-of-{self.count:05d}.parquet"


def _groups(cfg: RunConfig, shards: TokenShards) -> list[list[Slice]]:
    """The documents of each group, as runs of shards' rows: from the corpus's tokens and
    ``plan.group_tokens`` only. A plain corpus's groups stride over whole shards; a
    mixture's each hold an equal part of the tokens every source puts in the output
    (``source_slices``, ``_copy_weights``), saved in ``plan/groups.json`` for the tasks."""
    n_groups = group_count(int(shards.success.tokens), cfg.plan.group_tokens)
    docs = [m.num_docs for m in shards.manifests]
    mix = mix_spec(cfg, shards) if cfg.sources else None
    if mix is None or n_groups == 1:
        return [whole_shards(g, docs) for g in shard_groups(len(shards), n_groups)]
    fp = plan_fingerprint(cfg.plan, shards.success.fingerprint, mix[0], step=False)
    store = work_store(cfg)
    store.pull(GROUPS)
    saved = read_record(GroupsRecord, cfg.work_path / GROUPS)
    if saved is not None and saved.fingerprint == fp:
        return [list(g) for g in saved.groups]
    shard_source, weights, weights_of = _copy_weights(shards, *mix)
    groups = source_slices(shard_source, weights, np.array(docs, np.int64), n_groups, weights_of)
    (cfg.work_path / PLAN_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_json(cfg.work_path / GROUPS, GroupsRecord(fp, groups).to_json())
    store.push(GROUPS)
    return groups


def _copy_weights(
    shards: TokenShards, spec: MixSpec, first_doc: np.ndarray
) -> tuple[np.ndarray, np.ndarray, Callable[[int], np.ndarray]]:
    """Each shard's source, the tokens its documents' copies put in the output, and per
    shard a function of its documents' such tokens (``copies x length``), for
    ``source_slices``. Why copies: a weight below 1 keeps a subset of a source's documents
    (above 1, repeats some), so equal parts of a source's documents' tokens can hold
    unequal parts of its kept tokens (one group's books 9.1%, another's 10.8%, for 9.8%,
    in the benchmark). A source of a whole multiplier needs no lengths here: its copies'
    tokens are the manifests' counts times it, and only the shards a cut falls in are
    read; a fractional one has every shard's lengths read once."""
    starts = np.asarray(shards.first_doc_ids, np.int64)
    shard_source = source_of(starts, first_doc)
    fractional = np.array([not float(m).is_integer() for m in spec.multipliers])

    def weights_of(s: int) -> np.ndarray:
        lens = shards.shard_column(s, "length").astype(np.int64)
        k = int(shard_source[s])
        if not fractional[k]:
            return lens
        index = starts[s] - first_doc[k] + np.arange(lens.size, dtype=np.int64)
        return np.asarray(lens * copies(index, np.full(lens.size, k, np.int64), spec), np.int64)

    weights = np.array([m.num_tokens for m in shards.manifests], np.int64)
    for s in np.flatnonzero(fractional[shard_source]):
        weights[s] = int(weights_of(int(s)).sum())
    return shard_source, weights, weights_of


def _group_name(g: int) -> str:
    return f"group-{g:05d}"


def _group_path(cfg: RunConfig, g: int) -> Path:
    return cfg.work_path / PLAN_DIR / f"{_group_name(g)}.json"


def _group_record(cfg: RunConfig, g: int) -> GroupRecord:
    """A planned group's record (``_plan_groups`` made every one it was asked for)."""
    record = read_record(GroupRecord, _group_path(cfg, g))
    if record is None:
        raise PackcliError(f"{_group_path(cfg, g)}: missing or damaged; run `packcli plan` again")
    return record


@in_mirror
def plan_task(
    cfg: RunConfig, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = False
) -> None:
    """Plan this task's groups (every ``num_tasks``-th from ``task_index``), each saved with
    a record; a group whose record has the current fingerprint is kept (resume)."""
    require_out(cfg)
    shards = index_tokens(cfg)
    groups = _groups(cfg, shards)
    mine = range(task_index, len(groups), num_tasks)
    with progress_bar(quiet, total=len(mine), desc="plan") as bar:
        _plan_groups(cfg, shards, groups, mine, bar.update)


def _plan_groups(
    cfg: RunConfig,
    shards: TokenShards,
    groups: list[list[Slice]],
    mine: range,
    on_group: Callable[[int], object],
) -> None:
    """Plan and save the groups in ``mine`` that have no current record, one at a time (a
    process holds one group's lengths and plan)."""
    # The files a group's rows are cut into are part of its record: their size too.
    mix = mix_spec(cfg, shards)
    fp = fingerprint(
        [
            plan_fingerprint(cfg.plan, shards.success.fingerprint, mix and mix[0]),
            *_file_cut(cfg.write),
        ]
    )
    store = work_store(cfg)
    (cfg.work_path / PLAN_DIR).mkdir(parents=True, exist_ok=True)
    sliced = mix is not None and len(groups) > 1  # groups may share a shard's rows
    for g in mine:
        name = _group_name(g)
        store.pull(f"{PLAN_DIR}/{name}.json")
        if _reusable(store, read_record(GroupRecord, _group_path(cfg, g)), fp):
            on_group(1)
            continue
        members = groups[g]
        lengths = _group_lengths(shards, members)
        ballast = None
        if mix is not None:
            plan, tail, ballast = _plan_mixed(cfg, shards, members, lengths, mix, g, len(groups))
        elif len(groups) == 1:  # one group: the global plan, nothing released
            plan, tail = plan_two_tier(lengths, cfg.plan), Pieces.concat([])
        else:
            grouped = plan_group(lengths, _group_docs(shards, members), cfg.plan, g)
            plan, tail = grouped.plan, grouped.tail
        del lengths
        part = _save_part(
            cfg, name, plan, members, tail, len(groups), sliced=sliced, ballast=ballast
        )
        files = {
            rel: ((cfg.work_path / rel).stat().st_size, sha256_file(cfg.work_path / rel))
            for rel in part.arrays
        }
        record = GroupRecord(fingerprint=fp, part=part, stats=plan.stats, files=files)
        atomic_write_json(_group_path(cfg, g), record.to_json())
        store.push(*part.arrays, f"{PLAN_DIR}/{name}.json")
        on_group(1)


@in_mirror
def plan_stage(
    cfg: RunConfig,
    *,
    quiet: bool = False,
    run_tasks: Callable[[Callable[..., None]], object] | None = None,
) -> tuple[PlanSet, TokenShards]:
    """The plan over the lengths of all tokenized documents, by groups of shards plus the
    tail (``packcli.pack.groups``; a corpus of one group is one global plan); saved for the
    write tasks. ``run_tasks(plan_task)`` runs the group tasks (an executor's map); what
    they left undone, and the tail, are planned here. A grouped mixture then has a second
    pass (``run_tasks(steps_task)``, the rest here): each group's long rows exchanged on
    the output's step windows, which start where the groups before it end.

    The finished output (if any) stays complete: its Parquet files do not change here."""
    require_out(cfg)
    shards = index_tokens(cfg)
    if shards.num_docs == 0:
        raise InputError(_no_documents(cfg, shards))
    groups = _groups(cfg, shards)
    mix = mix_spec(cfg, shards)
    if run_tasks is not None and len(groups) > 1:
        run_tasks(plan_task)
    second = len(groups) if mix is not None and len(groups) > 1 else 0  # the second pass
    with progress_bar(quiet, total=len(groups) + (len(groups) > 1) + second, desc="plan") as bar:
        _plan_groups(cfg, shards, groups, range(len(groups)), bar.update)
        records = [_group_record(cfg, g) for g in range(len(groups))]
        parts = [r.part for r in records]
        # One group: its plan's own stats (the balancer's too); several: the policy's, summed.
        stats: dict[str, Any] = (
            dict(records[0].stats)
            if len(groups) == 1
            else policy_counts([r.stats for r in records])
        )
        if len(groups) > 1:
            # Every given piece once, in one set of arrays (not a list and its concat), and
            # the rows a mixture's groups gave whole, their pieces among them.
            sizes = [p.tail_pieces for p in parts]
            ballasts: list[Ballast] = []

            def load(k: int) -> Pieces:
                tail, ballast = _load_tail(cfg, parts[k])
                if ballast is not None:
                    ballasts.append(ballast)
                    firsts.append(sum(sizes[:k]))
                return tail

            firsts: list[int] = []
            tails = Pieces.gather(sizes, load)
            given = Ballast.concat(ballasts, firsts) if ballasts else None
            tail_plan = plan_tail([tails], cfg.plan, given, spread=mix is not None)
            del tails, given, ballasts
            if mix is not None:  # the tail's rows start after every group's
                tail_plan, spread = order_plan(
                    tail_plan, mix[1], cfg.plan.tokens_per_step, mix[0].seed, exchange=False
                )
                first_row = sum(p.rows["long"] for p in parts)
                tail_plan, _ = exchange_plan(
                    tail_plan, mix[1], spread["long"], mix[0].seed, first_row
                )
                tail_edges = _long_edges(tail_plan, mix[1], spread["long"], first_row)
                tail_rows = _long_sources(tail_plan, mix[1])
            parts.append(_save_part(cfg, TAIL, tail_plan, (), None, 0))
            work_store(cfg).push(f"{PLAN_DIR}/{TAIL}.npz")
            stats.update(groups=len(groups), tail_tokens=tail_plan.stats["tail_tokens"])
            if mix is not None:  # long rows its groups gave the tail whole (``balance_tail``)
                stats["tail_rows_given"] = tail_plan.stats.get("ballast_rows", 0)
            bar.update(1)
        if second:
            at = StepRows.of(parts, tail_rows)
            atomic_write_json(cfg.work_path / PLAN_DIR / f"{STEPS}.json", at.to_json())
            work_store(cfg).push(f"{PLAN_DIR}/{STEPS}.json")
            if run_tasks is not None:
                run_tasks(steps_task)
            _exchange_groups(cfg, shards, at, range(len(groups)), bar.update)
            steps = [_steps_record(cfg, g) for g in range(len(groups))]
            parts[:-1] = [x.part for x in steps]
            stepped = [_json(x.mixture_windows) for x in steps]
            records = [
                dataclasses.replace(r, stats={**r.stats, "mixture_windows": w})
                for r, w in zip(records, stepped, strict=True)
            ]
        if len(groups) > 1 and mix is not None:
            # The long config's steps across parts (a grouped mixture had its second pass).
            counts, spreads = _mixture_stats(records)
            assert tail_edges.tokens is not None  # ``_long_edges`` counts them
            tokens = np.array(spreads["long"].tokens, np.float64) + tail_edges.tokens
            edges = [*(x.edges for x in steps), tail_edges]
            worst = straddling_deviation(edges, tokens / max(tokens.sum(), 1.0))
            spreads["long"] = dataclasses.replace(
                spreads["long"], straddling_max_deviation=[round(float(x), 6) for x in worst]
            )
            # What the output's steps hold: its windows, against its share (the figures
            # above are each group's own, against the group's share).
            windows = {n: w.window_rows for n, w in spreads.items()}
            honest, held = _output_steps(cfg, parts, tail_plan, mix[1], windows)
            spreads = {n: w.over_output(honest[n]) for n, w in spreads.items()}
            stats["mixture"] = {n: c.to_json() for n, c in counts.items()}
            stats["mixture_windows"] = _json(spreads)
            stats["mixture_groups"] = {"groups": len(groups), "holding": held}
    if mix is not None:
        stats["mixture_spec"] = {**mix[0].as_record(), "first_doc": mix[1].tolist()}
    planset = PlanSet(
        tuple(parts),
        cfg.plan,
        stats,
        cfg.write.shard_tokens,
        cfg.write.min_files,
        cfg.write.cost_model,
    )
    _save_plan(cfg, planset, shards.success.fingerprint)
    work_store(cfg).push(PLAN)
    crash_point("plan")
    return planset, shards


@in_mirror
def steps_task(
    cfg: RunConfig, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = False
) -> None:
    """The second pass over this task's groups of a mixture (every ``num_tasks``-th from
    ``task_index``), once ``plan_stage`` has saved where each group's rows start."""
    require_out(cfg)
    shards = index_tokens(cfg)
    rel = f"{PLAN_DIR}/{STEPS}.json"
    work_store(cfg).pull(rel)
    at = read_record(StepRows, cfg.work_path / rel)
    if at is None:
        raise PackcliError(f"{cfg.work_path / rel}: missing or damaged; run `packcli plan` again")
    mine = range(task_index, len(at.first_rows), num_tasks)
    with progress_bar(quiet, total=len(mine), desc="plan steps") as bar:
        _exchange_groups(cfg, shards, at, mine, bar.update)


def _long_sources(plan: Plan, first_doc: np.ndarray) -> np.ndarray:
    """Each long row's tokens per source (by ``piece_size``: what a row takes)."""
    src = source_of(plan.piece_doc, first_doc)
    layout = plan.long
    assert layout is not None  # a plan of the plan stage has both configs
    return row_source_tokens(
        layout.row_offsets, layout.row_pieces, src, plan.piece_size, first_doc.size
    )


def _long_edges(
    plan: Plan, first_doc: np.ndarray, spread: WindowSpread, first_row: int
) -> WindowEdges:
    """A part's long rows at the edges of the output's step windows (``window_edges``), and
    its long tokens per source."""
    m = _long_sources(plan, first_doc)
    edges = window_edges(m, spread.window_rows, first_row)
    return dataclasses.replace(edges, tokens=m.sum(axis=0).astype(np.int64).tolist())


def _steps_rel(g: int) -> str:
    return f"{PLAN_DIR}/{STEPS}/{_group_name(g)}.json"


def _rows_rel(g: int) -> str:
    """A group's tokens per source in each row after the second pass (both configs): what
    the output's step figures are summed from, without loading its plan again."""
    return f"{PLAN_DIR}/{STEPS}/{_group_name(g)}.rows.npz"


def _row_sources(plan: Plan, first_doc: np.ndarray) -> dict[str, np.ndarray]:
    """Per config, the tokens of each source in each row (int32: a row holds at most
    ``long_len`` tokens)."""
    src = source_of(plan.piece_doc, first_doc)
    out = {}
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        m = row_source_tokens(
            layout.row_offsets, layout.row_pieces, src, plan.piece_size, first_doc.size
        )
        out[name] = m.astype(np.int32)
    return out


def _output_steps(
    cfg: RunConfig,
    parts: Sequence[PlanPart],
    tail_plan: Plan,
    first_doc: np.ndarray,
    windows: dict[str, int],
) -> tuple[dict[str, StepFigures], list[int]]:
    """A grouped mixture's per-source step figures over the output's windows (rows in output
    order: groups, then the tail) against the output's share, per config, and how many
    groups hold each source (in their long rows). Read one group's row sums at a time."""
    store = work_store(cfg)
    rows = {name: 0 for name in CONFIG_NAMES}
    sums: dict[str, list[StepSums]] = {name: [] for name in CONFIG_NAMES}
    held = np.zeros(first_doc.size, np.int64)
    for k, part in enumerate(parts):
        if part.is_tail:
            matrices = _row_sources(tail_plan, first_doc)
        else:
            rel = _rows_rel(k)
            store.pull(rel)
            try:
                with np.load(cfg.work_path / rel) as z:
                    matrices = {name: z[name] for name in CONFIG_NAMES}
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                raise PackcliError(
                    f"{cfg.work_path / rel}: damaged plan ({exc}); run `packcli plan` again"
                ) from exc
            held += matrices["long"].sum(axis=0) > 0
        for name in CONFIG_NAMES:
            m = matrices[name]
            sums[name].append(StepSums.of_rows(m, windows[name], rows[name]))
            rows[name] += m.shape[0]
    figures = {n: StepSums.combined(sums[n]).deviation(rows[n]) for n in CONFIG_NAMES}
    return figures, held.tolist()


def _steps_record(cfg: RunConfig, g: int) -> StepsRecord:
    """A group's second-pass record (``_exchange_groups`` made every one it was asked for)."""
    record = read_record(StepsRecord, cfg.work_path / _steps_rel(g))
    if record is None:
        path = cfg.work_path / _steps_rel(g)
        raise PackcliError(f"{path}: missing or damaged; run `packcli plan` again")
    return record


def _exchange_groups(
    cfg: RunConfig,
    shards: TokenShards,
    at: StepRows,
    mine: range,
    on_group: Callable[[int], object],
) -> None:
    """The second pass over a mixture's groups in ``mine``: each group's row-ordered plan
    with its long rows exchanged on the output's step windows (``exchange_plan`` at its
    first output row), saved beside the first pass's (``plan/steps/NAME.npz``, a record);
    a group whose record is current is kept (resume). One group's plan in memory at a time,
    and each group alone, so the bytes are the same for any task count."""
    mix = mix_spec(cfg, shards)
    if mix is None:
        return
    spec, first_doc = mix
    store = work_store(cfg)
    (cfg.work_path / PLAN_DIR / STEPS).mkdir(parents=True, exist_ok=True)
    for g in mine:
        name = _group_name(g)
        store.pull(f"{PLAN_DIR}/{name}.json", _steps_rel(g))
        record = _group_record(cfg, g)
        first_row, open_end = at.first_rows[g], at.open_end[g]
        # The last group counts the tail's rows in the window they share (``StepRows``).
        following = at.tail_rows if g == len(at.first_rows) - 1 and at.tail_rows else None
        fp = fingerprint(
            [record.fingerprint, record.part.content_sha256, first_row, open_end, following]
        )
        done_before = read_record(StepsRecord, cfg.work_path / _steps_rel(g))
        if _reusable(store, done_before, fp, f"{PLAN_DIR}/{STEPS}"):
            on_group(1)
            continue
        part = record.part
        store.pull(*part.arrays)
        plan, tail, ballast = _load_part(cfg.work_path, cfg.plan, part)
        windows = _spreads(record.stats, cfg.work_path / PLAN_DIR / f"{name}.json")
        plan, windows["long"] = exchange_plan(
            plan,
            first_doc,
            windows["long"],
            spec.seed,
            first_row,
            open_end,
            None if following is None else np.asarray(following, np.float64),
        )
        assert part.slices is not None  # a grouped mixture's group records its slices
        done = _save_part(
            cfg,
            name,
            plan,
            part.slices,
            tail,
            len(at.first_rows),
            steps=True,
            sliced=True,
            ballast=ballast,
        )
        edges = _long_edges(plan, first_doc, windows["long"], first_row)
        rows_rel = _rows_rel(g)
        with atomic_writer(cfg.work_path / rows_rel) as fh:
            sources: dict[str, Any] = _row_sources(plan, first_doc)  # Any: as in _save_part
            np.savez(fh, **sources)
        del plan, tail, ballast
        path = cfg.work_path / done.plan_array
        rows_path = cfg.work_path / rows_rel
        done_record = StepsRecord(
            fingerprint=fp,
            part=done,
            mixture_windows=windows,
            edges=edges,
            files={
                done.plan_array: (path.stat().st_size, sha256_file(path)),
                rows_rel: (rows_path.stat().st_size, sha256_file(rows_path)),
            },
        )
        atomic_write_json(cfg.work_path / _steps_rel(g), done_record.to_json())
        store.push(done.plan_array, rows_rel, _steps_rel(g))
        crash_point(f"plan-steps:{g}")
        on_group(1)


def _plan_mixed(
    cfg: RunConfig,
    shards: TokenShards,
    members: Sequence[Slice],
    lengths: np.ndarray,
    mix: tuple[MixSpec, np.ndarray],
    g: int,
    n_groups: int,
) -> tuple[Plan, Pieces, Ballast | None]:
    """A group of a mixture: its documents' copies (``packcli.pack.mixture.expand``) planned
    as documents, keyed ``doc_id + repeat << 40``, then rows ordered for the mix; of
    several groups, what it gives the tail holds its mix (``balance_tail``: rows given
    whole besides the released pieces)."""
    spec, first_doc = mix
    docs = _group_docs(shards, members)
    ex = expand(lengths, docs, first_doc, spec, cfg.plan.long_len)
    plan_cfg = dataclasses.replace(cfg.plan, overlong="split")  # others applied by expand
    ballast = None
    if n_groups == 1:
        plan = plan_two_tier(ex.lengths, plan_cfg, spread=True)
        plan, tail = dataclasses.replace(plan, piece_doc=ex.keys[plan.piece_doc]), None
    else:
        grouped = plan_group(ex.lengths, ex.keys, plan_cfg, g, spread=True)
        src = [source_of(x, first_doc) for x in (grouped.plan.piece_doc, grouped.tail.doc)]
        # Groups before the last keep whole windows; the last shares its last window with
        # the tail, whose rows it then makes up for (``StepRows.tail_rows``).
        last = g == n_groups - 1
        align = 1 if last else part_rows_multiple(plan_cfg.long_len, plan_cfg.tokens_per_step)
        grouped = balance_tail(grouped, src[0], src[1], first_doc.size, align=align)
        plan, tail, ballast = grouped.plan, grouped.tail, grouped.ballast
    # The exchange's windows start at the plan's first row: the output's only for one group
    # (several: the second pass, once each group's first output row is known).
    step = plan_cfg.tokens_per_step
    plan, spread = order_plan(plan, first_doc, step, spec.seed, exchange=n_groups == 1)
    per = ex.stats.values()
    stats = dict(plan.stats)
    stats.update(
        documents=int(lengths.size),
        input_tokens=int(lengths.sum()),
        empty_docs=int((lengths == 0).sum()),
        split_docs=sum(s.split_docs for s in per),
        split_pieces=sum(s.split_pieces for s in per),
        split_tokens=sum(s.split_tokens for s in per),
        truncated_docs=sum(s.truncated_docs for s in per),
        truncated_tokens=sum(s.truncated_tokens for s in per),
        dropped_docs=sum(s.policy_dropped_docs for s in per),
        dropped_tokens=sum(s.policy_dropped_tokens for s in per),
        mixture={n: c.to_json() for n, c in ex.stats.items()},
        mixture_windows=_json(spread),
    )
    tail = tail if tail is not None else Pieces.concat([])
    return dataclasses.replace(plan, stats=stats), tail, ballast


def _mixture_stats(
    records: list[GroupRecord],
) -> tuple[dict[str, SourceCounts], dict[str, WindowSpread]]:
    """The groups' per-source counts summed, and per config the largest window deviation (and
    piece bound) of any group: the long config's over the output's windows within it (the
    second pass's), the short config's from the group's first row (its rows are ordered,
    not exchanged); windows straddling two groups are not counted (docs/benchmarks.md
    measures them)."""
    counts: dict[str, SourceCounts] = {}
    windows: dict[str, WindowSpread] = {}
    for g, r in enumerate(records):
        path = f"{PLAN_DIR}/{_group_name(g)}.json"
        mine = {
            n: SourceCounts.from_json(c, path, f"stats.mixture.{n}.")
            for n, c in r.stats["mixture"].items()
        }
        counts = add_stats(counts, mine)
        for name, spread in _spreads(r.stats, path).items():
            windows[name] = windows[name].merged(spread) if name in windows else spread
    return counts, windows


def _spreads(stats: dict[str, Any], path: Path | str) -> dict[str, WindowSpread]:
    """A group record's ``stats.mixture_windows`` (the file at ``path``), read."""
    return {
        name: WindowSpread.from_json(w, path, f"stats.mixture_windows.{name}.")
        for name, w in stats["mixture_windows"].items()
    }


def _json(spreads: dict[str, WindowSpread]) -> dict[str, Any]:
    """Per config its spread as the plan's stats hold it."""
    return {name: w.to_json() for name, w in spreads.items()}


def _reusable(
    store: LocalWork, record: GroupRecord | StepsRecord | None, fp: str, under: str = PLAN_DIR
) -> bool:
    """A group's record (None: missing, damaged or of another version) has the current
    fingerprint and its files are as written (on this disk re-hashed, so a damaged or edited
    plan file is planned again; on a store there at their recorded sizes, so reuse fetches
    nothing: ``LocalWork.intact``)."""
    if record is None or record.fingerprint != fp:
        return False
    return store.intact(record.files, under)


def _tail_arrays(tail: Pieces, ballast: Ballast | None) -> dict[str, np.ndarray]:
    """A group's ``.tail.npz`` arrays: the pieces it gives the tail, and (a mixture's) the
    layouts of the rows it gives whole (``ballast_*``; absent when none, so a plain
    corpus's files are as before)."""
    arrays = {"tail_doc": tail.doc, "tail_start": tail.start, "tail_len": tail.length}
    if ballast is not None:
        arrays.update(_layout_arrays(ballast, "ballast_"))
    return arrays


def _layout_arrays(owner: Plan | Ballast, prefix: str = "") -> dict[str, np.ndarray]:
    """Each config's row layout of a plan (or of rows given whole) as named arrays."""
    arrays = {}
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(owner, name)
        arrays[f"{prefix}{name}_row_offsets"] = layout.row_offsets
        arrays[f"{prefix}{name}_row_pieces"] = layout.row_pieces
        arrays[f"{prefix}{name}_row_tokens"] = layout.row_tokens
    return arrays


def _layouts(
    arrays: dict[str, np.ndarray], cfg: PlanConfig, prefix: str = ""
) -> dict[str, RowLayout]:
    """The row layouts ``_layout_arrays`` saved, each config at its row capacity."""
    return {
        name: RowLayout(
            cfg.short_len if name == "short" else cfg.long_len,
            arrays[f"{prefix}{name}_row_offsets"],
            arrays[f"{prefix}{name}_row_pieces"],
            arrays[f"{prefix}{name}_row_tokens"],
        )
        for name in CONFIG_NAMES
    }


def _read_tail(path: Path, cfg: PlanConfig) -> tuple[Pieces, Ballast | None, dict[str, np.ndarray]]:
    """A group's ``.tail.npz``: the pieces it gives the tail, the rows it gives whole (None:
    none), and its arrays (for the digest)."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    tail = Pieces(arrays["tail_doc"], arrays["tail_start"], arrays["tail_len"])
    ballast = None
    if "ballast_long_row_offsets" in arrays:
        ballast = Ballast(**_layouts(arrays, cfg, "ballast_"))
        if ballast.long.row_pieces.size and int(ballast.long.row_pieces.max()) >= tail.size:
            raise ValueError("its rows given whole hold pieces it does not give")
    return tail, ballast, arrays


def _load_tail(cfg: RunConfig, part: PlanPart) -> tuple[Pieces, Ballast | None]:
    """What a group gives the tail (its small ``.tail.npz``, not its plan)."""
    rel = f"{PLAN_DIR}/{part.name}.tail.npz"
    work_store(cfg).pull(rel)
    try:
        tail, ballast, _ = _read_tail(cfg.work_path / rel, cfg.plan)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{cfg.work_path / rel}: damaged plan ({exc}); run `packcli plan` again"
        ) from exc
    if tail.size != part.tail_pieces:
        raise PackcliError(
            f"{cfg.work_path / rel}: does not match its record; run `packcli plan` again"
        )
    return tail, ballast


def _group_lengths(shards: TokenShards, members: Sequence[Slice]) -> np.ndarray:
    """The documents' lengths of a group's slices (ranged reads of one column each)."""
    parts = [shards.shard_column(s, "length")[a:b].astype(np.int64) for s, a, b in members]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _group_docs(shards: TokenShards, members: Sequence[Slice]) -> np.ndarray:
    """The global doc ids of a group's slices' documents, in the group's order."""
    first = shards.first_doc_ids
    ranges = [np.arange(first[s] + a, first[s] + b) for s, a, b in members]
    return np.concatenate(ranges).astype(np.int64) if ranges else np.zeros(0, dtype=np.int64)


def _no_documents(cfg: RunConfig, shards: TokenShards) -> str:
    """Why there is nothing to pack, in figures: a run whose every line was rejected under
    ``--on-bad-line skip`` says so, and its quarantine is kept in ``OUT/rejected.jsonl``
    (finalize, which gathers it otherwise, never runs)."""
    stats = shards.success.read_stats
    files = f"{len(shards.success.files)} input file(s)"
    blank = f"{stats['blank_lines']} blank lines"
    rejected = stats.get("rejected") or {}
    if not rejected:
        return f"no documents in {files} ({blank}); nothing to pack"
    gather_rejects(cfg, cfg.out_path, shards)
    total = sum(rejected.values())
    reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(rejected.items()))
    corrupt = len(stats.get("corrupt_streams") or [])
    streams = f", {corrupt} corrupt stream(s)" if corrupt else ""
    return (
        f"no documents in {files}: all {total:,} record(s) were rejected ({reasons}; "
        f"{blank}{streams}); see {cfg.out_path / REJECTED}; nothing to pack"
    )


def _plan_arrays(plan: Plan) -> dict[str, np.ndarray]:
    arrays = {"piece_doc": plan.piece_doc, "piece_start": plan.piece_start}
    arrays["piece_len"] = plan.piece_len
    if plan.piece_source is not None:
        arrays["piece_source"] = plan.piece_source
    arrays.update(_layout_arrays(plan))
    return arrays


def _digest(arrays: dict[str, np.ndarray]) -> str:
    """What the Parquet files depend on is the plan itself, not only the settings that made
    it (another packcli build may plan the same settings differently): write records carry
    this digest of the arrays (the npz bytes hold zip timestamps, so not the file's hash)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arrays[name]).view(np.uint8).data)
    return digest.hexdigest()


def _file_cut(write: WriteConfig) -> list[Any]:
    """The settings output files are cut by when planning (a plan's record depends on them)."""
    if write.min_files == 1:  # one file per shard_tokens only: what every plan did before
        return [write.shard_tokens]
    return [write.shard_tokens, write.min_files, write.row_group_tokens]


def _save_part(
    cfg: RunConfig,
    name: str,
    plan: Plan,
    members: Sequence[Slice],
    tail: Pieces | None,
    groups: int,
    steps: bool = False,
    sliced: bool = False,
    ballast: Ballast | None = None,
) -> PlanPart:
    """A part's plan arrays (``plan/NAME.npz``) and, for a group, the pieces it released
    (``plan/NAME.tail.npz``: small, all the tail's planner reads); the digest covers both.
    ``groups``: how many groups the plan has (0 for the tail, which is cut by size only).
    ``steps``: a group after the second pass, into ``plan/steps/NAME.npz`` (its released
    pieces are the first pass's, already saved). ``members``: the part's documents as
    slices of shards; ``sliced``: recorded as slices (a grouped mixture's groups share
    shards), else as whole shards. ``ballast``: the rows a mixture's group gives the tail
    whole, saved with its tail pieces."""
    # Any: numpy's stub types ``savez``'s **kwds as its allow_pickle flag.
    arrays: dict[str, Any] = _plan_arrays(plan)
    folder = cfg.work_path / PLAN_DIR
    with atomic_writer(folder / (f"{STEPS}/{name}.npz" if steps else f"{name}.npz")) as fh:
        np.savez(fh, **arrays)  # np.savez writes the same bytes to a file or a path
    if tail is not None:
        tail_arrays: dict[str, Any] = _tail_arrays(tail, ballast)
        if not steps:
            with atomic_writer(folder / f"{name}.tail.npz") as fh:
                np.savez(fh, **tail_arrays)
        arrays.update(tail_arrays)
    return PlanPart(
        name=name,
        shards=tuple(dict.fromkeys(int(s) for s, _, _ in members)),
        files={  # a part with no rows in a config has no file of it
            c: _files(cfg.write, getattr(plan, c), groups) if getattr(plan, c).num_rows else []
            for c in CONFIG_NAMES
        },
        rows={c: getattr(plan, c).num_rows for c in CONFIG_NAMES},
        tokens={c: int(getattr(plan, c).row_tokens.sum()) for c in CONFIG_NAMES},
        tail_pieces=int(plan.piece_len.size if tail is None else tail.size),
        content_sha256=_digest(arrays),
        steps=steps,
        slices=tuple((int(s), int(a), int(b)) for s, a, b in members) if sliced else None,
    )


def _files(write: WriteConfig, layout: RowLayout, groups: int) -> list[tuple[int, int]]:
    """A part's rows of one config cut into its files."""
    tokens = int(layout.row_tokens.sum())
    wanted = files_wanted(write, tokens, groups) if groups else 1
    return file_ranges(layout, write.shard_tokens, wanted)


def _recorded_spec(planset: PlanSet) -> MixSpec | None:
    record = planset.stats.get("mixture_spec")
    return MixSpec.from_record(record) if record else None


def _save_plan(cfg: RunConfig, planset: PlanSet, tokens_fingerprint: str) -> None:
    digest = fingerprint([p.content_sha256 for p in planset.parts])
    record = PlanRecord(
        content_sha256=digest,
        fingerprint=plan_fingerprint(cfg.plan, tokens_fingerprint, _recorded_spec(planset)),
        tokens_fingerprint=tokens_fingerprint,
        stats=planset.stats,
        plan=dataclasses.asdict(cfg.plan),
        write_shard_tokens=cfg.write.shard_tokens,
        write_min_files=cfg.write.min_files,
        write_cost_model=cfg.write.cost_model,
        parts=planset.parts,
    )
    atomic_write_json(cfg.work_path / PLAN, record.to_json())


def load_plan(work: Path, shards: TokenShards) -> PlanSet:
    """The saved plan's parts and the settings it was made with (write tasks need no plan
    flags); each part's arrays are read by ``load_part`` when needed."""
    path = work / PLAN
    no_plan = f"no plan for the current tokenized shards in {work}: run `packcli plan` first"
    data = read_json(path)
    if not data:
        raise PackcliError(no_plan)
    try:
        meta = PlanRecord.from_json(data, path)
    except OldRecordError:  # a plan of another packcli: made again, never read
        raise PackcliError(f"{no_plan} (its plan.json is of another packcli)") from None
    except RecordError as exc:
        raise PackcliError(f"{exc} (damaged plan: run `packcli plan` again)") from None
    if meta.tokens_fingerprint != shards.success.fingerprint:
        raise PackcliError(no_plan)
    try:
        config = PlanConfig(**meta.plan)
    except (ValueError, TypeError) as exc:
        raise PackcliError(f"{path}: damaged plan ({exc}); run `packcli plan` again") from exc
    return PlanSet(
        meta.parts,
        config,
        meta.stats,
        meta.write_shard_tokens,
        meta.write_min_files,
        meta.write_cost_model,
    )


def load_part(work: Path, planset: PlanSet, part: PlanPart) -> tuple[Plan, Pieces]:
    """A part's plan, and (a group) the pieces it released to the tail; both checked
    against the digest ``plan.json`` holds."""
    plan, tail, _ = _load_part(work, planset.config, part)
    return plan, tail


def _load_part(work: Path, cfg: PlanConfig, part: PlanPart) -> tuple[Plan, Pieces, Ballast | None]:
    path = work / part.plan_array
    try:
        with np.load(path) as z:  # each array read once (z[k] reads it anew every time)
            arrays = {k: z[k] for k in z.files}
        layouts = _layouts(arrays, cfg)
        plan = Plan(
            arrays["piece_doc"],
            arrays["piece_start"],
            arrays["piece_len"],
            stats={},
            piece_source=arrays.get("piece_source"),
            pad_multiple=cfg.pad_multiple,
            **layouts,
        )
        tail, ballast = Pieces.concat([]), None
        if not part.is_tail:
            tail, ballast, tail_arrays = _read_tail(work / PLAN_DIR / f"{part.name}.tail.npz", cfg)
            arrays.update(tail_arrays)
        if part.tail_pieces != (plan.piece_len.size if part.is_tail else tail.size):
            raise ValueError("the part's piece count differs from plan.json")
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{path}: damaged or missing plan ({exc}); run `packcli plan` again"
        ) from exc
    if _digest(arrays) != part.content_sha256:
        raise PackcliError(f"{path}: does not match plan.json; run `packcli plan` again")
    return plan, tail, ballast


def stored_config(cfg: RunConfig) -> RunConfig:
    """The run config as the stages recorded it: tokenize settings from the tokenize stage,
    plan settings from the plan stage, write settings from the write tasks. ``finalize``
    reports this, so the output says how it was made whichever commands made it."""
    work = cfg.work_path
    stage = read_record(StageRecord, work / TOKENS_DIR / STAGE)  # None: of another version
    recorded = stage.config if stage is not None else {}
    plan = read_record(PlanRecord, work / PLAN)
    write = read_record(WriteSettings, work / WRITE_DIR / WRITE_SETTINGS)
    values = {
        "read": recorded.get("read", dataclasses.asdict(cfg.read)),
        "tokenize": recorded.get("tokenize", dataclasses.asdict(cfg.tokenize)),
        "chat": recorded.get("chat", dataclasses.asdict(cfg.chat)),
        "plan": plan.plan if plan is not None else dataclasses.asdict(cfg.plan),
        "write": write.write if write is not None else dataclasses.asdict(cfg.write),
    }
    return dataclasses.replace(
        cfg,
        read=ReadConfig(**values["read"]),
        tokenize=TokenizeConfig(**values["tokenize"]),
        plan=PlanConfig(**values["plan"]),
        write=WriteConfig(**values["write"]),
        chat=ChatConfig(**values["chat"]),
        sources=tuple(SourceConfig(**s) for s in recorded.get("sources", [])) or cfg.sources,
    )
