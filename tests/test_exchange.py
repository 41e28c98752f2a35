"""The exchange of units between long rows of different steps (issue 26): packs stay whole,
rows within capacity, the same packs and pieces, the largest window error never rises; and
a mixture packed end to end with the exchange at work verifies, with the same bytes for
any task count."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from clirun import invoke, invoke_ok
from hypothesis import given, settings
from hypothesis import strategies as st
from test_resume import data_hashes

from packcli import jit
from packcli.pack import exchange as xc
from packcli.pack import mixture as mx
from packcli.pack.plan import RowLayout, plan_two_tier
from packcli.pack.plan_config import PlanConfig


def _rows(layout: RowLayout) -> list[list[int]]:
    o = layout.row_offsets
    return [layout.row_pieces[o[r] : o[r + 1]].tolist() for r in range(layout.num_rows)]


def _pack_of_piece(plan) -> np.ndarray:
    out = np.full(plan.piece_len.size, -1, np.int64)
    s = plan.short
    out[s.row_pieces] = np.repeat(np.arange(s.num_rows), np.diff(s.row_offsets))
    return out


def _window_errors(layout: RowLayout, src: np.ndarray, lens: np.ndarray, k: int, w: int):
    """Largest |share - target| over every window of ``w`` rows, a shorter last one too
    (computed here from the rows, not with the module's helpers)."""
    rows = _rows(layout)
    total = np.zeros(k)
    per = []
    for a in range(0, len(rows), w):
        v = np.zeros(k)
        for row in rows[a : a + w]:
            for p in row:
                v[src[p]] += lens[p]
        per.append(v)
        total += v
    target = total / total.sum()
    return max(float(np.abs(v / v.sum() - target).max()) for v in per if v.sum())


def _check_exchange(lengths: list[int], sources: list[int], k: int, w: int, seed: int) -> None:
    cfg = PlanConfig(short_len=32, long_len=256, overlong="split")
    plan = plan_two_tier(np.array(lengths, np.int64), cfg)
    src = np.array(sources, np.int64)[plan.piece_doc]
    before = plan.long
    new, _moves = xc.balance_steps(before, _pack_of_piece(plan), src, plan.piece_len, k, w, seed)
    # Rows: as many, each within capacity, its tokens what its pieces say.
    assert new.num_rows == before.num_rows
    rows = _rows(new)
    tokens = [int(plan.piece_len[r].sum()) for r in rows]
    assert tokens == new.row_tokens.tolist() and max(tokens, default=0) <= cfg.long_len
    # Every piece once; every short pack whole and contiguous in one long row.
    assert sorted(new.row_pieces.tolist()) == sorted(before.row_pieces.tolist())
    where = {p: (r, i) for r, row in enumerate(rows) for i, p in enumerate(row)}
    for pack in _rows(plan.short):
        at = sorted(where[p] for p in pack)
        assert len({r for r, _ in at}) == 1
        assert [i for _, i in at] == list(range(at[0][1], at[0][1] + len(at)))
    # The largest window error does not rise.
    after_err = _window_errors(new, src, plan.piece_len, k, w)
    assert after_err <= _window_errors(before, src, plan.piece_len, k, w) + 1e-12


DOCS = st.lists(st.tuples(st.integers(1, 400), st.integers(0, 2)), min_size=2, max_size=300)


@given(docs=DOCS, w=st.integers(1, 6), seed=st.integers(0, 5))
@settings(max_examples=60, deadline=None)
def test_exchange_keeps_packs_whole_rows_within_capacity(docs, w: int, seed: int) -> None:
    lengths, sources = zip(*docs, strict=True)
    _check_exchange(list(lengths), list(sources), 3, w, seed)


@given(docs=DOCS, w=st.integers(1, 4), group=st.integers(2, 4))
@settings(max_examples=40, deadline=None)
def test_exchange_within_groups_keeps_each_groups_sums(docs, w: int, group: int) -> None:
    """Trading only within groups of windows: every group's per-source tokens stay exactly
    as they were, and the finer windows' largest error does not rise."""
    lengths, sources = zip(*docs, strict=True)
    plan = plan_two_tier(np.array(lengths, np.int64), PlanConfig(short_len=32, long_len=256))
    src = np.array(sources, np.int64)[plan.piece_doc]
    before = plan.long
    new, _ = xc.balance_steps(
        before, _pack_of_piece(plan), src, plan.piece_len, 3, w, 0, group=group
    )

    def sums(layout: RowLayout) -> list[list[int]]:
        rows, out = _rows(layout), []
        for a in range(0, len(rows), w * group):
            v = [0, 0, 0]
            for row in rows[a : a + w * group]:
                for p in row:
                    v[src[p]] += int(plan.piece_len[p])
            out.append(v)
        return out

    assert sums(new) == sums(before)
    after_err = _window_errors(new, src, plan.piece_len, 3, w)
    assert after_err <= _window_errors(before, src, plan.piece_len, 3, w) + 1e-12


def test_exchange_balances_what_no_row_order_can() -> None:
    """Six rows of four packs, three rows a window, half the packs of each source: whole rows
    leave a window at 2/3 of one source at best; packs swapped make every window even."""
    n = 24
    layout = RowLayout(16, np.arange(0, n + 1, 4), np.arange(n), np.full(6, 16))
    src = np.repeat([0, 1], 12)  # rows 0-2 all source 0, rows 3-5 all source 1
    sizes = np.full(n, 4)
    pack_of_piece = np.arange(n)  # each piece is a pack of its own
    m = mx.row_source_tokens(layout.row_offsets, layout.row_pieces, src, sizes, 2)
    ordered = mx.permute_rows(layout, mx.mix_order(m))
    assert _window_errors(ordered, src, sizes, 2, 3) >= 1 / 6 - 1e-9
    new, moves = xc.balance_steps(ordered, pack_of_piece, src, sizes, 2, 3, seed=0)
    assert moves > 0 and _window_errors(new, src, sizes, 2, 3) < 1e-9


def test_units_of_splits_rows_into_packs_and_long_pieces() -> None:
    layout = RowLayout(100, np.array([0, 3, 5]), np.array([4, 0, 1, 2, 3]), np.array([90, 60]))
    pack = np.array([7, 7, 8, 8, -1])
    src = np.array([0, 1, 0, 1, 1])
    units = xc.units_of(layout, pack, src, np.array([10, 20, 30, 30, 50]), 2)
    assert units.start.tolist() == [0, 1, 3] and units.end.tolist() == [1, 3, 5]
    assert units.row.tolist() == [0, 0, 1] and units.long.tolist() == [True, False, False]
    assert units.vec.tolist() == [[0, 50], [10, 20], [30, 30]]


def test_piece_bound_and_the_exchange_window() -> None:
    # A 128k piece of a 9.7% source in a 1M step: 12.5% - 9.7% = 2.8 points at least.
    target = np.array([0.903, 0.097])
    bound = xc.piece_bound(np.array([4096, 131072]), target, 1 << 20)
    assert bound[0] == 0 and abs(bound[1] - 0.028) < 1e-9
    # Four steps of 8 rows hold it (131072 / 4M = 3.1% < 9.7% + 0.5%): 32 rows.
    assert xc.exchange_window(8, 1000, 131072, np.array([4096, 131072]), target) == 32
    # One step of one row cannot: doubled until 131072 / (w * 131072) <= 0.102.
    assert xc.exchange_window(1, 1000, 131072, np.array([4096, 131072]), target) == 16
    assert xc.exchange_window(8, 20, 131072, np.array([4096, 131072]), target) == 20


def test_exchange_same_both_ways() -> None:
    rng = np.random.default_rng(4)
    lengths = np.concatenate([rng.integers(1, 60, 3000), rng.integers(60, 900, 200)])
    sources = rng.integers(0, 3, lengths.size)
    sources[3000:] = 2
    plan = plan_two_tier(lengths, PlanConfig(short_len=64, long_len=1024))
    src = sources[plan.piece_doc]
    args = (plan.long, _pack_of_piece(plan), src, plan.piece_len, 3, 8, 1)
    with jit.forced("python"):
        a, ma = xc.balance_steps(*args)
    with jit.forced("numba"):
        b, mb = xc.balance_steps(*args)
    assert ma == mb > 0
    for x, y in zip(
        (a.row_offsets, a.row_pieces, a.row_tokens),
        (b.row_offsets, b.row_pieces, b.row_tokens),
        strict=True,
    ):
        assert np.array_equal(x, y)


MIX = """sources:
  - name: web
    inputs: [{web}]
    weight: 3
  - name: code
    inputs: [{code}]
    weight: 1
  - name: books
    inputs: [{books}]
    weight: 1
plan:
  short_len: 64
  long_len: 512
{extra}"""


@pytest.fixture
def mix_files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(8)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    spans = {"web": (1, 30, 400), "code": (20, 150, 80), "books": (300, 1200, 12)}
    paths = {}
    for name, (lo, hi, n) in spans.items():
        docs = [" ".join(rng.choice(words, rng.integers(lo, hi))) for _ in range(n)]
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return paths


def _mix_config(tmp_path: Path, files: dict[str, Path], extra: str = "") -> Path:
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(MIX.format(extra=extra, **files))
    return cfg


def test_mixture_with_the_exchange_verifies(
    tmp_path: Path,
    toy_tokenizer_path: Path,
    mix_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps of two long rows, so the long config has several windows to exchange between:
    the output verifies (every copy once, packs whole and nested, sources labelled)."""
    import packcli.stages.plan as plan_stage

    monkeypatch.setattr(plan_stage, "TOKENS_PER_STEP", 1024)
    out = tmp_path / "out"
    cfg = _mix_config(tmp_path, mix_files)
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", out, "--config", cfg, "-q")
    records = sorted((out / ".packcli" / "plan").glob("group-*.json"))
    long = json.loads(records[0].read_text())["stats"]["mixture_windows"]["long"]
    assert long["exchange_window_rows"] == 8 and long["exchange_moves"] > 0
    code, text = invoke("verify", out)
    assert code == 0, text
    # The long config holds every copy the short one does.
    import pyarrow.parquet as pq

    seen = {}
    for name in ("short", "long"):
        table = pq.read_table(sorted((out / "data" / name).glob("*.parquet")))
        pairs = zip(
            np.concatenate(table.column("doc_ids").to_numpy(zero_copy_only=False)).tolist(),
            np.concatenate(table.column("doc_repeats").to_numpy(zero_copy_only=False)).tolist(),
            strict=True,
        )
        seen[name] = Counter(pairs)
    assert set(seen["short"]) <= set(seen["long"])
    # Without the exchange the short config's bytes are the same; the long config's differ.
    monkeypatch.setattr(xc, "balance_steps", lambda layout, *a, **k: (layout, 0))
    plain = tmp_path / "plain"
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", plain, "--config", cfg, "-q")
    ours, theirs = data_hashes(out), data_hashes(plain)
    short = [p for p in ours if "/short/" in p]
    assert short and all(ours[p] == theirs[p] for p in short)
    assert any(ours[p] != theirs[p] for p in ours if "/long/" in p)


def test_grouped_mixture_same_bytes_for_any_task_count(
    tmp_path: Path,
    toy_tokenizer_path: Path,
    mix_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import packcli.stages.plan as plan_stage

    monkeypatch.setattr(plan_stage, "TOKENS_PER_STEP", 1024)
    extra = "  group_tokens: 12000\ntokenize:\n  shard_tokens: 4096\n"
    cfg = _mix_config(tmp_path, mix_files, extra)
    hashes = []
    for tasks in (1, 3):
        out = tmp_path / f"out{tasks}"
        invoke_ok(
            "pack", "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q", "--num-tasks", tasks
        )
        assert len(list((out / ".packcli" / "plan").glob("group-*.json"))) >= 2
        assert invoke("verify", out)[0] == 0
        stats = json.loads((out / ".packcli" / "plan.json").read_text())["stats"]
        groups = [
            json.loads(p.read_text())["stats"]["mixture_windows"]["long"]
            for p in sorted((out / ".packcli" / "plan").glob("group-*.json"))
        ]
        long = stats["mixture_windows"]["long"]
        # Grouped: rows ordered, not exchanged (a group's windows are not the output's).
        assert "exchange_moves" not in long and all("exchange_moves" not in g for g in groups)
        assert long["piece_bound"] == np.max([g["piece_bound"] for g in groups], axis=0).tolist()
        hashes.append(data_hashes(out))
    assert hashes[0] == hashes[1]
