"""Pretraining mixtures (issue 26): weights as copies, the mix order, and a mixture packed
end to end through the CLI, checked against oracles computed here from the input files."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.config import SourceConfig
from packcli.errors import ConfigError
from packcli.pack import mixture as mx
from packcli.pack.plan import plan_two_tier
from packcli.pack.plan_config import PlanConfig


def _spec(weights: list[float], seed: int = 0) -> mx.MixSpec:
    names = tuple(f"s{k}" for k in range(len(weights)))
    return mx.MixSpec(names, tuple(weights), ("split",) * len(weights), seed)


@given(
    w=st.floats(0, 6, allow_nan=False),
    n=st.integers(1, 3000),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_copies_are_floor_plus_a_low_discrepancy_subset(w: float, n: int, seed: int) -> None:
    got = mx.copies(np.arange(n), np.zeros(n, np.int64), _spec([w], seed))
    whole = math.floor(w)
    assert set(np.unique(got).tolist()) <= {whole, whole + 1}
    # A Weyl sequence: the subset's size is frac * n within a few documents, not sqrt(n).
    assert abs(int((got - whole).sum()) - (w - whole) * n) <= 3 + math.log2(n + 1)


def test_copies_depend_on_the_document_alone() -> None:
    """A document's copies are the same whichever group (slice) asks: no global pass."""
    spec = _spec([0.3, 1.7], seed=5)
    idx = np.arange(1000)
    src = (idx % 2).astype(np.int64)
    whole = mx.copies(idx, src, spec)
    parts = np.concatenate(
        [mx.copies(idx[a : a + 97], src[a : a + 97], spec) for a in range(0, 1000, 97)]
    )
    assert np.array_equal(whole, parts)
    assert not np.array_equal(whole, mx.copies(idx, src, _spec([0.3, 1.7], seed=6)))


def test_shares_become_multipliers() -> None:
    m = mx.multipliers_from_shares(np.array([0.5, 0.5]), np.array([100.0, 300.0]))
    assert np.allclose(m * [100, 300], [200, 200])


