"""``packcli.publish.steps.plan_steps``: exact plans for small inputs, invariants over random
ones."""

from __future__ import annotations

import doctest
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packcli.publish import steps
from packcli.publish.steps import plan_steps


def test_doctest() -> None:
    assert doctest.testmod(steps).failed == 0


def test_exact_plan_for_a_token_target() -> None:
    # 6 rows of ~4096 tokens holding 30 documents; 4 rows a step = 16,384 tokens.
    plan = plan_steps(
        [4, 6, 5, 5, 7, 3], [4090, 4096, 4080, 4095, 4091, 4088], tokens_per_step=16384
    )
    assert plan.rows == 6 and plan.documents == 30 and plan.tokens == 24540
    assert plan.samples_per_row == 5.0
    assert plan.rows_per_step == 4  # 16384 / 4090 = 4.006
    assert plan.steps_per_epoch == 2  # 6 rows in steps of 4: the last step is short
    assert plan.documents_per_step == 20.0
    assert plan.tokens_per_step == pytest.approx(4 * 24540 / 6)
    assert plan.unpacked_batch_size == 20
    assert plan.unpacked_steps_per_epoch == 2


def test_exact_plan_for_an_unpacked_recipe() -> None:
    # An unpacked recipe of 32 documents a step on rows of 8 documents: 4 rows a step.
    plan = plan_steps([8] * 10, [2048] * 10, unpacked_batch_size=32)
    assert (plan.rows_per_step, plan.steps_per_epoch) == (4, 3)
    assert plan.documents_per_step == 32.0 and plan.unpacked_batch_size == 32
    assert plan.unpacked_steps_per_epoch == math.ceil(80 / 32)


def test_small_targets_and_targets_beyond_the_epoch() -> None:
    assert plan_steps([2], [100], tokens_per_step=1).rows_per_step == 1
    big = plan_steps([2, 2], [100, 100], tokens_per_step=10**9)
    assert big.rows_per_step == 2 and big.steps_per_epoch == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([1, 2], [5]), {"tokens_per_step": 8}, "documents_per_row has 2 rows"),
        (([], []), {"tokens_per_step": 8}, "no rows"),
        (([0], [5]), {"tokens_per_step": 8}, "at least one document"),
        (([1], [5]), {}, "exactly one of"),
        (([1], [5]), {"tokens_per_step": 8, "unpacked_batch_size": 2}, "exactly one of"),
        (([1], [5]), {"tokens_per_step": 0}, "positive int"),
    ],
)
def test_errors_say_what_is_wrong(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_steps(*args, **kwargs)


rows_strategy = st.lists(
    st.tuples(st.integers(1, 64), st.integers(1, 8192)), min_size=1, max_size=200
)


@given(rows_strategy, st.integers(1, 1 << 20))
def test_invariants(rows: list[tuple[int, int]], tokens_per_step: int) -> None:
    docs, tokens = [d for d, _ in rows], [t for _, t in rows]
    plan = plan_steps(docs, tokens, tokens_per_step=tokens_per_step)
    assert 1 <= plan.rows_per_step <= plan.rows
    # The steps cover the epoch, and no step is wasted.
    assert (plan.steps_per_epoch - 1) * plan.rows_per_step < plan.rows
    assert plan.steps_per_epoch * plan.rows_per_step >= plan.rows
    # Nearest whole row to the token target (unless capped by the epoch or the 1-row floor).
    per_row = plan.tokens_per_row
    if 1 < plan.rows_per_step < plan.rows:
        assert abs(plan.rows_per_step * per_row - tokens_per_step) <= per_row / 2 + 1e-6
    # The unpacked run sees the packed step's documents, to the nearest document.
    assert abs(plan.unpacked_batch_size - plan.documents_per_step) <= 0.5
    assert plan.unpacked_steps_per_epoch == math.ceil(plan.documents / plan.unpacked_batch_size)


def test_imports_without_torch_or_numpy() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "from packcli.publish.steps import plan_steps\n"
        "assert plan_steps([2], [10], tokens_per_step=10).rows_per_step == 1\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_step_totals_give_every_rows_plan_without_a_list_of_them() -> None:
    """Finalize's step plan of a config's every row comes from the rows' totals (summed part
    by part, ``RowTotals``): the same figures as the plan over every row, with no list of
    every row (``tolist`` made two: ~48 B a row, most of finalize's peak at 100M documents,
    ~3 GB at 1B)."""
    import tracemalloc

    import numpy as np

    from packcli.publish.report import step_totals

    rng = np.random.default_rng(0)
    docs = rng.integers(1, 40, 1_000_000)
    tokens = rng.integers(3000, 4097, docs.size)
    want = plan_steps(docs.tolist(), tokens.tolist(), tokens_per_step=1 << 20)
    tracemalloc.start()
    try:
        hints = step_totals(docs.size, int(docs.sum()), int(tokens.sum()), 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # a list of the rows alone is 8 MB
    assert hints["rows_per_step"] == want.rows_per_step
    assert hints["samples_per_row"] == round(want.samples_per_row, 4)
    assert hints["unpacked_batch_size"] == want.unpacked_batch_size
