"""Optimizer steps for packed rows, matched to an unpacked run.

Why: packing changes what one "sample" is. A row of 4096 tokens may hold 30 short documents
or one long one, so a batch size and a steps-per-epoch figure written for unpacked training
(B documents a step) mean something else on packed rows. This turns the rows' shape (documents
and tokens per row) and a target of tokens per optimizer step into the packed batch size (rows
per step, over all devices and accumulation steps), the steps per epoch, and the unpacked
batch size that sees the same documents per step, so the two runs can be compared step by step
(and the learning-rate schedule carried over). Documents per step are equal in expectation:
rows are means over many documents, and a row's documents are whole (or whole pieces).

Pure arithmetic over two integer lists, O(rows); no torch, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    """One epoch of packed rows against the equivalent unpacked run.

    ``samples_per_row`` is the mean documents per row (pairs per row for preference data when
    the caller counts pairs). ``rows_per_step`` is the packed global batch size;
    ``unpacked_batch_size`` the documents per step that an unpacked run needs to see as many
    documents (and, in expectation, tokens) per step.
    """

    rows: int
    documents: int
    tokens: int
    samples_per_row: float
    tokens_per_row: float
    rows_per_step: int
    steps_per_epoch: int
    documents_per_step: float
    tokens_per_step: float
    unpacked_batch_size: int
    unpacked_steps_per_epoch: int


def plan_steps(
    documents_per_row: Sequence[int],
    tokens_per_row: Sequence[int],
    *,
    tokens_per_step: int | None = None,
    unpacked_batch_size: int | None = None,
) -> StepPlan:
    """The step plan for a target of ``tokens_per_step`` (real tokens per optimizer step), or
    for the ``unpacked_batch_size`` (documents per step) of an existing unpacked recipe.

    ``documents_per_row`` counts the documents of each row (``len(seq_lengths)``; a document
    split across rows counts once per piece; for preference rows pass pairs per row, i.e.
    the chosen segments); ``tokens_per_row`` is ``num_tokens``. The packed batch size is
    rounded to the nearest whole row (at least one), and the unpacked batch size to the
    nearest whole document of the packed step's mean.

    >>> p = plan_steps([3, 5, 4, 4], [1000, 1024, 1010, 1014], tokens_per_step=2048)
    >>> (p.samples_per_row, p.rows_per_step, p.steps_per_epoch, p.unpacked_batch_size)
    (4.0, 2, 2, 8)
    """
    if len(documents_per_row) != len(tokens_per_row):
        raise ValueError(
            f"documents_per_row has {len(documents_per_row)} rows but tokens_per_row has "
            f"{len(tokens_per_row)}"
        )
    if len(documents_per_row) == 0:  # also a numpy array's way (no list of every row)
        raise ValueError("no rows: nothing to plan")
    if min(documents_per_row) < 1 or min(tokens_per_row) < 1:
        raise ValueError("every row needs at least one document and one token")
    if (tokens_per_step is None) == (unpacked_batch_size is None):
        raise ValueError("give exactly one of tokens_per_step and unpacked_batch_size")
    target = tokens_per_step if tokens_per_step is not None else unpacked_batch_size
    if target is None or target < 1:
        raise ValueError(f"the target per step must be a positive int, got {target!r}")

    return plan_totals(
        len(documents_per_row),
        int(sum(documents_per_row)),
        int(sum(tokens_per_row)),
        tokens_per_step=tokens_per_step,
        unpacked_batch_size=unpacked_batch_size,
    )


def plan_totals(
    rows: int,
    documents: int,
    tokens: int,
    *,
    tokens_per_step: int | None = None,
    unpacked_batch_size: int | None = None,
) -> StepPlan:
    """``plan_steps`` from the rows' totals alone (what it uses of them), for a caller that
    summed them part by part (``verify``); the per-row checks are the caller's."""
    target = tokens_per_step if tokens_per_step is not None else unpacked_batch_size
    if target is None or target < 1 or rows < 1:
        raise ValueError(f"need rows and a positive target per step, got {rows}, {target!r}")
    samples_per_row = documents / rows
    tokens_per_row_mean = tokens / rows
    if tokens_per_step is not None:
        rows_per_step = max(1, round(tokens_per_step / tokens_per_row_mean))
    else:
        rows_per_step = max(1, round(target / samples_per_row))
    rows_per_step = min(rows_per_step, rows)  # one step cannot take more than the epoch
    documents_per_step = rows_per_step * samples_per_row
    # Given (validated >= 1 above), or the packed step's documents.
    unpacked = unpacked_batch_size or max(1, round(documents_per_step))
    return StepPlan(
        rows=rows,
        documents=documents,
        tokens=tokens,
        samples_per_row=samples_per_row,
        tokens_per_row=tokens_per_row_mean,
        rows_per_step=rows_per_step,
        steps_per_epoch=math.ceil(rows / rows_per_step),
        documents_per_step=documents_per_step,
        tokens_per_step=rows_per_step * tokens_per_row_mean,
        unpacked_batch_size=unpacked,
        unpacked_steps_per_epoch=math.ceil(documents / unpacked),
    )
