"""A step schedule for data-parallel training: rows ordered so that the ranks of every step
get near-equal compute, steps in a seeded shuffled order (issue 27).

Why: in data-parallel training every rank waits for the slowest at each step, and a packed
row's compute is not its token count: attention adds a cost in the sum of its segments'
squared lengths, so a 128k row holding one document costs ~3x a row of 4k short packs for an
8B model. Rows in shuffled order put such rows beside cheap ones in most steps (44% of GPU
time idle at DP=8 on packcli's real-text long tier, docs/benchmarks.md). Here rows are
sorted by cost and cut into steps of ``ranks * rows_per_rank`` consecutive rows, so a step's
rows cost about the same; within a step rows are dealt to ranks in a snake (the costliest
``ranks`` rows to ranks 0..D-1, the next to D-1..0, ...), which pairs each rank's costlier
rows with cheaper ones; the steps are then shuffled with the seed, so training sees no
curriculum by accident (a user who wants one keeps ``shuffle=False``).

The order is laid out for a plain sequential distributed sampler: rank ``r`` of ``D`` takes
positions ``r, r + D, r + 2D, ...`` (torch's ``DistributedSampler(shuffle=False)``), so its
``j``-th row of step ``s`` is at position ``s * D * k + j * D + r``. A last step with fewer
rows than ``D * k`` comes last (the sampler pads it as it pads any dataset). Everything here
is pure and deterministic for given costs, ranks and seed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """Compute of a row: ``per_token * tokens + per_square * sum(segment_len ** 2)``.

    The unit is arbitrary (FLOPs with the presets); only ratios between rows matter."""

    per_token: float
    per_square: float

    @classmethod
    def of_shape(cls, params: float, layers: int, hidden: int, *, causal: bool = True) -> CostModel:
        """Training FLOPs of a dense transformer: 6 per parameter per token (forward and
        backward), and for attention 12 * layers * hidden per squared segment length
        (QK^T and AV, 2 * hidden each, times 3 for backward), halved by a causal kernel
        that skips the masked half (flash attention)."""
        square = 12.0 * layers * hidden * (0.5 if causal else 1.0)
        return cls(6.0 * float(params), square)

    @classmethod
    def of_config(cls, path: Path, *, causal: bool = True) -> CostModel:
        """From a transformers ``config.json`` (Llama-like: ``hidden_size``,
        ``num_hidden_layers``, ``intermediate_size``, ``vocab_size``, optionally
        ``num_key_value_heads``); the parameter count is estimated from the shape."""
        cfg = json.loads(Path(path).read_text())
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg.get("intermediate_size", 4 * hidden))
        heads = int(cfg.get("num_attention_heads", max(1, hidden // 128)))
        kv = int(cfg.get("num_key_value_heads", heads))
        vocab = int(cfg.get("vocab_size", 0))
        head_dim = hidden // heads
        per_layer = hidden * (hidden + 2 * kv * head_dim) + hidden * hidden + 3 * hidden * inter
        tied = bool(cfg.get("tie_word_embeddings", False))
        params = layers * per_layer + vocab * hidden * (1 if tied else 2)
        return cls.of_shape(params, layers, hidden, causal=causal)

    def row_cost(self, tokens: np.ndarray, squares: np.ndarray) -> np.ndarray:
        """Cost of each row from its tokens and its sum of squared segment lengths."""
        return self.per_token * np.asarray(tokens, np.float64) + self.per_square * np.asarray(
            squares, np.float64
        )


# Model presets (parameters, layers, hidden size) of the Llama 3 family's shapes.
PRESETS: dict[str, tuple[float, int, int]] = {
    "llama-1b": (1.24e9, 16, 2048),
    "llama-8b": (8.03e9, 32, 4096),
    "llama-70b": (70.6e9, 80, 8192),
}


def preset(name: str, *, causal: bool = True) -> CostModel:
    if name not in PRESETS:
        raise ValueError(f"unknown cost preset {name!r}; one of {sorted(PRESETS)}")
    params, layers, hidden = PRESETS[name]
    return CostModel.of_shape(params, layers, hidden, causal=causal)


def resolve_cost_model(spec: str, *, causal: bool = True) -> CostModel:
    """``--cost-model``: a preset's name (``PRESETS``), else a transformers ``config.json``
    or a folder holding one (``CostModel.of_config``); causal flash attention by default."""
    if spec in PRESETS:
        return preset(spec, causal=causal)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"cost model {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a "
            "transformers config.json (or a folder holding one)"
        )
    try:
        return CostModel.of_config(path, causal=causal)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path}: not a transformers model config (hidden_size, num_hidden_layers): {exc}"
        ) from exc


def row_costs(seq_lengths: Iterable[Any], model: CostModel) -> np.ndarray:
    """Each row's cost from its ``seq_lengths`` (the output column: its segments' lengths)."""
    lengths = [np.asarray(s, dtype=np.int64) for s in seq_lengths]
    seg_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum([s.size for s in lengths], out=seg_offsets[1:])
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return segment_row_costs(seg_offsets, sizes, model)


def segment_row_costs(seg_offsets: np.ndarray, sizes: np.ndarray, model: CostModel) -> np.ndarray:
    """Each row's cost by ``model`` over its segments (row ``r``'s are
    ``sizes[seg_offsets[r]:seg_offsets[r + 1]]``): the ``cost`` column. Tokens and squares are
    summed exactly in int64 before the model's float arithmetic, so the writer, the sampler
    and ``verify`` get the same float64 from the same lengths."""
    sizes = np.asarray(sizes, dtype=np.int64)
    sq = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes * sizes, out=sq[1:])
    tok = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=tok[1:])
    lo, hi = seg_offsets[:-1], seg_offsets[1:]
    return model.row_cost(tok[hi] - tok[lo], sq[hi] - sq[lo])


def schedule(cost: np.ndarray, ranks: int, *, rows_per_rank: int = 1, seed: int = 0) -> np.ndarray:
    """The rows' order (a permutation of ``range(len(cost))``) for ``ranks`` data-parallel
    ranks taking ``rows_per_rank`` rows each per step, laid out for a sequential
    distributed sampler (module docstring). Rows of equal cost keep their index order."""
    cost = np.asarray(cost, np.float64)
    if ranks < 1 or rows_per_rank < 1:
        raise ValueError(f"ranks and rows_per_rank must be >= 1, got {ranks}, {rows_per_rank}")
    n, k = cost.size, rows_per_rank
    per_step = ranks * k
    by_cost = np.argsort(-cost, kind="stable")
    n_full = n // per_step
    # Full steps of neighbours by cost; within a step, rounds of ``ranks`` rows dealt in a
    # snake (rank 0..D-1, then D-1..0, ...): rank r's j-th row sits at j * ranks + r.
    steps = by_cost[: n_full * per_step].reshape(n_full, k, ranks).copy()
    steps[:, 1::2, :] = steps[:, 1::2, ::-1]
    rng = np.random.default_rng(seed)
    order = steps[rng.permutation(n_full)].reshape(-1)
    # The short last step, last: the sampler's padding goes there.
    return np.concatenate([order, by_cost[n_full * per_step :]]).astype(np.int64)


def idle_share(cost_in_order: np.ndarray, ranks: int, *, rows_per_rank: int = 1) -> float:
    """Share of GPU time spent waiting, when a sequential distributed sampler deals rows in
    this order: per step each rank's load is the sum of its rows' costs and every rank waits
    for the largest. A short last step counts only its ranks that have rows."""
    c = np.asarray(cost_in_order, np.float64)
    per_step = ranks * rows_per_rank
    n_full = c.size // per_step
    full = c[: n_full * per_step].reshape(n_full, rows_per_rank, ranks).sum(axis=1)
    busy = float(full.sum())
    wall = float(full.max(axis=1).sum()) * ranks if n_full else 0.0
    rest = c[n_full * per_step :]
    if rest.size:
        loads = np.zeros(ranks)
        np.add.at(loads, np.arange(rest.size) % ranks, rest)
        used = min(ranks, rest.size)
        busy += float(loads.sum())
        wall += float(loads.max()) * used
    return 1.0 - busy / wall if wall else 0.0
