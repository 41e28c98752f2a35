"""``packcli stats``: numbers equal an independent recount from the Parquet files; real plots."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
from corpora import mixed_corpus, write_corpus
from typer.testing import CliRunner

from packcli.cli import app as main_app
from packcli.cli.examine import STATS_EPILOG, stats_command
from packcli.pack.schedule import preset
from packcli.publish import stats
from packcli.publish.stats import (
    PLOT_FILES,
    STATS_DIR,
    MissingExtraError,
    render_plots_section,
    training_snippet,
)

runner = CliRunner()
app = typer.Typer(add_completion=False, rich_markup_mode=None)
app.command("stats", epilog=STATS_EPILOG)(stats_command)
app.command("noop")(lambda: None)  # two commands, so "stats" stays a subcommand

CAPACITY = {"short": 64, "long": 1024}


def pack(corpus: Path, tok: Path, out: Path) -> None:
    args = ["pack", str(corpus), "-t", str(tok), "-o", str(out)]
    args += ["--short-len", "64", "--long-len", "1024", "-q"]
    result = runner.invoke(main_app, args)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("stats")
    mixed_corpus(root / "corpus.jsonl", 300, 7)
    pack(root / "corpus.jsonl", toy_tokenizer_path, root / "out")
    return root / "out"


@pytest.fixture(scope="module")
def stats_json(packed: Path) -> dict[str, Any]:
    """``stats --json`` of ``packed``, which also writes the plots (slow: run once)."""
    return run_json(packed)


def quantile(values: list[float], q: float) -> float:
    """The smallest observed value with at least q% of the values at or below it."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def recount(out: Path) -> dict[str, Any]:
    """Every number of ``stats --json``, recounted row by row from the Parquet files."""
    tiers = {}
    all_lengths: list[int] = []
    for name in ("long", "short"):
        files = sorted((out / "data" / name).glob("*.parquet"))
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        cap = CAPACITY[name]
        ntok = [r["num_tokens"] for r in rows]
        nseg = [len(r["seq_lengths"]) for r in rows]
        cost = [sum(n * n for n in r["seq_lengths"]) for r in rows]
        if name == "long":
            all_lengths = [n for r in rows for n in r["seq_lengths"]]
        tiers[name] = {
            "rows": len(rows),
            "tokens": sum(ntok),
            "segments": sum(nseg),
            "efficiency": sum(ntok) / (len(rows) * cap) if rows else 1.0,
            "fill": [t / cap for t in ntok],
            "segments_per_row": nseg,
            "cost": cost,
            "unmasked": sum(t * t for t in ntok),
            "num_tokens": ntok,
        }
    return {"tiers": tiers, "lengths": all_lengths}


def check_schedule(got: dict[str, Any], tier: dict[str, Any]) -> None:
    """The idle shares, recounted: the output's rows dealt to ranks in file order (position
    p to rank p % dp, each step as long as its costliest row), and the schedule no worse."""
    model = preset(got["model"])
    costs = [
        model.per_token * t + model.per_square * c
        for t, c in zip(tier["num_tokens"], tier["cost"], strict=True)
    ]
    for dp in (8, 64):
        if len(costs) < 2 * dp:
            assert str(dp) not in got["idle_share"]
            continue
        busy = wall = 0.0
        for at in range(0, len(costs), dp):
            step = costs[at : at + dp]
            busy += sum(step)
            wall += max(step) * len(step)
        idle = got["idle_share"][str(dp)]
        assert idle["shuffled"] == pytest.approx(1 - busy / wall)
        assert 0 <= idle["scheduled"] <= idle["shuffled"] + 1e-12


def check_distribution(got: dict[str, Any], values: list[float]) -> None:
    for key, q in stats.QUANTILES:
        assert got[key] == pytest.approx(quantile(values, q)), key
    assert got["mean"] == pytest.approx(sum(values) / len(values))


