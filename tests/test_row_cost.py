"""The optional per-row ``cost`` column (issue 27 item 1, ``--cost-model``): each row's
training compute by a cost model over its segments, off by default.

The oracle writes the model out by hand: 6 FLOPs per parameter per token, and for causal
flash attention 12 * layers * hidden / 2 per squared segment length, with the Llama 3.2 1B
shape (1.24e9 parameters, 16 layers, hidden 2048), summed over ``seq_lengths`` in Python.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from corpora import mixed_corpus

from packcli.config import WriteConfig
from packcli.errors import ConfigError
from packcli.tokenize.shards import sha256_file

ARGS = ("--short-len", "128", "--long-len", "1024", "-q")


def _by_hand(seq_lengths: list[int], per_token: float, per_square: float) -> float:
    return per_token * sum(seq_lengths) + per_square * sum(n * n for n in seq_lengths)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_corpus(tmp_path_factory.mktemp("cost") / "c.jsonl", 300, 3)


@pytest.fixture(scope="module")
def plain(corpus: Path, toy_tokenizer_path: Path) -> Path:
    out = corpus.parent / "plain"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *ARGS)
    return out


@pytest.fixture(scope="module")
def costed(corpus: Path, toy_tokenizer_path: Path) -> Path:
    out = corpus.parent / "costed"
    invoke_ok(
        "pack", corpus, "-t", toy_tokenizer_path, "-o", out, *ARGS, "--cost-model", "llama-1b"
    )
    return out


def test_the_cost_column_is_the_model_over_seq_lengths(costed: Path) -> None:
    per_token, per_square = 6 * 1.24e9, 12 * 16 * 2048 / 2
    meta = json.loads((costed / "packcli.json").read_text())
    assert meta["config"]["write"]["cost_model"] == "llama-1b"
    assert meta["run"]["cost_model"] == {
        "spec": "llama-1b",
        "per_token": per_token,
        "per_square": per_square,
    }
    for name in ("long", "short"):
        table = pq.read_table(costed / "data" / name)
        assert table.schema.field("cost").type == pa.float64()
        for row in table.to_pylist():
            want = _by_hand(row["seq_lengths"], per_token, per_square)
            assert row["cost"] == pytest.approx(want, rel=1e-12)
    card = (costed / "README.md").read_text()
    assert "`cost` | float64" in card and "name: cost" in card and "dtype: float64" in card
    assert invoke("verify", costed)[0] == 0


def test_off_by_default_and_the_other_columns_do_not_change(plain: Path, costed: Path) -> None:
    meta = json.loads((plain / "packcli.json").read_text())
    assert meta["config"]["write"]["cost_model"] is None and "cost_model" not in meta["run"]
    assert "`cost`" not in (plain / "README.md").read_text()
    for name in ("long", "short"):
        files = sorted((plain / "data" / name).glob("*.parquet"))
        assert [f.name for f in files] == sorted(
            f.name for f in (costed / "data" / name).glob("*.parquet")
        )
        for f in files:
            without = pq.read_table(f)
            assert "cost" not in without.column_names
            with_cost = pq.read_table(costed / "data" / name / f.name)
            assert with_cost.drop_columns(["cost"]).equals(without)
    # Packing again without the flag gives the same bytes (the default is stable).
    again = plain.parent / "plain-again"
    corpus = plain.parent / "c.jsonl"
    tok = json.loads((plain / "packcli.json").read_text())["run"]["tokenizer"]["source"]
    invoke_ok("pack", corpus, "-t", tok, "-o", again, *ARGS)
    for name in ("long", "short"):
        for f in sorted((plain / "data" / name).glob("*.parquet")):
            assert sha256_file(f) == sha256_file(again / "data" / name / f.name)


def test_verify_recomputes_the_cost(costed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(costed, out, symlinks=True)
    meta = json.loads((out / "packcli.json").read_text())
    entry = meta["files"]["long"][0]
    path = out / "data" / "long" / entry["file"]
    table = pq.read_table(path)
    cost = table.column("cost").to_pylist()
    cost[0] *= 1.5
    table = table.set_column(
        table.schema.get_field_index("cost"), "cost", pa.array(cost, pa.float64())
    )
    pq.write_table(table, path)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and "row 0: cost" in output and "differs from the cost model" in output
    # packcli.json stating no model: the column itself is refused.
    del meta["run"]["cost_model"]
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and "states no cost model" in output, output


def test_stats_row_cost_agrees_with_the_column(costed: Path) -> None:
    from packcli.publish.stats import compute_stats

    numbers, tiers = compute_stats(costed)
    for name in ("long", "short"):
        column = pq.read_table(costed / "data" / name, columns=["cost"]).column("cost")
        values = sorted(column.to_pylist())
        got = numbers["tiers"][name]["row_cost"]
        assert (
            got["model"] == "llama-1b" and numbers["tiers"][name]["schedule"]["model"] == "llama-1b"
        )
        assert got["max"] == values[-1] and got["min"] == values[0]
        assert got["mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
        assert got["balance_ratio"] == pytest.approx(values[-1] * len(values) / sum(values))
        assert sorted(tiers[name].row_cost.tolist()) == values  # type: ignore[union-attr]


def test_stats_refuses_a_cost_column_off_its_model(costed: Path, tmp_path: Path) -> None:
    from packcli.errors import PackcliError
    from packcli.publish.stats import compute_stats

    out = tmp_path / "out"
    shutil.copytree(costed, out, symlinks=True)
    meta = json.loads((out / "packcli.json").read_text())
    meta["run"]["cost_model"]["per_square"] *= 2
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))
    with pytest.raises(PackcliError, match="cost column differs from its cost model"):
        compute_stats(out)


def test_a_transformers_config_names_the_model(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    config = tmp_path / "model"
    config.mkdir()
    shape = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 512}
    shape |= {"num_attention_heads": 4, "vocab_size": 1000}
    (config / "config.json").write_text(json.dumps(shape))
    out = tmp_path / "out"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *ARGS, "--cost-model", config)
    # Parameters by hand: per layer q,k,v (3 * 256^2), o (256^2), MLP (3 * 256 * 512);
    # untied embeddings and head, 2 * 1000 * 256.
    params = 4 * (4 * 256 * 256 + 3 * 256 * 512) + 2 * 1000 * 256
    per_token, per_square = 6 * params, 12 * 4 * 256 / 2
    for row in pq.read_table(out / "data" / "long").to_pylist():
        want = _by_hand(row["seq_lengths"], per_token, per_square)
        assert row["cost"] == pytest.approx(want, rel=1e-12)


def test_an_unknown_cost_model_is_refused_with_the_presets() -> None:
    with pytest.raises(ConfigError, match="llama-8b"):
        WriteConfig(cost_model="gpt-9")


def test_plan_then_write_keeps_the_cost_model(
    corpus: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Staged: ``packcli plan --cost-model`` records it, a bare ``packcli write`` takes it."""
    out = tmp_path / "out"
    invoke_ok("tokenize", corpus, "-t", toy_tokenizer_path, "-o", out, "-q")
    invoke_ok("plan", "-o", out, *ARGS, "--cost-model", "llama-8b")
    invoke_ok("write", "-o", out, "-q")
    invoke_ok("finalize", "-o", out)
    meta = json.loads((out / "packcli.json").read_text())
    assert meta["run"]["cost_model"]["spec"] == "llama-8b"
    assert "cost" in pq.read_schema(sorted((out / "data" / "long").glob("*.parquet"))[0]).names
    assert invoke("verify", out)[0] == 0
