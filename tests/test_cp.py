"""Context-parallel-ready rows (``--cp-size C``, issue 27): every segment padded to a multiple
of 2C, placed by its padded size, the padding written as the run's EOS with label -100 and
counted in ``seq_pad``, the report and the card; ``verify`` holds the padding to the stated
policy; the collator's THD boundaries and TE's context-parallel split.

Oracles are independent of the code under test: the pieces a plan must hold come from
``make_pieces``-free arithmetic on the lengths, padded sizes from ``ceil(n / m) * m``, and
the split of a segment over CP ranks from TE's rule written out per segment.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from corpora import mixed_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.collate import PackedCollator, cp_rank_indices
from packcli.config import PlanConfig, build_config
from packcli.errors import ConfigError
from packcli.pack.groups import merge_plans, plan_group, plan_tail
from packcli.pack.plan import plan_two_tier
from packcli.tokenize.shards import sha256_file

# --- config -------------------------------------------------------------------------------


def test_cp_size_must_divide_both_tiers_twice() -> None:
    assert PlanConfig(cp_size=4).pad_multiple == 8
    assert PlanConfig().pad_multiple == 1
    with pytest.raises(ConfigError, match="multiples of 8"):
        PlanConfig(short_len=100, long_len=4096, cp_size=4)
    with pytest.raises(ConfigError, match="cp_size must be in"):
        PlanConfig(cp_size=0)


def test_cp_size_is_refused_for_preference_pairs() -> None:
    with pytest.raises(ConfigError, match="preference"):
        build_config(overrides={"chat": {"format": "preference"}, "plan": {"cp_size": 2}})


# --- plan ---------------------------------------------------------------------------------


def _padded(n: np.ndarray, m: int) -> np.ndarray:
    return ((n + m - 1) // m) * m


def _expected_pieces(lengths: np.ndarray, long_len: int) -> Counter[tuple[int, int]]:
    """(doc, piece length) of every piece ``--overlong split`` must make."""
    out: Counter[tuple[int, int]] = Counter()
    for doc, n in enumerate(lengths.tolist()):
        while n > 0:
            out[(doc, min(n, long_len))] += 1
            n -= long_len
    return out


def _check_layout(plan: Any, m: int) -> None:
    for name in ("short", "long"):
        layout = getattr(plan, name)
        sizes = _padded(plan.piece_len[layout.row_pieces], m)
        rows = np.repeat(np.arange(layout.num_rows), np.diff(layout.row_offsets))
        held = np.bincount(rows, weights=sizes, minlength=layout.num_rows).astype(np.int64)
        assert np.array_equal(held, layout.row_tokens)  # rows hold the padded sizes
        assert (layout.row_tokens <= layout.capacity).all()


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 700), min_size=1, max_size=120),
    cp=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 3),
)
def test_a_padded_plan_places_padded_sizes_and_keeps_every_piece(
    lengths: list[int], cp: int, seed: int
) -> None:
    cfg = PlanConfig(short_len=64, long_len=256, cp_size=cp, seed=seed)
    arr = np.array(lengths, dtype=np.int64)
    plan = plan_two_tier(arr, cfg)
    _check_layout(plan, 2 * cp)
    want = _expected_pieces(arr, 256)
    for name in ("long", "short"):
        layout = getattr(plan, name)
        got = Counter(
            zip(
                plan.piece_doc[layout.row_pieces].tolist(),
                plan.piece_len[layout.row_pieces].tolist(),
                strict=True,
            )
        )
        expected = (
            want if name == "long" else Counter({k: v for k, v in want.items() if k[1] <= 64})
        )
        assert got == expected


def test_groups_and_tail_keep_the_padding() -> None:
    """Planned by groups, released rows and the tail keep padded sizes (the exchange of
    packs between rows moves padded packs)."""
    rng = np.random.default_rng(0)
    cfg = PlanConfig(short_len=64, long_len=512, cp_size=2)
    parts, tails = [], []
    for g in range(3):
        lengths = rng.integers(1, 300, 400)
        docs = np.arange(g * 400, (g + 1) * 400)
        grouped = plan_group(lengths, docs, cfg, g, tail_share=0.05)
        parts.append(grouped.plan)
        tails.append(grouped.tail)
    assert sum(t.size for t in tails) > 0
    tail = plan_tail(tails, cfg)
    for plan in [*parts, tail, merge_plans([*parts, tail])]:
        assert plan.pad_multiple == 4
        _check_layout(plan, 4)


# --- pack, verify, card -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp_out(toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cp")
    mixed_corpus(folder / "c.jsonl", 300, 2)
    out = folder / "out"
    invoke_ok(
        "pack", folder / "c.jsonl", "-t", toy_tokenizer_path, "-o", out,
        "--short-len", "128", "--long-len", "1024", "--cp-size", "4", "--dp-size", "8", "-q",
    )  # fmt: skip
    return out


def test_padded_rows_as_written(cp_out: Path) -> None:
    meta = json.loads((cp_out / "packcli.json").read_text())
    eos = meta["run"]["tokenizer"]["eos_id"]
    pad_total = {}
    for name in ("short", "long"):
        table = pq.read_table(sorted((cp_out / "data" / name).glob("*.parquet"))[0])
        assert {"labels", "seq_pad"} <= set(table.column_names)
        pads = 0
        for row in table.to_pylist():
            assert sum(row["seq_lengths"]) == row["num_tokens"] == len(row["input_ids"])
            at = 0
            for n, pad in zip(row["seq_lengths"], row["seq_pad"], strict=True):
                real = n - pad
                assert n % 8 == 0 and 0 <= pad < 8 and real >= 1
                if real < 1024:  # a document's last piece ends in its EOS (split pieces fill)
                    assert row["input_ids"][at + real - 1] == eos
                assert row["input_ids"][at + real : at + n] == [eos] * pad
                assert row["labels"][at + real : at + n] == [-100] * pad
                assert row["labels"][at] == -100
                assert row["labels"][at + 1 : at + real] == row["input_ids"][at + 1 : at + real]
                at += n
            pads += sum(row["seq_pad"])
        pad_total[name] = pads
    cp = meta["report"]["cp_padding"]
    assert cp["cp_size"] == 4 and cp["multiple"] == 8 and cp["pad_id"] == eos
    for name in ("short", "long"):
        tokens = meta["report"]["tiers"][name]["tokens"]
        assert cp[name]["pad_tokens"] == pad_total[name] > 0
        assert cp[name]["share"] == pytest.approx(pad_total[name] / (tokens + pad_total[name]))
    card = (cp_out / "README.md").read_text()
    assert "`seq_pad`" in card and "--cp-size 4" in card


def test_verify_accepts_padded_rows_and_loads_them(cp_out: Path) -> None:
    import datasets

    summary = json.loads(invoke_ok("verify", cp_out, "--json"))
    assert "report.cp_padding.long.pad_tokens" in summary["figures_checked"]
    ds = datasets.load_dataset(str(cp_out), "long", split="train")
    assert "seq_pad" in ds.column_names


def test_pack_prints_the_schedule_when_dp_size_is_given(
    cp_out: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """``--dp-size``: the report gains the simulated idle share (as ``packcli stats``
    computes it from the rows written) in its text and JSON forms; ``packcli.json`` keeps
    only what ``verify`` can derive."""
    from packcli.publish.stats import compute_stats

    meta = json.loads((cp_out / "packcli.json").read_text())
    assert "schedule" not in meta["report"]
    corpus = mixed_corpus(tmp_path / "c.jsonl", 300, 2)
    out = tmp_path / "again"
    args = ["pack", corpus, "-t", toy_tokenizer_path, "-o", out, "--short-len", "128"]
    args += ["--long-len", "1024", "--cp-size", "4", "--dp-size", "8", "-q"]
    text = invoke_ok(*args)
    assert "idle" in text and "DP=8" in text
    report = json.loads(invoke_ok(*args, "--json"))
    stats, _ = compute_stats(out)
    for name in ("short", "long"):
        want = stats["tiers"][name]["schedule"]["idle_share"].get("8")
        assert report["schedule"][name]["idle_share"].get("8") == want


def _rewrite(path: Path, edit: Any) -> None:
    table = pq.read_table(path)
    data = table.to_pydict()
    edit(data)
    pq.write_table(pa.Table.from_pydict(data, schema=table.schema), path)


def _fix_up(out: Path, config: str, path: Path) -> None:
    meta = json.loads((out / "packcli.json").read_text())
    entry = next(f for f in meta["files"][config] if f["file"] == path.name)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))


def _first_padded(data: dict[str, list]) -> tuple[int, int]:
    """(row, token index) of the first padding token of a long document."""
    for r, (lens, pads) in enumerate(zip(data["seq_lengths"], data["seq_pad"], strict=True)):
        at = 0
        for n, pad in zip(lens, pads, strict=True):
            if pad and n > 128:
                return r, at + n - 1
            at += n
    raise AssertionError("no padded long document")


def _train_a_pad(data: dict[str, list]) -> None:
    r, t = _first_padded(data)
    data["labels"][r][t] = data["input_ids"][r][t]


def _other_pad_id(data: dict[str, list]) -> None:
    r, t = _first_padded(data)
    data["input_ids"][r][t] = (data["input_ids"][r][t] + 1) % 300


def _overpad(data: dict[str, list]) -> None:
    """A segment with 8 more padding tokens, the row still within capacity: not the fewest."""
    r = next(r for r, n in enumerate(data["num_tokens"]) if n <= 1024 - 8)
    eos = data["input_ids"][r][sum(data["seq_lengths"][r][:1]) - 1]
    first = data["seq_lengths"][r][0]
    for col, value in (("input_ids", eos), ("labels", -100), ("segment_ids", 1)):
        data[col][r][first:first] = [value] * 8
    data["seq_lengths"][r][0] += 8
    data["seq_pad"][r][0] += 8
    data["num_tokens"][r] += 8


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_train_a_pad, "a padding token has a label"),
        (_other_pad_id, "not the pad id"),
        (_overpad, "padded to the next multiple of 8"),
    ],
)
def test_verify_refuses_padding_off_the_policy(
    cp_out: Path, tmp_path: Path, edit: Any, message: str
) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(cp_out, out, symlinks=True)
    path = sorted((out / "data" / "long").glob("*.parquet"))[0]
    _rewrite(path, edit)
    _fix_up(out, "long", path)
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and message in output, output


def test_verify_refuses_padding_packcli_json_does_not_state(cp_out: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(cp_out, out, symlinks=True)
    meta = json.loads((out / "packcli.json").read_text())
    meta["config"]["plan"]["cp_size"] = 1
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and "cp_size is 1" in output, output


# --- collator -----------------------------------------------------------------------------


def _te_split(cu_padded: list[int], cp: int, rank: int) -> list[int]:
    """TE's rule, segment by segment: chunks ``rank`` and ``2cp - 1 - rank`` of 2cp."""
    out: list[int] = []
    for a, b in itertools.pairwise(cu_padded):
        size = (b - a) // (2 * cp)
        out += list(range(a + rank * size, a + (rank + 1) * size))
        out += list(range(a + (2 * cp - 1 - rank) * size, a + (2 * cp - rank) * size))
    return out


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_rank_indices_split_every_segment_over_the_ranks(cp: int) -> None:
    cu = [0, 8 * cp, 8 * cp + 2 * cp, 8 * cp + 2 * cp + 6 * cp]
    taken = []
    for rank in range(cp):
        got = cp_rank_indices(np.array(cu), cp, rank).tolist()
        assert got == _te_split(cu, cp, rank)
        taken += got
    assert sorted(taken) == list(range(cu[-1]))  # every token on exactly one rank
    with pytest.raises(ValueError, match="multiple of"):
        cp_rank_indices(np.array([0, 3]), 2, 0)


