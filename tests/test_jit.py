"""Kernels give the same arrays as plain Python and compiled, and small runs never load numba."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli import jit, write
from packcli.config import PlanConfig, WriteConfig
from packcli.pack import binpack, plan
from packcli.pack.plan import plan_two_tier
from packcli.tokenize.shards import ShardTokens
from packcli.write import TokenSource, rows_to_table

KERNELS = [f for f in jit._options if f.__module__.startswith("packcli.")]


def both(call: Callable[[], Any]) -> tuple[Any, Any]:
    """``call()`` with every kernel as plain Python, then compiled."""
    with jit.forced("python"):
        py = call()
    with jit.forced("numba"):
        nb = call()
    return py, nb


def assert_same(a: object, b: object) -> None:
    """Equal values *and* dtypes, through tuples and lists."""
    if isinstance(a, tuple | list):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert int(a) == int(b)  # type: ignore[call-overload]


def run_python(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_planner_and_writer_does_not_import_numba() -> None:
    out = run_python(
        """
        import sys
        import packcli.pack.binpack, packcli.pack.plan, packcli.write
        print("numba" in sys.modules)
        """
    )
    assert out == "False"


def test_a_small_plan_and_write_do_not_import_numba() -> None:
    out = run_python(
        """
        import sys
        import numpy as np
        import pyarrow as pa
        from packcli.config import PlanConfig
        from packcli.write import pack_table
        from packcli.arrow_np import list_array
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 9000, 300)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
        table = pa.table({"input_ids": list_array(offsets, ids, pa.int32())})
        long, short, _ = pack_table(table, PlanConfig())
        print(long.num_rows > 0, short.num_rows > 0, "numba" in sys.modules)
        """
    )
    assert out == "True True False"


def test_warm_loads_what_numbas_cache_holds_before_any_call(tmp_path: Path) -> None:
    """A process that warms ``packcli.write`` has its kernels' cached specializations loaded
    (the ones an earlier process compiled), and none it was never called with."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first = """
        import numpy as np
        from packcli import jit, write
        with jit.forced("numba"):
            ids = write._segment_ids(np.array([0, 2, 3]), np.array([4, 1, 2]))
        print(ids.tolist())
        """
    assert run_python(first, env) == "[1, 1, 1, 1, 2, 1, 1]"  # rows [4, 1] and [2]
    warmed = """
        from packcli import jit, write
        jit.warm(["packcli.write"]).join()
        print(len(jit.compiled(write._place).signatures))
        """
    assert run_python(warmed, env) == "1"  # the one specialization the first process made
    cold = {**env, "NUMBA_CACHE_DIR": str(tmp_path / "empty")}
    assert run_python(warmed, cold) == "0"


def test_an_edit_to_a_called_kernels_module_is_not_served_from_the_cache(tmp_path: Path) -> None:
    """A kernel calling another module's kernel holds that kernel's code in numba's cache
    file, which numba would keep using after an edit to the other module alone (it checks
    its own module's source): the edit must be compiled in."""
    package = tmp_path / "kernels_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    callee = package / "callee.py"
    callee.write_text(
        "from packcli import jit\n\n@jit.kernel\ndef step(x: int) -> int:\n    return x + 1\n"
    )
    (package / "caller.py").write_text(
        "from packcli import jit\nfrom kernels_pkg.callee import step\n\n"
        "@jit.kernel\ndef twice(x: int) -> int:\n    return step(step(x))\n"
    )
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    code = """
        from packcli import jit
        from kernels_pkg import caller
        print(jit.compiled(caller.twice)(1), len(jit.compiled(caller.twice).stats.cache_hits))
        """
    assert run_python(code, env) == "3 0"
    assert run_python(code, env) == "3 1"  # served from numba's cache
    callee.write_text(callee.read_text().replace("x + 1", "x + 10"))
    assert run_python(code, env).split()[0] == "21"


def test_pick_uses_python_below_the_threshold_and_the_compiled_twin_from_it() -> None:
    f = binpack._best_fit
    assert jit.pick(f, jit.SMALL_WORK - 1) is f
    twin = jit.pick(f, jit.SMALL_WORK)
    assert twin is not f and twin.py_func.__code__ is f.__code__  # the same source
    assert jit.compiled(f) is twin


def test_every_kernel_has_a_compiled_twin_of_its_own_code() -> None:
    assert {f.__name__ for f in KERNELS} >= {"_best_fit", "counting_sort", "_place"}
    for f in KERNELS:
        assert jit.compiled(f).py_func.__code__ is f.__code__


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**64 - 1))
def test_trailing_zeros_matches_numbas(x: int) -> None:
    expected = next(i for i in range(64) if x >> i & 1)
    assert jit.trailing_zeros(np.uint64(x)) == expected
    # On a one-word bitmap, the first set leaf is the word's trailing zero count.
    bits = np.array([x], dtype=np.uint64)
    offs = np.array([0, 1], dtype=np.int64)
    nw = np.array([1], dtype=np.int64)
    assert int(jit.compiled(binpack._bitmap_next)(bits, offs, nw, 0)) == expected


