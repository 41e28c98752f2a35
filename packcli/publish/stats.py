"""Statistics and plots of a packed output: how full the rows are and what they cost to train.

Why: the report says how many rows packing made; before spending GPU hours a user also wants
the shape of the data - document lengths, how evenly rows are filled, how many documents
share a row, and the per-row attention cost. With document masking a row costs
``sum(len_i**2)`` in attention (not ``num_tokens**2``), so two rows of equal length can differ
a lot in step time; the "balance ratio" (max / mean cost over rows) says how uneven the
slowest data-parallel rank can be.

Reads only the ``num_tokens`` and ``seq_lengths`` columns (and ``cost``, when the pack wrote
one), one row group at a time, so the token columns are never decoded. With a ``cost`` column
the row-cost figures and the simulated schedule use it, after checking it against its cost
model (``packcli.json``'s ``run.cost_model``) over the rows' ``seq_lengths``: the numbers
then describe the column a sampler will read, and cannot silently disagree with it.
Memory: 4 bytes per segment of the long config (kept for
exact document-length quantiles) plus 24 bytes per row; the short config's segments are
reduced per row group. "Document length" is the length of a segment of the long config: a
document split by ``--overlong split`` counts once per piece.

matplotlib and rich are an optional extra (``pip install 'packcli[stats]'``), imported only
when plots or tables are made; ``stats --json --no-plots`` needs neither. numpy and pyarrow
are imported inside the functions as well, so that importing this module (the CLI's
``inspect`` does, through ``rowview``) keeps ``packcli --help`` fast (they cost ~0.3 s).
Plots go to ``OUT/stats/`` (written under a temp name, then renamed);
``packcli.publish.card.render_plots_section`` embeds them in the dataset card by relative path.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packcli.atomic import atomic_path
from packcli.errors import PackcliError
from packcli.names import CONFIG_NAMES, STATS_DIR
from packcli.publish.card import (
    PLOT_ATTENTION,
    PLOT_DOC_LENGTHS,
    PLOT_FILES,
    PLOT_ROW_FILL,
    PLOT_SEGMENTS,
)

# The card text about plots and training lives in card.py; these names stay importable here.
from packcli.publish.card import render_plots_section as render_plots_section
from packcli.publish.card import training_snippet as training_snippet
from packcli.records import Fields

if TYPE_CHECKING:
    import numpy as np

    from packcli.publish.marker import Marker
import numpy.typing as npt

log = logging.getLogger(__name__)

# (name, percentile); quantiles are observed values (numpy's "inverted_cdf"), never interpolated.
QUANTILES = (("min", 0), ("p10", 10), ("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
EXTRA_HINT = "pip install 'packcli[stats]'"


class MissingExtraError(PackcliError):
    """An optional dependency (the ``stats`` extra) is not installed."""


def require_extra(module: str, purpose: str) -> Any:
    """Import ``module`` or raise a ``MissingExtraError`` naming the pip command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs {module.split('.')[0]}, which is not installed: {EXTRA_HINT}"
        ) from exc


def read_meta(out: Path) -> Marker:
    """``packcli.json`` of a complete output (typed), or a ``PackcliError`` saying what is
    wrong."""
    from packcli.publish.marker import read_marker

    # Fails here, not halfway, on a foreign or damaged packcli.json (one line naming it).
    return read_marker(out)


def capacities(meta: Marker) -> dict[str, int]:
    plan = meta.plan_shape()
    return {"short": plan.short_len, "long": plan.long_len}


@dataclass
class TierData:
    """Per-row arrays of one config (what the numbers and plots are made from)."""

    name: str
    capacity: int
    num_tokens: npt.NDArray[np.int64]  # per row
    segments: npt.NDArray[np.int64]  # per row: documents (segments) in the row
    cost: npt.NDArray[np.int64]  # per row: sum of squared segment lengths
    seg_lengths: npt.NDArray[np.int32] | None  # per segment, kept for the long config only
    # The ``cost`` column (float64 per row) and its model's name, when the pack wrote one.
    row_cost: npt.NDArray[np.float64] | None = None
    cost_model: str | None = None


