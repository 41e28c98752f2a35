"""End to end: the real CLI on generated corpora, loaded back with ``datasets``."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from clirun import invoke
from corpora import mixed_lengths, write_corpus
from tokenizers import Tokenizer

from packcli.tokenize.shards import sha256_file

SMALL = ["--short-len", "64", "--long-len", "1024", "--quiet"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same heavy-tailed corpus as three files: plain, gzip and zstd."""
    folder = tmp_path_factory.mktemp("corpus")
    counts = mixed_lengths(600)
    write_corpus(folder / "a.jsonl", counts[:200], seed=1)
    write_corpus(folder / "tmp_b.jsonl", counts[200:400], seed=2)
    with gzip.open(folder / "b.jsonl.gz", "wb") as fh:
        fh.write((folder / "tmp_b.jsonl").read_bytes())
    write_corpus(folder / "tmp_c.jsonl", counts[400:], seed=3)
    (folder / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress((folder / "tmp_c.jsonl").read_bytes())
    )
    (folder / "tmp_b.jsonl").unlink()
    (folder / "tmp_c.jsonl").unlink()
    return folder


@pytest.fixture(scope="module")
def packed(
    corpus_dir: Path, toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("packed") / "out"
    code, output = invoke(
        "pack", str(corpus_dir / "*.jsonl*"), "-t", toy_tokenizer_path, "-o", out, *SMALL
    )
    assert code == 0, output
    assert "efficiency" in output and "long" in output
    assert "tokenize busy: read " in output and "idle waiting for the tokenizer" in output
    return out


def test_tokenize_stage_breakdown(packed: Path) -> None:
    """Each input unit records where its tokenize time went; the index sums them."""
    tokens = packed / ".packcli" / "tokens"
    index = json.loads((tokens / "_SUCCESS.json").read_text())
    parts = ["read", "encode", "assemble", "write", "wait"]
    assert sorted(index["times"]) == sorted(parts)
    assert index["times"]["encode"] > 0 and index["times"]["write"] > 0
    units = [json.loads(p.read_text()) for p in sorted(tokens.glob("files/*/_SUCCESS.json"))]
    assert units and len(units) == len(index["units"])  # the three small files share one
    for part in parts:
        total = sum(u["times"][part] for u in units)
        assert index["times"][part] == pytest.approx(total, abs=0.01)


def corpus_texts(corpus_dir: Path) -> list[str]:
    texts = []
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        raw = (corpus_dir / name).read_bytes()
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
        elif name.endswith(".zst"):
            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        texts += [json.loads(line)["text"] for line in raw.decode().splitlines()]
    return texts


def test_pack_outputs_load_and_hold_every_token(
    packed: Path, corpus_dir: Path, toy_tokenizer_path: Path
) -> None:
    meta = json.loads((packed / "packcli.json").read_text())
    report = meta["report"]
    long = datasets.load_dataset(str(packed), "long", split="train")
    short = datasets.load_dataset(str(packed), "short", split="train")
    assert long.num_rows == report["tiers"]["long"]["rows"] > 0
    assert short.num_rows == report["tiers"]["short"]["rows"] > 0
    assert long.features["input_ids"].feature.dtype == "int32"
    assert report["policy"]["split_docs"] > 0  # the mix has documents over the long tier

    # Independent reconstruction: every document's tokens, reassembled from the long config
    # by (doc_ids, seq_lengths), equal a fresh tokenization plus EOS.
    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    eos = tok.token_to_id("<|endoftext|>")
    pieces: dict[int, list[np.ndarray]] = {}
    for row in long:
        ids = np.array(row["input_ids"])
        assert len(ids) == row["num_tokens"] <= 1024
        assert sum(row["seq_lengths"]) == row["num_tokens"]
        assert row["segment_ids"] == [
            i + 1 for i, n in enumerate(row["seq_lengths"]) for _ in range(n)
        ]
        starts = np.cumsum([0, *row["seq_lengths"]])
        for k, doc in enumerate(row["doc_ids"]):
            pieces.setdefault(doc, []).append(ids[starts[k] : starts[k + 1]])
    texts = corpus_texts(corpus_dir)
    assert sorted(pieces) == list(range(len(texts)))
    for doc, text in enumerate(texts):
        expected = [*tok.encode(text, add_special_tokens=False).ids, eos]
        got = pieces[doc]
        if len(got) == 1:
            assert got[0].tolist() == expected
        else:  # split: full 1024-token pieces in some order plus the tail
            chunks = [expected[i : i + 1024] for i in range(0, len(expected), 1024)]
            assert sorted(p.tolist() for p in got) == sorted(chunks)
    # Short config: only documents that fit a short pack, rows within 64 tokens.
    assert all(n <= 64 for r in short for n in [r["num_tokens"]])

    code, output = invoke("verify", packed)
    assert code == 0, output
    assert "against the tokenized shards" in output


def test_fast_path_used_and_identical_to_hf(
    packed: Path, corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    backend = json.loads((packed / "packcli.json").read_text())["run"]["tokenizer_backend"]
    assert backend["backend"] == "fastokens" and backend["check"]["ok"]
    hf = tmp_path / "hf"
    code, output = invoke(
        "pack",
        str(corpus_dir / "*.jsonl*"),
        "-t",
        toy_tokenizer_path,
        "-o",
        hf,
        *SMALL,
        "--tokenizer-backend",
        "hf",
    )
    assert code == 0, output
    assert (
        json.loads((hf / "packcli.json").read_text())["run"]["tokenizer_backend"]["backend"] == "hf"
    )
    for p in (packed / "data").rglob("*.parquet"):
        assert sha256_file(p) == sha256_file(hf / p.relative_to(packed))


def test_rerun_reuses_shards_and_is_byte_identical(
    packed: Path, corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    before = {p.relative_to(packed): sha256_file(p) for p in (packed / "data").rglob("*.parquet")}
    marker = (packed / "packcli.json").read_bytes()
    code, output = invoke(
        "pack", str(corpus_dir / "*.jsonl*"), "-t", toy_tokenizer_path, "-o", packed, *SMALL
    )
    assert code == 0, output
    assert "reused tokenized shards" in output
    after = {p.relative_to(packed): sha256_file(p) for p in (packed / "data").rglob("*.parquet")}
    assert before == after
    assert (packed / "packcli.json").read_bytes() == marker
    # A fresh folder from scratch gives the same bytes too.
    fresh = tmp_path / "fresh"
    code, output = invoke(
        "pack", str(corpus_dir / "*.jsonl*"), "-t", toy_tokenizer_path, "-o", fresh, *SMALL
    )
    assert code == 0, output
    again = {p.relative_to(fresh): sha256_file(p) for p in (fresh / "data").rglob("*.parquet")}
    assert again == before


def _rewrite(path: Path, mutate: Callable[[dict], dict]) -> None:
    table = pq.read_table(path)
    data = mutate(table.to_pydict())
    pq.write_table(pa.Table.from_pydict(data, schema=table.schema), path)


def _flip_token(d: dict) -> dict:
    d["input_ids"][0][0] = (d["input_ids"][0][0] + 1) % 400
    return d


def _swap_tokens(d: dict) -> dict:
    row = next(i for i, ls in enumerate(d["seq_lengths"]) if max(ls) > 2)
    seg = int(np.argmax(d["seq_lengths"][row]))
    start = sum(d["seq_lengths"][row][:seg])
    ids = d["input_ids"][row]
    j = next(
        k for k in range(start, start + d["seq_lengths"][row][seg] - 1) if ids[k] != ids[k + 1]
    )
    ids[j], ids[j + 1] = ids[j + 1], ids[j]
    return d


def _bad_segment_ids(d: dict) -> dict:
    row = next(i for i, ls in enumerate(d["seq_lengths"]) if len(ls) > 1)
    d["segment_ids"][row][0] = 2
    return d


def _shift_boundary(d: dict) -> dict:
    row = next(i for i, ls in enumerate(d["seq_lengths"]) if len(ls) > 1)
    d["seq_lengths"][row][0] += 1
    d["seq_lengths"][row][1] -= 1
    n = d["seq_lengths"][row]
    d["segment_ids"][row] = [i + 1 for i, k in enumerate(n) for _ in range(k)]
    return d


def _drop_row(d: dict) -> dict:
    return {k: v[1:] for k, v in d.items()}


def _duplicate_row(d: dict) -> dict:
    return {k: [*v, v[0]] for k, v in d.items()}


def _wrong_doc_id(d: dict) -> dict:
    d["doc_ids"][0][0] += 1
    return d


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_flip_token, "differ|other tokens"),
        (_swap_tokens, "differ|other tokens"),
        (_bad_segment_ids, "segment_ids do not run"),
        (_shift_boundary, "differ|other tokens|missing"),
        (_drop_row, "rows"),
        (_duplicate_row, "rows"),
        (_wrong_doc_id, "differ|missing|nesting"),
    ],
)
@pytest.mark.parametrize("config", ["long", "short"])
def test_verify_catches_corruption(
    packed: Path, tmp_path: Path, mutate: Callable[[dict], dict], message: str, config: str
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    meta = json.loads((out / "packcli.json").read_text())
    entry = meta["files"][config][0]
    path = out / "data" / config / entry["file"]
    _rewrite(path, mutate)
    # First: the content hash alone catches it.
    code, output = invoke("verify", out)
    assert code == 1 and "content hash" in output
    # Then with the hash updated (a deliberate forgery), the invariants still catch it.
    entry["sha256"] = sha256_file(path)
    (out / "packcli.json").write_text(json.dumps(meta))
    code, output = invoke("verify", out)
    assert code == 1, output
    assert re.search(message, output), output


def test_verify_without_shards_still_checks_configs_against_each_other(
    packed: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    shutil.rmtree(out / ".packcli")
    code, output = invoke("verify", out)
    assert code == 0 and "not present" in output
    meta = json.loads((out / "packcli.json").read_text())
    entry = meta["files"]["short"][0]
    path = out / "data" / "short" / entry["file"]
    _rewrite(path, _flip_token)
    entry["sha256"] = sha256_file(path)
    (out / "packcli.json").write_text(json.dumps(meta))
    code, output = invoke("verify", out)
    assert code == 1 and "nesting" in output


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_overlong_policies_are_counted(
    corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path, policy: str
) -> None:
    out = tmp_path / "out"
    code, output = invoke(
        "pack",
        corpus_dir / "a.jsonl",
        "-t",
        toy_tokenizer_path,
        "-o",
        out,
        "--overlong",
        policy,
        *SMALL,
    )
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    pol = report["policy"]
    n_over = report["documents_by_length"]["overlong"]
    assert n_over > 0
    if policy == "truncate":
        assert pol["truncated_docs"] == n_over and pol["truncated_tokens"] > 0
        assert (
            report["tiers"]["long"]["tokens"] == report["input"]["tokens"] - pol["truncated_tokens"]
        )
    else:
        assert pol["dropped_docs"] == n_over and pol["dropped_tokens"] > 0
        assert (
            report["tiers"]["long"]["tokens"] == report["input"]["tokens"] - pol["dropped_tokens"]
        )
    code, output = invoke("verify", out)
    assert code == 0, output


def test_malformed_line_names_file_and_line(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken}\n')
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "o", "-q")
    assert code == 1
    assert f"{corpus}:3" in output and "error:" in output
    assert not (tmp_path / "o" / "packcli.json").exists()


def test_refuses_foreign_nonempty_folder(
    corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not touch")
    args = ["pack", corpus_dir / "a.jsonl", "-t", toy_tokenizer_path, "-o", out, *SMALL]
    code, output = invoke(*args)
    assert code == 1 and "not a packcli output" in output
    code, output = invoke(*args, "--overwrite")
    assert code == 0, output
    assert (out / "thesis.tex").read_text() == "do not touch"


def test_usage_errors_exit_2_and_config_errors_exit_1(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    code, _ = invoke("pack")
    assert code == 2
    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus, [5, 6])
    code, output = invoke(
        "pack",
        corpus,
        "-t",
        toy_tokenizer_path,
        "-o",
        tmp_path / "o",
        "--short-len",
        "9000",
        "--long-len",
        "4096",
    )
    assert code == 1 and "tiers must be increasing" in output
    code, output = invoke("pack", corpus, "-t", tmp_path / "nope.json", "-o", tmp_path / "o")
    assert code == 1 and "not found" in output
    code, output = invoke("verify", tmp_path / "o")
    assert code == 1 and "incomplete" in output


def test_config_file_and_flags(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus, mixed_lengths(120))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("plan:\n  short_len: 32\n  long_len: 512\n  overlong: drop\n")
    out = tmp_path / "o"
    code, output = invoke(
        "pack",
        corpus,
        "-t",
        toy_tokenizer_path,
        "-o",
        out,
        "-c",
        cfg,
        "--long-len",
        "256",
        "--num-proc",
        "1",
        "--balance",
        "attention",
        "-q",
    )
    assert code == 0, output
    balance = json.loads((out / "packcli.json").read_text())["report"]["tiers"]["long"][
        "attention_balance"
    ]
    assert balance["after"] <= balance["before"] and balance["after"] >= balance["floor"] - 1e-9
    code, output = invoke("verify", out)
    assert code == 0, output
    assert json.loads((out / "packcli.json").read_text())["config"]["tokenize"]["num_proc"] == 1
    resolved = json.loads((out / "packcli.json").read_text())["config"]["plan"]
    assert (resolved["short_len"], resolved["long_len"], resolved["overlong"]) == (32, 256, "drop")
    bad = tmp_path / "bad.yaml"
    bad.write_text("plan:\n  shortlen: 3\n")
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", bad)
    assert code == 1 and "unknown key" in output


def test_empty_corpus_is_an_error(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text("\n  \n")
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "o", "-q")
    assert code == 1 and "no documents" in output and "2 blank lines" in output


def test_skip_policy_quarantines_bad_lines_and_keeps_good_ones(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "mixed.jsonl"
    lines = [b'{"text": "good one"}', b"{broken", b'{"text": 5}', b"\xff\xfe", b'{"text": "two"}']
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "e", "-q")
    assert code == 1 and f"{corpus}:2" in output
    out = tmp_path / "s"
    code, output = invoke(
        "pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-q", "--on-bad-line", "skip"
    )
    assert code == 0, output
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["input"]["documents"] == 2 and report["input"]["rejected_lines"] == 3
    assert report["input"]["rejected"] == {"invalid_json": 1, "invalid_utf8": 1, "not_string": 1}
    quarantined = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [2, 3, 4]
    import base64

    assert [base64.b64decode(q["raw_b64"]).rstrip(b"\n") for q in quarantined] == lines[1:4]
    code, output = invoke("verify", out)
    assert code == 0, output


def test_full_disk_is_a_clear_error_and_nothing_is_marked_complete(
    toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import packcli.write

    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus, [5, 50, 500])

    def full(path: str, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(packcli.write.pq, "ParquetWriter", full)
    out = tmp_path / "o"
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *SMALL)
    assert code == 1 and "No space left on device" in output and "rerun" in output
    assert not (out / "packcli.json").exists()
    monkeypatch.undo()
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *SMALL)
    assert code == 0 and "reused tokenized shards" in output


def test_a_different_plan_under_the_same_settings_rewrites_the_files(
    corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write records follow the plan's content, not only its settings: a planner that packs
    the same settings differently (another packcli build) must not leave stale Parquet
    files behind the new report; an unchanged plan reuses every file."""
    import dataclasses

    from packcli.stages import plan as pipeline

    out = tmp_path / "out"
    args = ["pack", str(corpus_dir / "*.jsonl*"), "-t", toy_tokenizer_path, "-o", out, *SMALL]
    assert invoke(*args)[0] == 0
    files = sorted((out / "data").rglob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in files]
    assert invoke(*args)[0] == 0
    assert [p.stat().st_mtime_ns for p in files] == stamps  # same plan: nothing rewritten

    real = pipeline.plan_two_tier
    monkeypatch.setattr(
        pipeline,
        "plan_two_tier",
        lambda lengths, cfg: real(lengths, dataclasses.replace(cfg, algorithm="wrapped")),
    )
    assert invoke(*args)[0] == 0
    monkeypatch.undo()
    code, output = invoke("verify", out)
    assert code == 0 and "all invariants hold" in output, output


def test_report_states_the_step_plan_of_the_rows_written(
    corpus_dir: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """Samples per row and the step plan come from the rows actually written: recomputed
    here from the Parquet files (segments and tokens of every row) for the asked target."""
    from packcli.publish.steps import plan_steps

    out = tmp_path / "out"
    code, output = invoke(
        "pack", str(corpus_dir / "a.jsonl"), "-t", toy_tokenizer_path, "-o", out, *SMALL,
        "--tokens-per-step", 3000,
    )  # fmt: skip
    assert code == 0, output
    training = json.loads((out / "packcli.json").read_text())["report"]["training"]
    for name in ("short", "long"):
        table = pq.read_table(sorted((out / "data" / name).glob("*.parquet")))
        docs = [len(s) for s in table.column("seq_lengths").to_pylist()]
        tokens = table.column("num_tokens").to_pylist()
        want = plan_steps(docs, tokens, tokens_per_step=3000)
        got = training[name]
        assert got["samples_per_row"] == round(want.samples_per_row, 4)
        assert got["rows_per_step"] == want.rows_per_step
        assert got["steps_per_epoch"] == want.steps_per_epoch
        assert got["unpacked_batch_size"] == want.unpacked_batch_size
        assert got["tokens_per_step"] == 3000
        assert f"training  {name}: {want.samples_per_row:,.2f} documents a row" in output
    code, output = invoke(
        "pack", str(corpus_dir / "a.jsonl"), "-t", toy_tokenizer_path, "-o", tmp_path / "x",
        *SMALL, "--tokens-per-step", 0,
    )  # fmt: skip
    assert code == 1 and "tokens_per_step must be >= 1" in output


def test_the_console_script_keeps_exit_codes_and_messages(tmp_path: Path) -> None:
    """``main`` ends the process without the interpreter's teardown: the status and what
    was printed must be those of a normal exit."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "packcli", *args], capture_output=True, text=True, timeout=120
        )

    ok = run("--help")
    assert ok.returncode == 0 and "pack" in ok.stdout
    missing = run("verify", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "no packcli.json" in missing.stderr
    usage = run("pack")
    assert usage.returncode == 2 and "Missing" in usage.stderr