def run_json(out: Path, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["stats", str(out), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_numbers_match_an_independent_recount(
    packed: Path, stats_json: dict[str, Any]
) -> None:
    got = stats_json
    want = recount(packed)
    report = json.loads((packed / "packcli.json").read_text())["report"]
    for name, w in want["tiers"].items():
        g = got["tiers"][name]
        assert w["rows"] > 0
        assert (g["rows"], g["tokens"], g["segments"]) == (w["rows"], w["tokens"], w["segments"])
        assert g["efficiency"] == pytest.approx(w["efficiency"])
        assert g["efficiency"] == pytest.approx(report["tiers"][name]["efficiency"])
        assert g["capacity"] == CAPACITY[name]
        check_distribution(g["fill"], w["fill"])
        check_distribution(g["segments_per_row"], w["segments_per_row"])
        cost = g["attention_cost"]
        mean = sum(w["cost"]) / len(w["cost"])
        assert cost["mean"] == pytest.approx(mean)
        assert cost["max"] == max(w["cost"])
        assert cost["p50"] == quantile(w["cost"], 50)
        assert cost["balance_ratio"] == pytest.approx(max(w["cost"]) / mean)
        assert cost["vs_unmasked"] == pytest.approx(sum(w["cost"]) / w["unmasked"])
        check_schedule(g["schedule"], w)
    assert "8" in got["tiers"]["short"]["schedule"]["idle_share"]  # the check above ran
    docs = got["document_lengths"]
    assert docs["count"] == len(want["lengths"]) == report["tiers"]["long"]["segments"]
    check_distribution(docs, want["lengths"])
    assert docs["max"] == 1024  # the overlong documents were split into long_len pieces
    # The pieces are segments, not documents, and the numbers (and the plot's title) say so.
    policy = report["policy"]
    assert docs["split_documents"] == policy["split_docs"] > 0
    assert docs["split_pieces"] == policy["split_pieces"] > policy["split_docs"]
    kept = report["input"]["documents"] - policy.get("dropped_docs", 0)
    assert docs["documents"] == kept < docs["count"]
    title = stats.doc_lengths_title(docs)
    assert f"{docs['count']:,} segments = {kept:,} documents" in title
    assert f"{policy['split_docs']:,} of them split into {policy['split_pieces']:,} pieces" in title
    plain = {"count": 5, "documents": 5, "split_documents": 0, "split_pieces": 0}
    assert stats.doc_lengths_title(plain) == "Document lengths (5 segments)"


def test_plots_are_real_images(packed: Path, stats_json: dict[str, Any]) -> None:
    from matplotlib.image import imread

    assert stats_json["plots"] == [f"{STATS_DIR}/{p}" for p in PLOT_FILES]
    for name in PLOT_FILES:
        image = imread(packed / STATS_DIR / name)
        assert image.ndim == 3 and image.shape[0] >= 300 and image.shape[1] >= 600
        rgb = (image[..., :3] * 255).astype(np.int64).reshape(-1, 3)
        colours = np.unique(rgb @ np.array([1 << 16, 1 << 8, 1]))
        assert len(colours) > 20, f"{name} is nearly blank"
    assert not list((packed / STATS_DIR).glob(".*tmp-*"))


def test_plots_section_embeds_the_plots_by_relative_path(
    packed: Path, stats_json: dict[str, Any], tmp_path: Path
) -> None:
    assert render_plots_section(tmp_path) == ""
    section = render_plots_section(packed)
    links = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", section)
    assert links == [f"{STATS_DIR}/{p}" for p in PLOT_FILES]
    assert all((packed / link).is_file() for link in links)


def test_no_plots_writes_nothing_and_tables_print(packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out, ignore=shutil.ignore_patterns(STATS_DIR))
    assert run_json(out, "--no-plots")["plots"] == []
    result = runner.invoke(app, ["stats", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    for title in ("Configs", "Document lengths", "Row fill", "per row", "balance"):
        assert title in result.output
    assert not (out / STATS_DIR).exists()


def test_an_empty_short_config(tmp_path: Path, toy_tokenizer_path: Path) -> None:
    write_corpus(tmp_path / "corpus.jsonl", [150, 200, 300], seed=1)  # all over 64 tokens
    pack(tmp_path / "corpus.jsonl", toy_tokenizer_path, tmp_path / "out")
    got = run_json(tmp_path / "out")
    short = got["tiers"]["short"]
    assert short["rows"] == 0 and short["fill"]["p50"] is None
    assert got["document_lengths"]["count"] == 3
    assert all((tmp_path / "out" / p).is_file() for p in got["plots"])


def test_missing_extra_names_the_pip_command(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    result = runner.invoke(app, ["stats", str(packed)])
    assert isinstance(result.exception, MissingExtraError)
    assert "pip install 'packcli[stats]'" in str(result.exception)
    assert run_json(packed, "--no-plots")["tiers"]["long"]["rows"] > 0  # needs no extra


def test_incomplete_output_is_a_user_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["stats", str(tmp_path), "--json"])
    assert isinstance(result.exception, stats.PackcliError)
    assert "incomplete" in str(result.exception)


def test_training_snippet_is_valid_python_using_the_collator() -> None:
    text = training_snippet("me/packed", pad_token_id=7)
    code = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert code is not None
    compile(code.group(1), "snippet", "exec")
    assert 'PackedCollator(mode="position_ids", pad_token_id=7)' in text
    assert 'load_dataset("me/packed", "long"' in text
    assert "remove_unused_columns=False" in text


@pytest.mark.parametrize("preference", [False, True])
def test_training_snippet_blocks_compile_and_its_trl_config_passes_the_check(
    preference: bool,
) -> None:
    """Every block compiles; the TRL config the card recommends is one check_sft_config
    accepts (the card used to say nothing of TRL, whose defaults cut packcli rows)."""
    text = training_snippet("me/packed", pad_token_id=7, preference=preference)
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == (3 if preference else 2)
    for block in blocks:
        compile(block, "snippet", "exec")
    assert ("segment_logps" in text) is preference
    assert training_snippet("me/packed", pad_token_id=7, preference=preference) == text
    trl = pytest.importorskip("trl")
    line = next(x for x in blocks[1].splitlines() if x.startswith("args = SFTConfig("))
    # use_cpu: TRL's default bf16=True refuses a machine without a GPU otherwise.
    on_cpu = functools.partial(trl.SFTConfig, use_cpu=True, report_to=[])
    args = eval(line.removeprefix("args = "), {"SFTConfig": on_cpu})
    from packcli.collate import PackedCollator, check_sft_config

    check_sft_config(args, PackedCollator(mode="position_ids"), attn_implementation="sdpa")
    assert args.max_length is None and not args.padding_free and not args.packing
    assert not args.remove_unused_columns


def test_card_holds_report_numbers_and_embeds_plots_after_stats(
    packed: Path, stats_json: dict[str, Any]
) -> None:
    card = (packed / "README.md").read_text()
    report = json.loads((packed / "packcli.json").read_text())["report"]
    for tier in ("long", "short"):
        t = report["tiers"][tier]
        assert f"| `{tier}` | {t['capacity']:,} | {t['rows']:,} | {t['tokens']:,} |" in card
    assert f"Input: {report['input']['documents']:,} documents" in card
    assert "PackedCollator" in card and "Made with packcli" in card
    # `stats` (run by the stats_json fixture) re-rendered the card with the plots.
    for name in PLOT_FILES:
        assert f"]({STATS_DIR}/{name})" in card