def _row_group_arrays(table: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(num_tokens, segments per row, sum len^2 per row, flat segment lengths) of a table."""
    import numpy as np

    from packcli.arrow_np import to_numpy

    lens_col = table.column("seq_lengths").combine_chunks()
    offsets = to_numpy(lens_col.offsets).astype(np.int64)
    flat = to_numpy(lens_col.values)[offsets[0] : offsets[-1]]
    offsets -= offsets[0]
    sq = np.zeros(flat.size + 1, dtype=np.int64)
    np.cumsum(flat.astype(np.int64) ** 2, out=sq[1:])
    num_tokens = to_numpy(table.column("num_tokens")).astype(np.int64)
    return num_tokens, np.diff(offsets), sq[offsets[1:]] - sq[offsets[:-1]], flat


def read_tier(out: Path, meta: Marker, name: str, keep_segments: bool) -> TierData:
    """Stream one config's ``num_tokens`` and ``seq_lengths``, one row group at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packcli.arrow_np import to_numpy

    parts: list[tuple[np.ndarray, ...]] = []
    seg_parts: list[np.ndarray] = []
    cost_parts: list[np.ndarray] = []
    stated = meta.run.get("cost_model")
    for entry in meta.files.of(name):
        path = out / "data" / name / entry.file
        if not path.is_file():
            raise PackcliError(f"{path} is missing; the output is damaged (see packcli verify)")
        try:
            with pq.ParquetFile(path) as pf:
                columns = ["num_tokens", "seq_lengths", *(["cost"] if stated else [])]
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g, columns=columns)
                    num_tokens, segments, cost, flat = _row_group_arrays(table)
                    parts.append((num_tokens, segments, cost))
                    if stated:
                        cost_parts.append(to_numpy(table.column("cost")).astype(np.float64))
                    if keep_segments:
                        seg_parts.append(flat.astype(np.int32, copy=True))
        except (pa.ArrowException, KeyError) as exc:  # truncated, foreign or no such column
            raise PackcliError(
                f"{path}: unreadable Parquet file ({exc}); the output is damaged (see "
                "packcli verify), rerun packcli pack to rewrite it"
            ) from exc

    def cat(i: int) -> np.ndarray:
        return np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)

    tier = TierData(
        name=name,
        capacity=capacities(meta)[name],
        num_tokens=cat(0),
        segments=cat(1),
        cost=cat(2),
        seg_lengths=(np.concatenate(seg_parts) if seg_parts else np.zeros(0, np.int32))
        if keep_segments
        else None,
    )
    if stated:
        row_cost = np.concatenate(cost_parts) if cost_parts else np.zeros(0, np.float64)
        _check_cost_column(out, name, tier, row_cost, stated)
        tier.row_cost, tier.cost_model = row_cost, str(stated["spec"])
    return tier


def _check_cost_column(
    out: Path, name: str, tier: TierData, row_cost: np.ndarray, stated: dict[str, Any]
) -> None:
    """The ``cost`` column must be its model's cost of the rows' ``seq_lengths`` (what the
    attention figures are made from), else the output is damaged."""
    import numpy as np

    from packcli.pack.schedule import CostModel

    model = CostModel(float(stated["per_token"]), float(stated["per_square"]))
    want = model.row_cost(tier.num_tokens, tier.cost)
    if row_cost.shape != want.shape or not np.array_equal(row_cost, want):
        raise PackcliError(
            f"{out / 'data' / name}: the cost column differs from its cost model over the rows' "
            "seq_lengths; the output is damaged (see packcli verify)"
        )


def distribution(values: np.ndarray) -> dict[str, float | int | None]:
    """Observed quantiles and the mean; ``None`` for an empty array."""
    import numpy as np

    if values.size == 0:
        return {**{k: None for k, _ in QUANTILES}, "mean": None}
    qs = np.percentile(values, [q for _, q in QUANTILES], method="inverted_cdf")
    as_int = np.issubdtype(values.dtype, np.integer)
    out: dict[str, float | int | None] = {
        k: int(v) if as_int else float(v) for (k, _), v in zip(QUANTILES, qs, strict=True)
    }
    out["mean"] = float(values.mean())
    return out