@given(st.lists(st.integers(0, 2000), min_size=1, max_size=60), st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_expand_keys_round_trip_and_conserve_tokens(lengths: list[int], seed: int) -> None:
    lens = np.array(lengths, np.int64)
    docs = np.arange(lens.size, dtype=np.int64)
    first = np.array([0, lens.size // 2], np.int64)
    spec = mx.MixSpec(("a", "b"), (2.5, 0.4), ("truncate", "drop"), seed)
    ex = mx.expand(lens, docs, first, spec, long_len=1000)
    assert np.all(np.diff(mx.key_doc(ex.keys)) >= 0)  # doc order, as the planner wants
    src = mx.source_of(docs, first)
    n = mx.copies(docs - first[src], src, spec)
    n[(lens == 0) | ((src == 1) & (lens > 1000))] = 0
    assert Counter(mx.key_doc(ex.keys).tolist()) == Counter(np.repeat(docs, n).tolist())
    kept = lens.sum() - sum(s.truncated_tokens + s.policy_dropped_tokens for s in ex.stats.values())
    added = sum(s.repeat_tokens - s.subsampled_tokens for s in ex.stats.values())
    assert int(ex.lengths.sum()) == kept + added


def test_mix_order_is_a_permutation_that_keeps_windows_on_target() -> None:
    rng = np.random.default_rng(0)
    # Rows of one source each, in runs (as best fit emits them): the worst order.
    m = np.zeros((2000, 3), np.int64)
    m[np.arange(2000), np.repeat([0, 1, 2], [1000, 600, 400])] = 4096
    m[:, 0] += rng.integers(0, 50, 2000)
    order = mx.mix_order(m)
    assert sorted(order.tolist()) == list(range(2000))
    before = mx.window_deviation(m, 100)["max"]
    after = mx.window_deviation(m[order], 100)["max"]
    assert before.max() > 0.3
    assert after.max() <= 2 / 100 + 1e-9  # within two rows' tokens of a 100-row window


def test_permute_rows_keeps_every_row_whole() -> None:
    plan = plan_two_tier(np.arange(1, 300) % 97 + 1, PlanConfig(short_len=64, long_len=256))
    layout = plan.short
    order = np.random.default_rng(1).permutation(layout.num_rows)
    moved = mx.permute_rows(layout, order)
    for j in (0, 5, layout.num_rows - 1):
        r = order[j]
        old = layout.row_pieces[layout.row_offsets[r] : layout.row_offsets[r + 1]]
        new = moved.row_pieces[moved.row_offsets[j] : moved.row_offsets[j + 1]]
        assert np.array_equal(old, new)
        assert moved.row_tokens[j] == layout.row_tokens[r]


@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    w=st.integers(1, 5),
    seed=st.integers(0, 99),
)
@settings(max_examples=80, deadline=None)
def test_straddling_windows_from_the_parts_edges(sizes: list[int], w: int, seed: int) -> None:
    """The windows of ``w`` rows over the output that hold rows of two or more parts, from
    each part's edges alone, are those of the whole output (found here from the rows)."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 50, (n, 3)) for n in sizes]
    whole = np.vstack(parts)
    target = np.array([0.5, 0.3, 0.2])
    part_of = np.repeat(np.arange(len(parts)), sizes)
    want = np.zeros(3)
    for a in range(0, whole.shape[0] - w + 1, w):  # full windows only
        v = whole[a : a + w].sum(axis=0)
        if len(set(part_of[a : a + w])) > 1 and v.sum():
            want = np.maximum(want, np.abs(v / v.sum() - target))
    offsets = np.cumsum([0, *sizes[:-1]])
    edges = [mx.window_edges(m, w, int(o)) for m, o in zip(parts, offsets, strict=True)]
    assert np.allclose(mx.straddling_deviation(edges, target), want)


def test_source_flag_form() -> None:
    s = SourceConfig.parse("code:30%=a.jsonl,b/")
    assert (s.name, s.inputs, s.share, s.weight) == ("code", ("a.jsonl", "b/"), 0.3, None)
    assert SourceConfig.parse("web:0.5=x").weight == 0.5
    with pytest.raises(ConfigError, match="NAME:WEIGHT=INPUT"):
        SourceConfig.parse("web:0.5")


def _write(path: Path, key: str, docs: list[str]) -> None:
    path.write_text("".join(json.dumps({key: d}) + "\n" for d in docs))


@pytest.fixture
def mixture(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    text = {
        "web": [" ".join(rng.choice(words, rng.integers(1, 30))) for _ in range(300)],
        "code": [" ".join(rng.choice(words, rng.integers(20, 150))) for _ in range(60)],
        "books": [" ".join(rng.choice(words, rng.integers(400, 1500))) for _ in range(8)],
    }
    _write(tmp_path / "web.jsonl", "text", text["web"])
    _write(tmp_path / "code.jsonl", "body", text["code"])
    _write(tmp_path / "books.jsonl", "text", text["books"])
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"""sources:
  - name: web
    inputs: [{tmp_path / "web.jsonl"}]
    weight: 0.5
  - name: code
    inputs: [{tmp_path / "code.jsonl"}]
    weight: 2
    text_field: body
    eos: "<|bos|>"
  - name: books
    inputs: [{tmp_path / "books.jsonl"}]
    weight: 1.5
    overlong: truncate
plan:
  short_len: 64
  long_len: 512
"""
    )
    return config, text


def _segments(out: Path, config: str) -> dict[str, np.ndarray]:
    cols = {}
    table = pq.read_table(sorted((out / "data" / config).glob("*.parquet")))
    for col in ("doc_ids", "source_ids", "doc_repeats", "seq_lengths"):
        cols[col] = np.concatenate([np.asarray(x) for x in table.column(col).to_pylist()])
    cols["input_ids"] = table.column("input_ids").to_pylist()
    return cols


def test_mixture_packs_end_to_end(
    tmp_path: Path, toy_tokenizer_path: Path, mixture: tuple[Path, dict[str, list[str]]]
) -> None:
    config, _text = mixture
    out = tmp_path / "out"
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", out, "--config", config, "-q")
    meta = json.loads((out / "packcli.json").read_text())
    mix = meta["report"]["mixture"]
    assert [s["name"] for s in mix["sources"]] == ["web", "code", "books"]
    n_docs = {"web": 300, "code": 60, "books": 8}
    first = {"web": 0, "code": 300, "books": 360}
    weights = {"web": 0.5, "code": 2.0, "books": 1.5}
    for cfg in ("long", "short"):
        seg = _segments(out, cfg)
        if cfg == "long":  # every copy of every document, once, labelled with its source
            for k, name in enumerate(n_docs):
                mine = seg["source_ids"] == k
                docs = seg["doc_ids"][mine]
                assert docs.min() >= first[name] and docs.max() < first[name] + n_docs[name]
                pairs = set(zip(docs.tolist(), seg["doc_repeats"][mine].tolist(), strict=False))
                per_doc = Counter(d for d, _ in pairs)  # a split copy has several pieces
                assert all(
                    {r for d2, r in pairs if d2 == d} == set(range(c)) for d, c in per_doc.items()
                )
                whole = math.floor(weights[name])
                assert set(per_doc.values()) <= {whole, whole + 1}
                expected = weights[name] * n_docs[name]
                assert abs(sum(per_doc.values()) - expected) <= 3
    # Per-source EOS: code documents end with <|bos|>, the others with <|endoftext|>.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    seg = _segments(out, "long")
    ends = []
    lens = seg["seq_lengths"]
    flat = [t for row in seg["input_ids"] for t in row]
    pos = np.cumsum(lens) - 1
    ends = np.asarray(flat)[pos]
    last = lens < 512  # a document's last piece (a split one's others are exactly 512)
    code, web = last & (seg["source_ids"] == 1), last & (seg["source_ids"] == 0)
    assert set(ends[code].tolist()) == {tok.token_to_id("<|bos|>")}
    assert set(ends[web].tolist()) == {tok.token_to_id("<|endoftext|>")}
    # Books are truncated to long_len by their own policy.
    assert lens[seg["source_ids"] == 2].max() <= 512
    assert "## Mixture" in (out / "README.md").read_text()
    assert invoke("verify", out)[0] == 0


def test_verify_catches_a_wrong_source_label(
    tmp_path: Path, toy_tokenizer_path: Path, mixture: tuple[Path, dict[str, list[str]]]
) -> None:
    import pyarrow as pa

    config, _ = mixture
    out = tmp_path / "out"
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", out, "--config", config, "-q")
    path = sorted((out / "data" / "short").glob("*.parquet"))[0]
    table = pq.read_table(path)
    labels = table.column("source_ids").to_pylist()
    labels[0][0] = (labels[0][0] + 1) % 3
    table = table.set_column(
        table.schema.get_field_index("source_ids"),
        "source_ids",
        pa.array(labels, pa.list_(pa.int16())),
    )
    pq.write_table(table, path)
    meta = json.loads((out / "packcli.json").read_text())
    from packcli.tokenize.shards import sha256_file

    for entry in meta["files"]["short"]:
        if entry["file"] == path.name:
            entry["sha256"] = sha256_file(path)
    (out / "packcli.json").write_text(json.dumps(meta))
    code, text = invoke("verify", out)
    assert code != 0 and "labelled source" in text


def test_no_sources_and_inputs_together(tmp_path: Path, toy_tokenizer_path: Path) -> None:
    corpus = tmp_path / "a.jsonl"
    _write(corpus, "text", ["a b c"])
    code, text = invoke(
        "pack", corpus, "-t", toy_tokenizer_path, "-o", tmp_path / "o", "--source", f"w:1={corpus}"
    )
    assert code != 0 and "not both" in text


def _documents(out: Path, config: str) -> dict[tuple[int, int], list[int]]:
    """Each copy's real tokens (padding cut off), its pieces joined in piece order, keyed by
    (doc id, repeat): what a mixture pack holds whatever its padding."""
    table = pq.read_table(sorted((out / "data" / config).glob("*.parquet")))
    cols = table.to_pydict()
    pieces: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for r, ids in enumerate(cols["input_ids"]):
        at = 0
        pads = cols["seq_pad"][r] if "seq_pad" in cols else [0] * len(cols["seq_lengths"][r])
        for k, n in enumerate(cols["seq_lengths"][r]):
            key = (cols["doc_ids"][r][k], cols["doc_repeats"][r][k])
            real = ids[at : at + n - pads[k]]
            pieces.setdefault(key, []).append((cols["seq_pieces"][r][k], real))
            at += n
        assert at == len(ids)
    return {k: [t for _, p in sorted(v) for t in p] for k, v in pieces.items()}


def test_a_mixture_padded_for_context_parallelism_keeps_every_copy_and_its_source(
    tmp_path: Path, toy_tokenizer_path: Path, mixture: tuple[Path, dict[str, list[str]]]
) -> None:
    """``--cp-size 2`` on a mixture: every segment padded to a multiple of 4 (EOS, label
    -100, the fewest), the same copies with the same real tokens as the unpadded pack, each
    segment still labelled with its source; verify holds the padding to the policy."""
    config, _ = mixture
    plain, padded = tmp_path / "plain", tmp_path / "padded"
    invoke_ok("pack", "-t", toy_tokenizer_path, "-o", plain, "--config", config, "-q")
    invoke_ok(
        "pack", "-t", toy_tokenizer_path, "-o", padded, "--config", config, "--cp-size", "2",
        "-q",
    )  # fmt: skip
    for name in ("long", "short"):
        assert _documents(padded, name) == _documents(plain, name)
        table = pq.read_table(sorted((padded / "data" / name).glob("*.parquet")))
        cols = table.to_pydict()
        assert {"labels", "seq_pad", "source_ids", "doc_repeats"} <= set(cols)
        seg = _segments(plain, name)
        sources = dict(zip(seg["doc_ids"], seg["source_ids"], strict=True))
        for r, ids in enumerate(cols["input_ids"]):
            at = 0
            for k, n in enumerate(cols["seq_lengths"][r]):
                pad = cols["seq_pad"][r][k]
                assert n % 4 == 0 and 0 <= pad < 4
                assert cols["labels"][r][at + n - pad : at + n] == [-100] * pad
                assert len(set(ids[at + n - pad : at + n])) <= 1
                assert cols["source_ids"][r][k] == sources[cols["doc_ids"][r][k]]
                at += n
    summary = json.loads(invoke_ok("verify", padded, "--json"))
    assert "report.cp_padding.long.pad_tokens" in summary["figures_checked"]
    # A padding token given a label fails verify: the policy is checked on mixture rows too.
    path = sorted((padded / "data" / "long").glob("*.parquet"))[0]
    table = pq.read_table(path)
    data = table.to_pydict()
    r, k = next((r, k) for r, pads in enumerate(data["seq_pad"]) for k, p in enumerate(pads) if p)
    t = sum(data["seq_lengths"][r][: k + 1]) - 1
    data["labels"][r][t] = data["input_ids"][r][t]
    pq.write_table(pa.Table.from_pydict(data, schema=table.schema), path)
    meta = json.loads((padded / "packcli.json").read_text())
    from packcli.tokenize.shards import sha256_file

    entry = next(f for f in meta["files"]["long"] if f["file"] == path.name)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (padded / "packcli.json").write_text(json.dumps(meta))
    code, text = invoke("verify", padded)
    assert code != 0 and "a padding token has a label" in text