@pytest.mark.parametrize("n_leaves", [1, 64, 65, 4097, 262144, 300000])
def test_bitmap_kernels_agree(n_leaves: int) -> None:
    rng = np.random.default_rng(n_leaves)
    leaves = rng.integers(0, n_leaves, 100)
    probes = rng.integers(0, n_leaves, 100)

    def run() -> list[int]:
        bits, offs, nw = binpack._bitmap_new(n_leaves)
        found = []
        for leaf, x in zip(leaves, probes, strict=True):
            binpack._bitmap_set(bits, offs, int(leaf))
            found.append(int(binpack._bitmap_next(bits, offs, nw, int(x))))
            if leaf % 3 == 0:
                binpack._bitmap_clear(bits, offs, int(leaf))
        return found

    py = run()
    names = ("_bitmap_new", "_bitmap_set", "_bitmap_clear", "_bitmap_next")
    saved = {n: getattr(binpack, n) for n in names}
    try:  # the module's functions are the Python ones: call the twins in their place
        for n in names:
            setattr(binpack, n, jit.compiled(saved[n]))
        nb = run()
    finally:
        for n in names:
            setattr(binpack, n, saved[n])
    assert py == nb


lengths_st = st.lists(st.integers(1, 300), min_size=0, max_size=120)


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths_st,
    capacity=st.integers(300, 700),
    algorithm=st.sampled_from(["bfd", "ffd", "wrapped"]),
)
def test_pack_lengths_same_both_ways(lengths: list[int], capacity: int, algorithm: str) -> None:
    arr = np.array(lengths, dtype=np.int64)
    assert_same(*both(lambda: binpack.pack_lengths(arr, capacity, algorithm=algorithm)))


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, rooms=st.lists(st.integers(0, 300), max_size=30))
def test_pack_into_open_bins_same_both_ways(lengths: list[int], rooms: list[int]) -> None:
    arr, rem = np.array(lengths, dtype=np.int64), np.array(rooms, dtype=np.int64)
    assert_same(*both(lambda: binpack.pack_into_open_bins(arr, 300, rem)))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 2000), max_size=80),
    granule=st.integers(1, 300),
    max_tries=st.integers(1, 16),
)
def test_granular_and_residue_kernels_same_both_ways(
    lengths: list[int], granule: int, max_tries: int
) -> None:
    arr = np.array(lengths, dtype=np.int64)
    assert_same(*both(lambda: binpack.pack_granular(arr, 2000, granule)))
    rooms = np.array(lengths[:5], dtype=np.int64)  # open bins, as a mixture's spread plan has
    assert_same(*both(lambda: binpack.pack_granular(arr, 2000, granule, open_remaining=rooms)))
    assert_same(*both(lambda: binpack.group_by_residue(arr, 2000, granule, max_tries=max_tries)))


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 40), max_size=200), extra=st.integers(0, 5))
def test_group_by_same_both_ways(keys: list[int], extra: int) -> None:
    arr = np.array(keys, dtype=np.int64)
    n_keys = (max(keys) + 1 if keys else 0) + extra
    assert_same(*both(lambda: plan._group_by(arr, n_keys)))
    order, offsets = plan._group_by(arr, n_keys)
    groups = np.arange(n_keys, dtype=np.int64)[::-1].copy()
    assert_same(*both(lambda: plan._concat_groups(groups, order, offsets)))