@dataclass(frozen=True)
class TierNumbers(Fields):
    """A config's figures in ``packcli stats`` (``--json``'s ``tiers``): its rows, tokens and
    fill, documents per row, attention cost, the data-parallel schedule's idle time and,
    where the rows have a cost column, its distribution. Printed, not written: a type so
    the tables read what ``tier_numbers`` wrote by name."""

    capacity: int
    rows: int
    tokens: int
    segments: int
    efficiency: float
    fill: dict[str, Any]
    segments_per_row: dict[str, Any]
    attention_cost: dict[str, Any]
    schedule: dict[str, Any]
    row_cost: dict[str, Any] | None = field(default=None, metadata={"omit": True})


# The counts of a config's line in the Configs table: ``TierNumbers``' first fields.
TIER_COUNTS = tuple(f.name for f in fields(TierNumbers)[:4])


def tier_numbers(tier: TierData) -> TierNumbers:
    import numpy as np

    rows = int(tier.num_tokens.size)
    tokens = int(tier.num_tokens.sum())
    cost_mean = float(tier.cost.mean()) if rows else 0.0
    cost_max = int(tier.cost.max()) if rows else 0
    unmasked = float((tier.num_tokens.astype(np.float64) ** 2).sum())
    return TierNumbers(
        capacity=tier.capacity,
        rows=rows,
        tokens=tokens,
        segments=int(tier.segments.sum()),
        efficiency=tokens / (rows * tier.capacity) if rows else 1.0,
        fill=distribution(tier.num_tokens / tier.capacity),
        segments_per_row=distribution(tier.segments),
        attention_cost={
            "mean": cost_mean,
            "p50": distribution(tier.cost)["p50"],
            "max": cost_max,
            # How much slower the costliest row is than the average one.
            "balance_ratio": cost_max / cost_mean if cost_mean else 1.0,
            # Masked cost relative to full causal attention over whole rows (lower = saved).
            "vs_unmasked": float(tier.cost.sum()) / unmasked if unmasked else 1.0,
        },
        schedule=schedule_numbers(tier),
        row_cost=row_cost_numbers(tier) if tier.row_cost is not None else None,
    )


def row_cost_numbers(tier: TierData) -> dict[str, Any]:
    """The ``cost`` column's distribution: mean, quantiles, and max / mean (balance)."""
    cost = tier.row_cost
    assert cost is not None
    d = distribution(cost)
    mean = float(cost.mean()) if cost.size else 0.0
    return {
        "model": tier.cost_model,
        **d,
        "balance_ratio": float(cost.max()) / mean if mean else 1.0,
    }


# Data-parallel sizes the stats simulate, and the model whose compute the rows are costed by.
SCHEDULE_RANKS = (8, 64)
SCHEDULE_MODEL = "llama-8b"


def schedule_numbers(tier: TierData, dp_sizes: tuple[int, ...] = SCHEDULE_RANKS) -> dict[str, Any]:
    """Simulated idle share of GPU time at each of ``dp_sizes`` data-parallel ranks
    (one row per rank per step; every rank waits for the slowest), rows dealt in the
    output's order (shuffled by the pack's seed) against ``PackedDistributedSampler``'s
    schedule (``packcli.pack.schedule``). A size with fewer than two full steps is left out:
    the rows, not the order, decide it. Rows are costed as written (context-parallel
    padding included: the kernels compute it), by the pack's ``cost`` column when it has
    one, else by ``SCHEDULE_MODEL``."""
    from packcli.pack.schedule import idle_share, preset, schedule

    if tier.row_cost is not None:
        cost, model = tier.row_cost, tier.cost_model
    else:
        cost, model = preset(SCHEDULE_MODEL).row_cost(tier.num_tokens, tier.cost), SCHEDULE_MODEL
    ranks = {}
    for dp in dp_sizes:
        if cost.size >= 2 * dp:
            ranks[str(dp)] = {
                "shuffled": idle_share(cost, dp),
                "scheduled": idle_share(cost[schedule(cost, dp)], dp),
            }
    return {"model": model, "idle_share": ranks}


