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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli import __version__
from packcli.atomic import atomic_write_json, atomic_writer
from packcli.config import (
    TOKENS_PER_STEP,
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
from packcli.names import CONFIG_NAMES
from packcli.pack.groups import (
    RELEASE_RULE,
    Pieces,
    group_count,
    plan_group,
    plan_tail,
    policy_counts,
    shard_groups,
)
from packcli.pack.mixture import (
    MixSpec,
    add_stats,
    expand,
    multipliers_from_shares,
    order_plan,
)
from packcli.pack.plan import Plan, RowLayout, plan_two_tier
from packcli.stages.index import gather_rejects, index_tokens
from packcli.stages.progress import progress_bar
from packcli.stages.work import REJECTED, fingerprint, read_json, require_out
from packcli.stages.workstore import LocalWork, in_mirror, work_store
from packcli.tokenize.records import STAGE, StageRecord, read_record
from packcli.tokenize.shards import TokenShards, sha256_file
from packcli.write import file_ranges, files_wanted

log = logging.getLogger(__name__)


def plan_fingerprint(
    plan_cfg: PlanConfig, tokens_fingerprint: str, mix: MixSpec | None = None
) -> str:
    values: dict[str, Any] = {
        "tokens": tokens_fingerprint,
        "plan": dataclasses.asdict(plan_cfg),
        "v": __version__,
        "release": RELEASE_RULE,
    }
    if mix is not None:  # a mixture's weights and policies change the plan: never mixed
        values["mixture"] = {**mix.as_record(), "order": MIX_ORDER_RULE}
    return fingerprint(values)


# The row order's rule for a mixture, as a version (part of the plan's fingerprint).
MIX_ORDER_RULE = 2  # 2: long rows' units exchanged between windows (issue 26)


def mix_spec(cfg: RunConfig, shards: TokenShards) -> tuple[MixSpec, np.ndarray] | None:
    """The run's mixture as the planner needs it (share mode: multipliers from the counted
    tokens of each source) and each source's first doc id; None without sources."""
    index = shards.success.sources
    if not cfg.sources:
        return None
    if not index or [s["name"] for s in index] != [s.name for s in cfg.sources]:
        raise PackcliError(
            "the tokenized shards were made for other sources: run `packcli tokenize` again"
        )
    if cfg.mix_mode == "share":
        tokens = np.array([s["tokens"] for s in index], np.float64)
        if (tokens == 0).any():
            empty = [s["name"] for s in index if not s["tokens"]]
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
    return spec, np.array([s["first_doc"] for s in index], np.int64)


PLAN_DIR = "plan"  # the parts' arrays: plan/group-NNNNN.npz, plan/tail.npz


@dataclass(frozen=True)
class PlanPart:
    """One independently planned part of the output: a group of token shards, or the tail
    (the pieces the groups released, planned together). Its rows are written from its own
    shards only (the tail: from the tail shards the groups' write tasks cut)."""

    name: str  # group-NNNNN | tail
    shards: tuple[int, ...]  # token shards its rows read (the tail: none)
    files: dict[str, list[tuple[int, int]]]  # per config, each file's rows r0..r1-1
    rows: dict[str, int]  # per config
    tokens: dict[str, int]  # per config
    tail_pieces: int  # a group: pieces it released; the tail: pieces it holds
    content_sha256: str

    @property
    def is_tail(self) -> bool:
        return self.name == TAIL

    @property
    def arrays(self) -> list[str]:
        """Its files in the work folder: the plan arrays and (a group) its released pieces."""
        names = [f"{PLAN_DIR}/{self.name}.npz"]
        return names if self.is_tail else [*names, f"{PLAN_DIR}/{self.name}.tail.npz"]

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> PlanPart:
        return cls(
            name=r["name"],
            shards=tuple(r["shards"]),
            files={k: [tuple(f) for f in v] for k, v in r["files"].items()},
            rows=dict(r["rows"]),
            tokens=dict(r["tokens"]),
            tail_pieces=int(r["tail_pieces"]),
            content_sha256=r["content_sha256"],
        )


TAIL = "tail"


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


def _groups(cfg: RunConfig, shards: TokenShards) -> list[np.ndarray]:
    """The shards of each group: from the corpus's tokens and ``plan.group_tokens`` only."""
    n_groups = group_count(int(shards.success.tokens), cfg.plan.group_tokens)
    return shard_groups(len(shards), n_groups)


def _group_name(g: int) -> str:
    return f"group-{g:05d}"


def _group_record(cfg: RunConfig, g: int) -> dict[str, Any]:
    return read_json(cfg.work_path / PLAN_DIR / f"{_group_name(g)}.json")


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
    groups: list[np.ndarray],
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
    for g in mine:
        name = _group_name(g)
        store.pull(f"{PLAN_DIR}/{name}.json")
        if _reusable(store, _group_record(cfg, g), fp):
            on_group(1)
            continue
        members = groups[g]
        lengths = _group_lengths(shards, members)
        if mix is not None:
            plan, tail = _plan_mixed(cfg, shards, members, lengths, mix, g, len(groups))
        elif len(groups) == 1:  # one group: the global plan, nothing released
            plan, tail = plan_two_tier(lengths, cfg.plan), Pieces.concat([])
        else:
            grouped = plan_group(lengths, _group_docs(shards, members), cfg.plan, g)
            plan, tail = grouped.plan, grouped.tail
        del lengths
        part = _save_part(cfg, name, plan, members, tail, len(groups))
        files = {
            rel: [(cfg.work_path / rel).stat().st_size, sha256_file(cfg.work_path / rel)]
            for rel in part.arrays
        }
        atomic_write_json(
            cfg.work_path / PLAN_DIR / f"{name}.json",
            {"fingerprint": fp, "part": part.as_record(), "stats": plan.stats, "files": files},
        )
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
    they left undone, and the tail, are planned here.

    The finished output (if any) stays complete: its Parquet files do not change here."""
    require_out(cfg)
    shards = index_tokens(cfg)
    if shards.num_docs == 0:
        raise InputError(_no_documents(cfg, shards))
    groups = _groups(cfg, shards)
    if run_tasks is not None and len(groups) > 1:
        run_tasks(plan_task)
    with progress_bar(quiet, total=len(groups) + (len(groups) > 1), desc="plan") as bar:
        _plan_groups(cfg, shards, groups, range(len(groups)), bar.update)
        records = [_group_record(cfg, g) for g in range(len(groups))]
        parts = [PlanPart.from_record(r["part"]) for r in records]
        # One group: its plan's own stats (the balancer's too); several: the policy's, summed.
        stats: dict[str, Any] = (
            dict(records[0]["stats"])
            if len(groups) == 1
            else policy_counts([r["stats"] for r in records])
        )
        if len(groups) > 1 and records and "mixture" in records[0]["stats"]:
            stats.update(_mixture_stats(records))
        if len(groups) > 1:
            # Every released piece once, in one set of arrays (not a list and its concat).
            tails = Pieces.gather(
                [p.tail_pieces for p in parts], lambda k: _load_tail(cfg, parts[k])
            )
            tail_plan = plan_tail([tails], cfg.plan)
            del tails
            mix = mix_spec(cfg, shards)
            if mix is not None:
                tail_plan, _ = order_plan(
                    tail_plan, mix[1], TOKENS_PER_STEP, mix[0].seed, exchange=False
                )
            parts.append(_save_part(cfg, TAIL, tail_plan, np.zeros(0, np.int64), None, 0))
            work_store(cfg).push(f"{PLAN_DIR}/{TAIL}.npz")
            stats.update(groups=len(groups), tail_tokens=tail_plan.stats["tail_tokens"])
            bar.update(1)
    if (mix := mix_spec(cfg, shards)) is not None:
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
    work_store(cfg).push("plan.json")
    crash_point("plan")
    return planset, shards


def _plan_mixed(
    cfg: RunConfig,
    shards: TokenShards,
    members: np.ndarray,
    lengths: np.ndarray,
    mix: tuple[MixSpec, np.ndarray],
    g: int,
    n_groups: int,
) -> tuple[Plan, Pieces]:
    """A group of a mixture: its documents' copies (``packcli.pack.mixture.expand``) planned
    as documents, keyed ``doc_id + repeat << 40``, then rows ordered for the mix."""
    spec, first_doc = mix
    docs = _group_docs(shards, members)
    ex = expand(lengths, docs, first_doc, spec, cfg.plan.long_len)
    plan_cfg = dataclasses.replace(cfg.plan, overlong="split")  # others applied by expand
    if n_groups == 1:
        plan = plan_two_tier(ex.lengths, plan_cfg)
        plan, tail = dataclasses.replace(plan, piece_doc=ex.keys[plan.piece_doc]), None
    else:
        grouped = plan_group(ex.lengths, ex.keys, plan_cfg, g)
        plan, tail = grouped.plan, grouped.tail
    # The exchange's windows start at the plan's first row: the output's only for one group.
    plan, spread = order_plan(plan, first_doc, TOKENS_PER_STEP, spec.seed, exchange=n_groups == 1)
    per = ex.stats.values()
    stats = dict(plan.stats)
    stats.update(
        documents=int(lengths.size),
        input_tokens=int(lengths.sum()),
        empty_docs=int((lengths == 0).sum()),
        split_docs=sum(s["split_docs"] for s in per),
        split_pieces=sum(s["split_pieces"] for s in per),
        split_tokens=sum(s["split_tokens"] for s in per),
        truncated_docs=sum(s["truncated_docs"] for s in per),
        truncated_tokens=sum(s["truncated_tokens"] for s in per),
        dropped_docs=sum(s["policy_dropped_docs"] for s in per),
        dropped_tokens=sum(s["policy_dropped_tokens"] for s in per),
        mixture=ex.stats,
        mixture_windows=spread,
    )
    return dataclasses.replace(plan, stats=stats), tail if tail is not None else Pieces.concat([])


def _mixture_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The groups' per-source counts summed, and per config the largest window deviation (and
    piece bound) of any group, each group's rows being consecutive in the output (windows
    straddling two groups are not counted: docs/benchmarks.md measures them)."""
    counts: dict[str, dict[str, int]] = {}
    windows: dict[str, Any] = {}
    for r in records:
        counts = add_stats(counts, r["stats"]["mixture"])
        for name, w in r["stats"]["mixture_windows"].items():
            if name not in windows:
                windows[name] = dict(w)
                continue
            mine = windows[name]
            for key in (
                "max_deviation",
                "p99_deviation",
                "shuffled_max_deviation",
                "piece_bound",
                "exchange_max_deviation",
            ):
                if key in mine and key in w:
                    mine[key] = [max(a, b) for a, b in zip(mine[key], w[key], strict=True)]
            mine["tokens"] = [a + b for a, b in zip(mine["tokens"], w["tokens"], strict=True)]
            mine["windows"] += w["windows"]
            if "exchange_moves" in mine and "exchange_moves" in w:
                mine["exchange_moves"] += w["exchange_moves"]
    return {"mixture": counts, "mixture_windows": windows}


def _reusable(store: LocalWork, record: dict[str, Any], fp: str) -> bool:
    """A group's record has the current fingerprint and its files are as written (on this
    disk re-hashed, so a damaged or edited plan file is planned again; on a store there at
    their recorded sizes, so reuse fetches nothing: ``LocalWork.intact``)."""
    files = record.get("files")
    if record.get("fingerprint") != fp or not isinstance(files, dict):
        return False
    return store.intact(files, PLAN_DIR)


def _read_tail(path: Path) -> tuple[Pieces, dict[str, np.ndarray]]:
    """A group's ``.tail.npz``: the pieces it released, and its arrays (for the digest)."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    return Pieces(arrays["tail_doc"], arrays["tail_start"], arrays["tail_len"]), arrays


def _load_tail(cfg: RunConfig, part: PlanPart) -> Pieces:
    """The pieces a group released (its small ``.tail.npz``, not its plan)."""
    rel = f"{PLAN_DIR}/{part.name}.tail.npz"
    work_store(cfg).pull(rel)
    try:
        tail, _ = _read_tail(cfg.work_path / rel)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{cfg.work_path / rel}: damaged plan ({exc}); run `packcli plan` again"
        ) from exc
    if tail.size != part.tail_pieces:
        raise PackcliError(
            f"{cfg.work_path / rel}: does not match its record; run `packcli plan` again"
        )
    return tail


def _group_lengths(shards: TokenShards, members: np.ndarray) -> np.ndarray:
    """The documents' lengths of a group's shards (ranged reads of one column each)."""
    parts = [shards.shard_column(int(s), "length").astype(np.int64) for s in members]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _group_docs(shards: TokenShards, members: np.ndarray) -> np.ndarray:
    """The global doc ids of a group's shards' documents, in the group's order."""
    ranges = [
        np.arange(
            shards.first_doc_ids[s], shards.first_doc_ids[s] + shards.manifests[s]["num_docs"]
        )
        for s in members
    ]
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
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        arrays[f"{name}_row_offsets"] = layout.row_offsets
        arrays[f"{name}_row_pieces"] = layout.row_pieces
        arrays[f"{name}_row_tokens"] = layout.row_tokens
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
    members: np.ndarray,
    tail: Pieces | None,
    groups: int,
) -> PlanPart:
    """A part's plan arrays (``plan/NAME.npz``) and, for a group, the pieces it released
    (``plan/NAME.tail.npz``: small, all the tail's planner reads); the digest covers both.
    ``groups``: how many groups the plan has (0 for the tail, which is cut by size only)."""
    # Any: numpy's stub types ``savez``'s **kwds as its allow_pickle flag.
    arrays: dict[str, Any] = _plan_arrays(plan)
    folder = cfg.work_path / PLAN_DIR
    with atomic_writer(folder / f"{name}.npz") as fh:
        np.savez(fh, **arrays)  # np.savez writes the same bytes to a file or a path
    if tail is not None:
        tail_arrays: dict[str, Any] = {
            "tail_doc": tail.doc,
            "tail_start": tail.start,
            "tail_len": tail.length,
        }
        with atomic_writer(folder / f"{name}.tail.npz") as fh:
            np.savez(fh, **tail_arrays)
        arrays.update(tail_arrays)
    return PlanPart(
        name=name,
        shards=tuple(int(s) for s in members),
        files={  # a part with no rows in a config has no file of it
            c: _files(cfg.write, getattr(plan, c), groups) if getattr(plan, c).num_rows else []
            for c in CONFIG_NAMES
        },
        rows={c: getattr(plan, c).num_rows for c in CONFIG_NAMES},
        tokens={c: int(getattr(plan, c).row_tokens.sum()) for c in CONFIG_NAMES},
        tail_pieces=int(plan.piece_len.size if tail is None else tail.size),
        content_sha256=_digest(arrays),
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
    atomic_write_json(
        cfg.work_path / "plan.json",
        {
            "content_sha256": digest,
            "fingerprint": plan_fingerprint(cfg.plan, tokens_fingerprint, _recorded_spec(planset)),
            "tokens_fingerprint": tokens_fingerprint,
            "stats": planset.stats,
            "plan": dataclasses.asdict(cfg.plan),
            # Output files are cut when planning (each part's rows into files of about
            # this many tokens), so write tasks need only their own parts' arrays.
            "write_shard_tokens": cfg.write.shard_tokens,
            "write_min_files": cfg.write.min_files,
            "write_cost_model": cfg.write.cost_model,
            "parts": [p.as_record() for p in planset.parts],
        },
    )


def load_plan(work: Path, shards: TokenShards) -> PlanSet:
    """The saved plan's parts and the settings it was made with (write tasks need no plan
    flags); each part's arrays are read by ``load_part`` when needed."""
    meta = read_json(work / "plan.json")
    if not meta or meta.get("tokens_fingerprint") != shards.success.fingerprint:
        raise PackcliError(
            f"no plan for the current tokenized shards in {work}: run `packcli plan` first"
        )
    try:
        return PlanSet(
            tuple(PlanPart.from_record(r) for r in meta["parts"]),
            PlanConfig(**meta["plan"]),
            meta["stats"],
            int(meta["write_shard_tokens"]),
            meta.get("write_min_files", 1),  # a plan from before the setting: by size only
            meta.get("write_cost_model"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise PackcliError(
            f"{work / 'plan.json'}: damaged plan ({exc}); run `packcli plan` again"
        ) from exc


def load_part(work: Path, planset: PlanSet, part: PlanPart) -> tuple[Plan, Pieces]:
    """A part's plan, and (a group) the pieces it released to the tail; both checked
    against the digest ``plan.json`` holds."""
    path = work / PLAN_DIR / f"{part.name}.npz"
    cfg = planset.config
    try:
        with np.load(path) as z:  # each array read once (z[k] reads it anew every time)
            arrays = {k: z[k] for k in z.files}
        layouts = {
            name: RowLayout(
                cfg.short_len if name == "short" else cfg.long_len,
                arrays[f"{name}_row_offsets"],
                arrays[f"{name}_row_pieces"],
                arrays[f"{name}_row_tokens"],
            )
            for name in CONFIG_NAMES
        }
        plan = Plan(
            arrays["piece_doc"],
            arrays["piece_start"],
            arrays["piece_len"],
            stats={},
            piece_source=arrays.get("piece_source"),
            pad_multiple=cfg.pad_multiple,
            **layouts,
        )
        tail = Pieces.concat([])
        if not part.is_tail:
            tail, tail_arrays = _read_tail(work / PLAN_DIR / f"{part.name}.tail.npz")
            arrays.update(tail_arrays)
        if part.tail_pieces != (plan.piece_len.size if part.is_tail else tail.size):
            raise ValueError("the part's piece count differs from plan.json")
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise PackcliError(
            f"{path}: damaged or missing plan ({exc}); run `packcli plan` again"
        ) from exc
    if _digest(arrays) != part.content_sha256:
        raise PackcliError(f"{path}: does not match plan.json; run `packcli plan` again")
    return plan, tail


def stored_config(cfg: RunConfig) -> RunConfig:
    """The run config as the stages recorded it: tokenize settings from the tokenize stage,
    plan settings from the plan stage, write settings from the write tasks. ``finalize``
    reports this, so the output says how it was made whichever commands made it."""
    work = cfg.work_path
    stage = read_record(StageRecord, work / "tokens" / STAGE)  # None: of another version
    recorded = stage.config if stage is not None else {}
    plan = read_json(work / "plan.json")
    write = read_json(work / "write" / "config.json")
    values = {
        "read": recorded.get("read", dataclasses.asdict(cfg.read)),
        "tokenize": recorded.get("tokenize", dataclasses.asdict(cfg.tokenize)),
        "chat": recorded.get("chat", dataclasses.asdict(cfg.chat)),
        "plan": plan.get("plan", dataclasses.asdict(cfg.plan)),
        "write": write.get("write", dataclasses.asdict(cfg.write)),
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
