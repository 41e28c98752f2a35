"""A distributed sampler that deals packed rows in a compute-balanced step schedule.

Why a sampler and not a reordered dataset: the schedule depends on the data-parallel size
and on rows per rank per step, which the training job knows and the pack does not; and
each epoch gets its own shuffle of the steps. Every rank computes the same schedule from
the rows' costs and the seed (``packcli.pack.schedule``), so no rank needs to talk to
another. It needs no torch: a ``DataLoader`` takes any sized iterable of indices as its
``sampler``; it pads like torch's ``DistributedSampler(shuffle=False, drop_last=False)``
(indices from the start again), so every rank yields the same number of rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from packcli.pack.schedule import row_costs, schedule

__all__ = ["PackedDistributedSampler", "row_costs"]


class PackedDistributedSampler:
    """Rank ``rank`` of ``num_replicas``: its rows of each step of the schedule, in order.

    ``costs``: one per row of the dataset (``row_costs``). ``rows_per_rank``: the rows
    each rank takes per optimizer step (its micro-batches times gradient accumulation).
    ``set_epoch(e)`` draws another order of the steps (the steps themselves stay balanced)."""

    def __init__(
        self,
        costs: np.ndarray,
        num_replicas: int,
        rank: int,
        *,
        rows_per_rank: int = 1,
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.costs = np.asarray(costs, np.float64)
        self.num_replicas = num_replicas
        self.rank = rank
        self.rows_per_rank = rows_per_rank
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> np.ndarray:
        """The whole schedule of this epoch (the same on every rank)."""
        seed = int(np.random.SeedSequence([self.seed, self.epoch]).generate_state(1)[0])
        return schedule(self.costs, self.num_replicas, rows_per_rank=self.rows_per_rank, seed=seed)

    def __len__(self) -> int:
        return -(-self.costs.size // self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        total = len(self) * self.num_replicas
        if order.size and total > order.size:  # pad from the start, as torch does
            order = np.concatenate([order, np.resize(order, total - order.size)])
        return iter(order[self.rank : total : self.num_replicas].tolist())