def schedule_report(out: Path, dp_sizes: tuple[int, ...]) -> dict[str, Any]:
    """``schedule_numbers`` of each config of the output folder ``out`` (what ``packcli
    pack --dp-size`` adds to its report): reads only ``num_tokens`` and ``seq_lengths``."""
    meta = read_meta(out)
    return {
        name: schedule_numbers(read_tier(out, meta, name, keep_segments=False), dp_sizes)
        for name in CONFIG_NAMES
    }


def format_schedule(schedule: dict[str, Any]) -> list[str]:
    """The report's lines for ``schedule_report``: idle share in the output's order and as
    ``PackedDistributedSampler`` deals the rows, per config and data-parallel size."""
    lines = []
    for name, numbers in schedule.items():
        idle = numbers["idle_share"]
        cells = [
            f"DP={dp} {v['shuffled']:.1%} shuffled / {v['scheduled']:.1%} scheduled"
            for dp, v in idle.items()
        ]
        lines.append(
            f"idle      {name}: {'; '.join(cells) or 'too few rows for two steps'} "
            f"({numbers['model']} costs, one row a rank a step)"
        )
    return lines


def compute_stats(out: Path) -> tuple[dict[str, Any], dict[str, TierData]]:
    """The numbers (JSON-ready) and the per-row arrays they were made from."""
    meta = read_meta(out)
    tiers = {
        name: read_tier(out, meta, name, keep_segments=name == "long") for name in CONFIG_NAMES
    }
    long_lengths = tiers["long"].seg_lengths
    assert long_lengths is not None
    policy = meta.report_shape().policy
    split_docs, split_pieces = policy.split_docs, policy.split_pieces
    numbers = {
        "tiers": {name: tier_numbers(t).to_json() for name, t in tiers.items()},
        # count: segments, a split document once per piece; documents: whole documents.
        "document_lengths": {
            "count": int(long_lengths.size),
            "documents": int(long_lengths.size) - split_pieces + split_docs,
            "split_documents": split_docs,
            "split_pieces": split_pieces,
            **distribution(long_lengths),
        },
    }
    return numbers, tiers


def doc_lengths_title(docs: Mapping[str, Any]) -> str:
    """The length plot's title: what it counts, pieces of split documents said as such."""
    title = f"Document lengths ({docs['count']:,} segments"
    if docs.get("split_documents"):
        title += (
            f" = {docs['documents']:,} documents, {docs['split_documents']:,} of them split "
            f"into {docs['split_pieces']:,} pieces, each piece counted)"
        )
        return title
    return title + ")"


# -- plots ---------------------------------------------------------------------------------


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def _figure(panels: int) -> Any:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(4 + 3 * panels, 4))
    # Fixed margins: a layout engine ("constrained", "tight") doubles the drawing time.
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.13, top=0.91, wspace=0.25)
    return fig


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)


def write_plots(
    out: Path, tiers: dict[str, TierData], numbers: Mapping[str, Any] | None = None
) -> list[str]:
    """Write the PNG plots to ``OUT/stats/``; returns their paths relative to ``out``."""
    require_extra("matplotlib", "packcli stats plots (or pass --no-plots)")
    folder = out / STATS_DIR
    folder.mkdir(exist_ok=True)
    _plot_doc_lengths(folder, tiers, numbers)
    _plot_row_fill(folder, tiers)
    _plot_segments(folder, tiers)
    _plot_attention(folder, tiers["long"])
    return [f"{STATS_DIR}/{name}" for name in PLOT_FILES]