def plan_arrays(p: plan.Plan) -> list[np.ndarray]:
    out = [p.piece_doc, p.piece_start, p.piece_len]
    for layout in (p.short, p.long):
        if layout is not None:
            out += [layout.row_offsets, layout.row_pieces, layout.row_tokens]
    return out


plan_inputs = dict(
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=150),
    algorithm=st.sampled_from(["bfd", "ffd", "wrapped"]),
    overlong=st.sampled_from(["split", "truncate", "drop"]),
    balance=st.sampled_from(["none", "attention"]),
    threshold=st.integers(1, 400),
)


@settings(max_examples=60, deadline=None)
@given(**plan_inputs)
def test_plan_and_rows_same_on_either_side_of_the_threshold(
    lengths: list[int], algorithm: str, overlong: str, balance: str, threshold: int
) -> None:
    """With a small threshold, calls of one plan fall on both sides of it (some kernels run
    as Python, some compiled): every plan array and every row table is the same as all-Python."""
    arr = np.array(lengths, dtype=np.int64)
    if not (arr > 0).any() or (overlong == "drop" and not ((arr > 0) & (arr <= 1000)).any()):
        return  # nothing to plan
    cfg = PlanConfig(
        short_len=100, long_len=1000, algorithm=algorithm, overlong=overlong, balance=balance
    )
    rng = np.random.default_rng(len(lengths))
    offsets = np.concatenate([[0], np.cumsum(arr)])
    source = TokenSource(
        [ShardTokens(rng.integers(0, 1000, int(offsets[-1])).astype(np.int32), offsets, 0)]
    )

    def run() -> tuple[list[np.ndarray], list[object]]:
        p = plan_two_tier(arr, cfg)
        tables = [rows_to_table(p, lay, 0, lay.num_rows, source) for lay in (p.short, p.long)]
        return plan_arrays(p), tables

    with jit.forced("python"):
        ref_arrays, ref_tables = run()
    with pytest.MonkeyPatch.context() as mp:  # both sides of the threshold on small inputs
        mp.setattr(jit, "SMALL_WORK", threshold)
        got_arrays, got_tables = run()
    assert_same(ref_arrays, got_arrays)
    assert all(a.equals(b) for a, b in zip(ref_tables, got_tables, strict=True))


def test_parquet_bytes_same_both_ways(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 2500, 400)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    source = TokenSource(
        [ShardTokens(rng.integers(0, 70_000, int(offsets[-1])).astype(np.int32), offsets, 0)]
    )
    cfg = PlanConfig(short_len=256, long_len=4096)
    files = {}
    for mode in ("python", "numba"):
        with jit.forced(mode):
            p = plan_two_tier(lengths, cfg)
            for name in ("short", "long"):
                path = tmp_path / mode / f"{name}.parquet"
                lay = getattr(p, name)
                write.write_config_file(p, lay, source, path, WriteConfig(), 0, lay.num_rows)
                files[mode, name] = path.read_bytes()
    assert files["python", "short"] == files["numba", "short"]
    assert files["python", "long"] == files["numba", "long"]


def test_forced_refuses_unknown_modes() -> None:
    with pytest.raises(ValueError, match="python"), jit.forced("cuda"):
        pass