def test_collator_boundaries_of_padded_rows() -> None:
    rows = [
        {"input_ids": [5, 6, 7, 0, 8, 9, 10, 11], "seq_lengths": [4, 4], "seq_pad": [1, 0]},
        {"input_ids": [1, 2, 0, 0], "seq_lengths": [4], "seq_pad": [2]},
    ]
    batch = PackedCollator(mode="flash", pad_to_multiple_of=16)(rows)
    assert batch["cu_seqlens"].tolist() == [0, 3, 7, 9]
    assert batch["cu_seqlens_padded"].tolist() == [0, 4, 8, 16]  # trailing padding in the last
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 8, 12, 16]  # flash-attn: its own block
    assert batch["max_seqlen"] == 8
    labels = batch["labels"][0].tolist()
    assert labels[:8] == [-100, 6, 7, -100, -100, 9, 10, 11]
    assert labels[8:] == [-100, 2, -100, -100] + [-100] * 4
    for mode in ("position_ids", "mask4d"):  # padding masked from the loss in every mode
        padded = PackedCollator(mode=mode)(rows)
        assert padded["labels"][1].tolist() == [-100, 2, -100, -100, -100, -100, -100, -100]
        assert "cu_seqlens_padded" not in padded
    unpadded = PackedCollator(mode="flash")([{k: v for k, v in rows[0].items() if k != "seq_pad"}])
    assert "cu_seqlens_padded" not in unpadded  # rows without seq_pad: the batch as before


def test_grouped_pack_with_a_tail_pads_and_verifies(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Planned by groups of shards, the tail's rows (written from the groups' tail shards,
    which hold real tokens) are padded like the groups' own."""
    corpus = mixed_corpus(tmp_path / "c.jsonl", 400, 5)
    config = tmp_path / "grouped.yaml"
    config.write_text(
        "read:\n  batch_size: 16\ntokenize:\n  shard_tokens: 1024\n"
        "plan:\n  short_len: 128\n  long_len: 1024\n  group_tokens: 4096\n  cp_size: 2\n"
    )
    out = tmp_path / "out"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", config, "-q")
    meta = json.loads((out / "packcli.json").read_text())
    assert [p["name"] for p in meta["parts"]][-1] == "tail" and len(meta["parts"]) > 2
    assert meta["report"]["cp_padding"]["long"]["pad_tokens"] > 0
    summary = json.loads(invoke_ok("verify", out, "--json"))
    assert summary["checked_against_shards"] and summary["parts"] == len(meta["parts"])