def _plot_doc_lengths(
    folder: Path, tiers: dict[str, TierData], numbers: Mapping[str, Any] | None
) -> None:
    """Histogram of document (long-config segment) lengths, log scale, with both capacities."""
    import numpy as np

    long = tiers["long"]
    caps = {name: t.capacity for name, t in tiers.items()}

    fig = _figure(1)
    ax = fig.subplots()
    lengths = long.seg_lengths if long.seg_lengths is not None else np.zeros(0, np.int32)
    if lengths.size:
        top = max(int(lengths.max()), 2)
        edges = np.unique(np.geomspace(1, top + 1, 60).astype(np.int64))
        counts, edges = np.histogram(lengths, bins=edges)
        ax.stairs(counts, edges, fill=True, alpha=0.8)
        ax.set_xscale("log")
        for name, style in (("short", "--"), ("long", ":")):
            ax.axvline(caps[name], color="black", linestyle=style, label=f"{name}_len")
        ax.legend()
    else:
        _empty(ax, "documents")
    ax.set_xlabel("tokens per segment (log scale)")
    ax.set_ylabel("segments (a split document once per piece)")
    docs = numbers["document_lengths"] if numbers else {"count": int(lengths.size)}
    ax.set_title(doc_lengths_title(docs), fontsize="small")
    _save(fig, folder / PLOT_DOC_LENGTHS)


def _plot_row_fill(folder: Path, tiers: dict[str, TierData]) -> None:
    """Per config: how full the rows are (tokens / capacity)."""
    import numpy as np

    fig = _figure(2)
    for ax, t in zip(fig.subplots(1, len(tiers)), tiers.values(), strict=True):
        if t.num_tokens.size:
            counts, edges = np.histogram(t.num_tokens / t.capacity, bins=50, range=(0.0, 1.0))
            ax.stairs(counts, edges, fill=True, alpha=0.8)
            ax.set_yscale("log")
        else:
            _empty(ax, "rows")
        eff = t.num_tokens.sum() / (t.num_tokens.size * t.capacity) if t.num_tokens.size else 1
        ax.set_title(f"{t.name}: {t.num_tokens.size:,} rows, efficiency {eff:.2%}")
        ax.set_xlabel(f"row fill (tokens / {t.capacity:,})")
        ax.set_ylabel("rows (log scale)")
    _save(fig, folder / PLOT_ROW_FILL)


def _plot_segments(folder: Path, tiers: dict[str, TierData]) -> None:
    """Per config: documents (segments) per row."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    fig = _figure(2)
    for ax, t in zip(fig.subplots(1, len(tiers)), tiers.values(), strict=True):
        if t.segments.size:
            top = int(t.segments.max())
            bins = np.arange(0.5, top + 1.5) if top <= 60 else 60
            counts, edges = np.histogram(t.segments, bins=bins)
            ax.stairs(counts, edges, fill=True, alpha=0.8)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            _empty(ax, "rows")
        ax.set_title(f"{t.name}: documents per row")
        ax.set_xlabel("segments in the row")
        ax.set_ylabel("rows")
    _save(fig, folder / PLOT_SEGMENTS)


def _plot_attention(folder: Path, long: TierData) -> None:
    """Attention cost (sum of squared segment lengths) per long row."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    fig = _figure(1)
    ax = fig.subplots()
    if long.cost.size:
        # In units of capacity**2: 1.0 is a row holding one document of the full capacity.
        rel = long.cost / float(long.capacity) ** 2
        counts, edges = np.histogram(rel, bins=50, range=(0.0, max(float(rel.max()), 1e-9)))
        ax.stairs(counts, edges, fill=True, alpha=0.8)
        mean = float(rel.mean())
        ax.axvline(mean, color="black", linestyle="--", label=f"mean {mean:.3g}")
        ax.axvline(
            float(rel.max()),
            color="red",
            linestyle=":",
            label=f"max = {rel.max() / mean if mean else 1:.2f} x mean",
        )
        ax.legend()
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        _empty(ax, "rows")
    ax.set_xlabel(f"sum of squared document lengths / {long.capacity:,}²")
    ax.set_ylabel("rows")
    ax.set_title(f"Attention cost per long row ({long.capacity:,} tokens)")
    _save(fig, folder / PLOT_ATTENTION)


# -- tables ----------------------------------------------------------------------------------


