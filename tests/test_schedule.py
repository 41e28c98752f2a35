"""The step schedule: a permutation of the rows, steps of near-equal cost per rank, dealt by
a sequential distributed sampler exactly as laid out, the same on every simulated rank."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.pack.schedule import CostModel, idle_share, preset, schedule
from packcli.sampler import PackedDistributedSampler, row_costs


def _idle_by_hand(cost: np.ndarray, order: np.ndarray, ranks: int, k: int) -> float:
    """The oracle: deal rows to ranks as torch's sequential sampler does (position p to
    rank p % ranks), ``k`` rows per rank make a step, each step lasts its largest load."""
    busy = wall = 0.0
    per_rank: list[list[float]] = [[] for _ in range(ranks)]
    for p, row in enumerate(order):
        per_rank[p % ranks].append(float(cost[row]))
    steps = max(-(-len(r) // k) for r in per_rank) if order.size else 0
    for s in range(steps):
        loads = [sum(r[s * k : (s + 1) * k]) for r in per_rank if r[s * k : (s + 1) * k]]
        busy += sum(loads)
        wall += max(loads) * len(loads)
    return 1.0 - busy / wall if wall else 0.0


@settings(max_examples=80, deadline=None)
@given(
    cost=st.lists(st.floats(0, 1e6), min_size=0, max_size=120),
    ranks=st.integers(1, 9),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_schedule_is_a_permutation_and_idle_share_matches_dealing(
    cost: list[float], ranks: int, k: int, seed: int
) -> None:
    c = np.array(cost, np.float64)
    order = schedule(c, ranks, rows_per_rank=k, seed=seed)
    assert np.array_equal(np.sort(order), np.arange(c.size))
    assert np.array_equal(order, schedule(c, ranks, rows_per_rank=k, seed=seed))
    for o in (order, np.arange(c.size)):
        got = idle_share(c[o], ranks, rows_per_rank=k)
        assert got == pytest.approx(_idle_by_hand(c, o, ranks, k), abs=1e-9)


def test_schedule_balances_steps_that_shuffled_order_does_not() -> None:
    # Long rows of the real-text shape: most hold 4k short packs (cheap attention), some
    # one huge document (quadratic cost): in shuffled order many steps wait for one.
    rng = np.random.default_rng(0)
    model = preset("llama-8b")
    n = 4_000
    tokens = np.full(n, 131_072.0)
    huge = rng.random(n) < 0.15
    squares = np.where(huge, rng.uniform(0.3, 1.0, n) * 131_072.0**2, 32 * 4096.0**2)
    cost = model.row_cost(tokens, squares)
    shuffled = rng.permutation(n)
    for ranks, k in ((8, 1), (64, 1), (8, 4)):
        before = idle_share(cost[shuffled], ranks, rows_per_rank=k)
        after = idle_share(cost[schedule(cost, ranks, rows_per_rank=k)], ranks, rows_per_rank=k)
        assert before > 0.1 and after < 0.03, (ranks, k, before, after)


def test_steps_come_in_a_seeded_order_not_by_cost() -> None:
    # No curriculum by accident: the first steps are not the costliest ones.
    cost = np.arange(800, dtype=np.float64)
    a = schedule(cost, 8, seed=1)
    assert not np.array_equal(a, np.argsort(-cost, kind="stable"))
    assert not np.array_equal(a, schedule(cost, 8, seed=2))
    steps = cost[a].reshape(-1, 8)
    assert (steps.max(axis=1) - steps.min(axis=1) <= 7).all()  # a step: 8 neighbours


@pytest.mark.parametrize(("ranks", "k", "n"), [(4, 1, 37), (8, 3, 100), (3, 2, 5)])
def test_every_simulated_rank_reproduces_the_schedule(ranks: int, k: int, n: int) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler

    cost = np.random.default_rng(n).uniform(1, 100, n)
    samplers = [
        PackedDistributedSampler(cost, ranks, r, rows_per_rank=k, seed=3) for r in range(ranks)
    ]
    order = samplers[0].order()
    for r, sampler in enumerate(samplers):
        # The same as torch's own sequential sampler over the rows in scheduled order.
        plain = DistributedSampler(range(n), num_replicas=ranks, rank=r, shuffle=False)
        assert list(sampler) == [int(order[i]) for i in plain]
        assert len(sampler) == len(plain)
        assert np.array_equal(sampler.order(), order)  # every rank computes the same
    for s in samplers:
        s.set_epoch(1)
    if n >= 2 * ranks * k:  # two full steps or more: another epoch, another step order
        assert not np.array_equal(samplers[0].order(), order)
    loader = torch.utils.data.DataLoader(list(range(n)), sampler=samplers[1], batch_size=k)
    assert [int(x) for b in loader for x in b] == list(samplers[1])


def test_costs_from_seq_lengths_and_a_model_config(tmp_path: Path) -> None:
    model = CostModel(per_token=2.0, per_square=0.5)
    got = row_costs([[3, 1], [4]], model)
    assert got.tolist() == [2.0 * 4 + 0.5 * 10, 2.0 * 4 + 0.5 * 16]
    cfg = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from_config = CostModel.of_config(tmp_path / "config.json")
    # Llama-3-8B's shape: ~8.03B parameters, so its preset and its config agree closely.
    assert from_config.per_token == pytest.approx(preset("llama-8b").per_token, rel=0.01)
    assert from_config.per_square == preset("llama-8b").per_square
    with pytest.raises(ValueError):
        preset("gpt-9")
    with pytest.raises(ValueError):
        schedule(np.ones(3), 0)