def _fmt(x: float | int | None, kind: str = "int") -> str:
    if x is None:
        return "-"
    if kind == "pct":
        return f"{x:.2%}"
    if kind == "float":
        return f"{x:,.1f}"
    if kind == "sci":
        return f"{x:.4g}"
    return f"{int(x):,}"


def render_tables(numbers: dict[str, Any]) -> list[Any]:
    """rich tables of ``compute_stats`` numbers, for the terminal."""
    require_extra("rich", "packcli stats tables (or pass --json)")
    from rich.table import Table

    qnames = [k for k, _ in QUANTILES]
    tiers = {
        name: TierNumbers.from_json(n, "packcli stats", prefix=f"tiers.{name}.")
        for name, n in numbers["tiers"].items()
    }
    tables = []

    t = Table(title="Configs")
    for col in ("config", *TIER_COUNTS, "efficiency"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for name, n in tiers.items():
        t.add_row(name, *(_fmt(getattr(n, k)) for k in TIER_COUNTS), _fmt(n.efficiency, "pct"))
    tables.append(t)

    docs = numbers["document_lengths"]
    t = Table(title="Document lengths (tokens; a split document counts once per piece)")
    for col in ("documents", *qnames, "mean"):
        t.add_column(col, justify="right")
    t.add_row(_fmt(docs["count"]), *(_fmt(docs[k]) for k in qnames), _fmt(docs["mean"], "float"))
    tables.append(t)

    for key, title, kind in (
        ("fill", "Row fill (tokens / capacity)", "pct"),
        ("segments_per_row", "Documents (segments) per row", "int"),
    ):
        t = Table(title=title)
        t.add_column("config")
        for col in (*qnames, "mean"):
            t.add_column(col, justify="right")
        for name, n in tiers.items():
            d = getattr(n, key)
            mean_kind = "pct" if kind == "pct" else "float"
            t.add_row(name, *(_fmt(d[k], kind) for k in qnames), _fmt(d["mean"], mean_kind))
        tables.append(t)

    t = Table(title="Attention cost per row (sum of squared document lengths)")
    t.add_column("config")
    for col in ("mean", "p50", "max", "balance (max/mean)", "vs unmasked"):
        t.add_column(col, justify="right")
    for name, n in tiers.items():
        a = n.attention_cost
        t.add_row(
            name,
            _fmt(a["mean"], "sci"),
            _fmt(a["p50"], "sci"),
            _fmt(a["max"], "sci"),
            f"{a['balance_ratio']:.2f}",
            _fmt(a["vs_unmasked"], "pct"),
        )
    tables.append(t)

    costs = {name: n.row_cost for name, n in tiers.items() if n.row_cost is not None}
    if len(costs) == len(tiers):
        model = next(iter(costs.values()))["model"]
        t = Table(title=f"Row cost (the cost column, {model} cost model)")
        t.add_column("config")
        for col in ("mean", "p50", "max", "balance (max/mean)"):
            t.add_column(col, justify="right")
        for name, c in costs.items():
            figures = (_fmt(c[k], "sci") for k in ("mean", "p50", "max"))
            t.add_row(name, *figures, f"{c['balance_ratio']:.2f}")
        tables.append(t)

    model = next(iter(tiers.values())).schedule["model"] if tiers else SCHEDULE_MODEL
    t = Table(
        title=f"Idle GPU time, data-parallel ({model} costs; one row a rank a step): "
        "rows in the output's order / by PackedDistributedSampler"
    )
    t.add_column("config")
    for dp in SCHEDULE_RANKS:
        t.add_column(f"DP={dp}", justify="right")
    for name, n in tiers.items():
        idle = n.schedule["idle_share"]
        cells = [
            f"{_fmt(idle[str(dp)]['shuffled'], 'pct')} / {_fmt(idle[str(dp)]['scheduled'], 'pct')}"
            if str(dp) in idle
            else "too few rows"
            for dp in SCHEDULE_RANKS
        ]
        t.add_row(name, *cells)
    tables.append(t)
    return tables
