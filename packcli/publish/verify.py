"""Check every packing invariant of an output folder; the same checker backs the tests.

What is proved, streaming over the Parquet files (memory ~24 bytes per segment):

* per row: ``num_tokens == len(input_ids) == len(segment_ids) == sum(seq_lengths)``,
  ``1 <= num_tokens <= capacity``, ``segment_ids`` run 1..k contiguously with run lengths
  ``seq_lengths``, ``len(doc_ids) == len(seq_lengths)``, token ids inside the vocabulary;
  for chat outputs, ``labels`` has one entry per token, -100 at every segment start, and
  equals ``input_ids`` wherever it is not -100; for preference outputs, ``seq_roles`` pairs
  every prompt+chosen (1) with the prompt+rejected (2) right after it in its row, with the
  same doc id and the same leading untrained (prompt) tokens, and the pair is then compared
  as one document;
* conservation: each segment is summarised as (doc id, length, 64-bit polynomial hash of its
  tokens in order). Against the tokenized shards, the multiset of segments of each config
  must equal the expected pieces of every document (whole documents; for ``split`` the
  consecutive ``long_len`` slices; for ``truncate`` the prefix) - so every token appears
  exactly once, in order, and nothing else appears;
* nesting: every short pack appears intact and contiguous inside exactly one long row, and
  every short-sized segment of the long config belongs to a short pack;
* the shards themselves: each one's bytes have the sha256 recorded as it was written (an
  edited shard is named; it is hashed once, as it is read);
* bookkeeping: every figure ``packcli.json`` states (counts, sizes, hashes, efficiencies, the
  step plan, the quarantine) is derived again from the data it describes and the first that
  differs is named by its key (``figures.py`` says what comes from where, and what no data
  determines).

The expected pieces are derived here independently of the planner, so a planner bug cannot
hide itself. The first failure raises ``VerifyError`` with a precise message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from packcli.arrow_np import to_numpy
from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, IGNORE_INDEX
from packcli.publish.expected import expected_pieces, segment_hashes
from packcli.publish.figures import ConfigScan, check_figures, derive
from packcli.publish.marker import peek_marker, read_json_object
from packcli.publish.marker import read_marker as read_marker  # re-export: its old home
from packcli.tokenize.shards import ShardError, TokenShards, sha256_file


@dataclass
class Segments:
    doc: np.ndarray
    length: np.ndarray
    hash: np.ndarray
    row: np.ndarray
    index: np.ndarray  # 0-based position of the segment within its row


def _concat(parts: list[Segments]) -> Segments:
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return Segments(e, e, e.astype(np.uint64), e, e)
    return Segments(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in Segments.__annotations__)
    )


def _fail(where: str, msg: str) -> None:
    raise VerifyError(f"{where}: {msg}")


def _check_rows(batch: Any, where: str, row0: int, capacity: int, vocab: int) -> Segments:
    ids = batch.column("input_ids")
    seg = batch.column("segment_ids")
    lens_col = batch.column("seq_lengths")
    docs_col = batch.column("doc_ids")
    num_tokens = to_numpy(batch.column("num_tokens")).astype(np.int64)
    n_ids = np.diff(to_numpy(ids.offsets))
    seq_count = np.diff(to_numpy(lens_col.offsets))
    for what, arr in (
        ("input_ids", ids),
        ("segment_ids", seg),
        ("seq_lengths", lens_col),
        ("doc_ids", docs_col),
    ):
        if arr.null_count or arr.values.null_count:
            _fail(where, f"column {what} has nulls")

    def first_bad(mask: np.ndarray) -> int:
        return row0 + int(np.flatnonzero(mask)[0])

    if (bad := n_ids != num_tokens).any():
        _fail(where, f"row {first_bad(bad)}: num_tokens does not equal len(input_ids)")
    if (bad := np.diff(to_numpy(seg.offsets)) != n_ids).any():
        _fail(where, f"row {first_bad(bad)}: len(segment_ids) != len(input_ids)")
    if (bad := np.diff(to_numpy(docs_col.offsets)) != seq_count).any():
        _fail(where, f"row {first_bad(bad)}: len(doc_ids) != len(seq_lengths)")
    if (bad := (num_tokens < 1) | (num_tokens > capacity)).any():
        r = first_bad(bad)
        _fail(where, f"row {r}: {num_tokens[r - row0]} tokens, outside 1..{capacity} (capacity)")
    if (bad := seq_count < 1).any():
        _fail(where, f"row {first_bad(bad)}: no segments")

    def flat(col: Any) -> np.ndarray:
        o = to_numpy(col.offsets)
        return to_numpy(col.values)[o[0] : o[-1]]

    tokens = flat(ids)
    seq_lens = flat(lens_col).astype(np.int64)
    seg_ids = flat(seg)
    doc_ids = flat(docs_col).astype(np.int64)
    row_of_seg = np.repeat(np.arange(len(seq_count)), seq_count)
    if (seq_lens < 1).any():
        _fail(where, f"row {row0 + int(row_of_seg[np.argmax(seq_lens < 1)])}: empty segment")
    sums = np.bincount(row_of_seg, weights=seq_lens, minlength=len(seq_count)).astype(np.int64)
    if (bad := sums != num_tokens).any():
        _fail(where, f"row {first_bad(bad)}: sum(seq_lengths) != num_tokens")
    seg_start = np.cumsum(seq_count) - seq_count
    seg_index = np.arange(seq_lens.size) - np.repeat(seg_start, seq_count)
    expected = np.repeat((seg_index + 1).astype(seg_ids.dtype), seq_lens)
    if (bad := expected != seg_ids).any():
        pos = int(np.argmax(bad))
        tok_row = np.repeat(np.arange(len(seq_count)), n_ids)[pos]
        _fail(
            where,
            f"row {row0 + int(tok_row)}: segment_ids do not run 1..k contiguously with the "
            f"lengths in seq_lengths (first mismatch at token "
            f"{pos - int(np.cumsum(n_ids)[tok_row] - n_ids[tok_row])})",
        )
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        _fail(where, f"token id outside the vocabulary 0..{vocab - 1}")
    if "labels" in batch.schema.names:
        _check_labels(batch.column("labels"), n_ids, tokens, seq_lens, where, row0)
    if "seq_roles" in batch.schema.names:
        # A pair is one document in the tokenized shards: check it, then compare it whole.
        unit = _check_pairs(batch, seq_count, tokens, seq_lens, doc_ids, where, row0)
        seq_lens = np.add.reduceat(seq_lens, unit) if unit.size else seq_lens[:0]
        doc_ids, row_of_seg = doc_ids[unit], row_of_seg[unit]
        seg_start = np.searchsorted(unit, seg_start)  # each row's first unit
        seg_index = np.arange(unit.size) - seg_start[row_of_seg]
    return Segments(
        doc=doc_ids,
        length=seq_lens,
        hash=segment_hashes(tokens, seq_lens),
        row=row0 + row_of_seg.astype(np.int64),
        index=seg_index.astype(np.int64),
    )


def _check_pairs(
    batch: Any,
    seq_count: np.ndarray,
    tokens: np.ndarray,
    seq_lens: np.ndarray,
    doc_ids: np.ndarray,
    where: str,
    row0: int,
) -> np.ndarray:
    """Preference outputs: ``seq_roles`` has one entry per segment, 0 (a document), 1 (a
    pair's prompt+chosen) or 2 (its prompt+rejected); every 1 is followed in its row by a 2
    of the same doc id and every 2 follows a 1; both sequences of a pair start with the same
    prompt (their leading untrained tokens agree as far as the shorter run goes). Returns
    the index of each unit's first segment (a document, or a pair's chosen)."""
    col = batch.column("seq_roles")
    if "labels" not in batch.schema.names:
        _fail(where, "seq_roles without labels (a preference output has both)")
    if col.null_count or col.values.null_count:
        _fail(where, "column seq_roles has nulls")
    if (bad := np.diff(to_numpy(col.offsets)) != seq_count).any():
        _fail(where, f"row {row0 + int(np.argmax(bad))}: len(seq_roles) != len(seq_lengths)")
    o = to_numpy(col.offsets)
    roles = to_numpy(col.values)[o[0] : o[-1]].astype(np.int64)
    row_of_seg = np.repeat(np.arange(seq_count.size), seq_count)
    if (bad := (roles < 0) | (roles > 2)).any():
        r = row0 + int(row_of_seg[np.argmax(bad)])
        _fail(where, f"row {r}: seq_roles holds {int(roles[np.argmax(bad)])} (0, 1 or 2 only)")
    chosen = np.flatnonzero(roles == 1)
    rejected = chosen + 1
    last = np.cumsum(seq_count) - 1  # each row's last segment
    unpaired = (rejected > last[row_of_seg[chosen]]) if chosen.size else np.zeros(0, bool)
    if unpaired.any():
        r = row0 + int(row_of_seg[chosen[np.argmax(unpaired)]])
        _fail(where, f"row {r}: a chosen sequence (role 1) is not followed by its rejected one")
    if (roles == 2).sum() != chosen.size or (chosen.size and (roles[rejected] != 2).any()):
        bad_at = np.flatnonzero(roles == 2)
        bad_at = bad_at[~np.isin(bad_at, rejected)]
        r = row0 + int(row_of_seg[bad_at[0] if bad_at.size else chosen[0]])
        _fail(where, f"row {r}: a rejected sequence (role 2) does not follow its chosen one")
    if (bad := doc_ids[chosen] != doc_ids[rejected]).any():
        r = row0 + int(row_of_seg[chosen[np.argmax(bad)]])
        _fail(where, f"row {r}: a pair's chosen and rejected sequences have different doc_ids")
    labels_col = batch.column("labels")
    lo = to_numpy(labels_col.offsets)
    labels = to_numpy(labels_col.values)[lo[0] : lo[-1]]
    starts = np.cumsum(seq_lens) - seq_lens
    trained = np.flatnonzero(labels != IGNORE_INDEX)
    # Per segment: its leading untrained tokens (the prompt, template tokens, a BOS).
    first = np.searchsorted(trained, starts)
    first_at = np.where(first < trained.size, trained[np.minimum(first, trained.size - 1)], -1)
    lead = np.where((first_at >= 0) & (first_at < starts + seq_lens), first_at - starts, seq_lens)
    shared = np.minimum(lead[chosen], lead[rejected])
    total = int(shared.sum())
    if total:
        offs = np.arange(total) - np.repeat(np.cumsum(shared) - shared, shared)
        a = np.repeat(starts[chosen], shared) + offs
        b = np.repeat(starts[rejected], shared) + offs
        if (bad := tokens[a] != tokens[b]).any():
            pair = int(np.searchsorted(np.cumsum(shared), int(np.argmax(bad)), side="right"))
            r = row0 + int(row_of_seg[chosen[pair]])
            _fail(
                where,
                f"row {r}: document {int(doc_ids[chosen[pair]])}: chosen and rejected do not "
                "start with the same prompt tokens",
            )
    return np.flatnonzero(roles != 2)


def _check_labels(
    col: Any, n_ids: np.ndarray, tokens: np.ndarray, seq_lens: np.ndarray, where: str, row0: int
) -> None:
    """Chat labels: one per token, -100 at every segment start, else equal to the token."""
    if col.null_count or col.values.null_count:
        _fail(where, "column labels has nulls")
    if (bad := np.diff(to_numpy(col.offsets)) != n_ids).any():
        _fail(where, f"row {row0 + int(np.argmax(bad))}: len(labels) != len(input_ids)")
    o = to_numpy(col.offsets)
    labels = to_numpy(col.values)[o[0] : o[-1]]
    row_of_token = np.repeat(np.arange(n_ids.size), n_ids)
    starts = np.cumsum(seq_lens) - seq_lens
    if (bad := labels[starts] != IGNORE_INDEX).any():
        r = row0 + int(row_of_token[starts[np.argmax(bad)]])
        _fail(where, f"row {r}: a segment's first token has a label (loss across a boundary)")
    trained = labels != IGNORE_INDEX
    if (bad := trained & (labels != tokens)).any():
        r = row0 + int(row_of_token[np.argmax(bad)])
        _fail(where, f"row {r}: a label differs from its token (labels are unshifted)")


def _scan_config(
    out: Path,
    name: str,
    capacity: int,
    vocab: int,
    files: list[dict[str, Any]],
    on_rows: Callable[[int], None] | None,
) -> tuple[Segments, ConfigScan]:
    folder = out / "data" / name
    found = sorted(p.name for p in folder.glob("*.parquet")) if folder.is_dir() else []
    listed = [f["file"] for f in files]
    if found != sorted(listed):
        stray = [i for i, f in enumerate(listed) if f not in found]
        named = f"files.{name}[{stray[0]}].file" if stray else f"files.{name}"
        _fail(f"data/{name}", f"files {found} do not match packcli.json's {named} {sorted(listed)}")
    parts: list[Segments] = []
    scan = ConfigScan()
    rows_per_batch = max(1, (1 << 21) // capacity)
    for i, entry in enumerate(files):
        path = folder / entry["file"]
        where = f"data/{name}/{entry['file']}"
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            _fail(
                where,
                f"content hash differs from packcli.json's files.{name}[{i}].sha256 (file "
                "changed or corrupt)",
            )
        file_rows = file_tokens = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=rows_per_batch):
            parts.append(_check_rows(batch, where, scan.rows, capacity, vocab))
            offsets = to_numpy(batch.column("seq_lengths").offsets)
            scan.segments += int(offsets[-1] - offsets[0])
            file_rows += batch.num_rows
            scan.rows += batch.num_rows
            file_tokens += int(parts[-1].length.sum())
            if on_rows is not None:
                on_rows(batch.num_rows)
        if file_rows != entry["rows"]:
            _fail(
                where,
                f"{file_rows} rows, packcli.json's files.{name}[{i}].rows says {entry['rows']}",
            )
        scan.files.append(
            {
                "file": entry["file"],
                "rows": file_rows,
                "tokens": file_tokens,
                "bytes": path.stat().st_size,
                "sha256": digest,
            }
        )
    segments = _concat(parts)
    scan.doc, scan.length, scan.row = segments.doc, segments.length, segments.row
    return segments, scan


def _expected_pieces(
    shards: TokenShards, long_len: int, policy: str, all_lengths: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, length, hash) of every piece the policy should put in the long config; every
    document's length is appended to ``all_lengths`` (the report's figures are checked
    against them)."""
    docs, lens, hashes = [], [], []
    for shard in shards.iter_shards(check=True):  # each shard's sha256 first
        doc_lens = np.diff(shard.offsets)
        all_lengths.append(doc_lens)
        first = shard.first_doc_id
        ids = np.arange(first, first + doc_lens.size, dtype=np.int64)
        base = int(shard.offsets[0])
        values = shard.values[base : int(shard.offsets[-1])]
        whole_hash = segment_hashes(values, doc_lens)
        fits = (doc_lens <= long_len) & (doc_lens > 0)
        docs.append(ids[fits])
        lens.append(doc_lens[fits])
        hashes.append(whole_hash[fits])
        for k in np.flatnonzero(doc_lens > long_len):
            start = int(shard.offsets[k])
            document = shard.values[start : start + int(doc_lens[k])]
            for piece in expected_pieces(document, long_len, policy):
                docs.append(np.array([ids[k]]))
                lens.append(np.array([piece.size]))
                hashes.append(segment_hashes(piece, np.array([piece.size])))

    def cat(xs: list[np.ndarray], dt: type) -> np.ndarray:
        return np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)

    return cat(docs, np.int64), cat(lens, np.int64), cat(hashes, np.uint64)


def _compare(name: str, got: Segments, exp: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    e_doc, e_len, e_hash = exp
    g_order = np.lexsort((got.hash, got.length, got.doc))
    e_order = np.lexsort((e_hash, e_len, e_doc))
    g = np.stack([got.doc[g_order], got.length[g_order], got.hash[g_order].view(np.int64)])
    e = np.stack([e_doc[e_order], e_len[e_order], e_hash[e_order].view(np.int64)])
    if g.shape == e.shape and np.array_equal(g, e):
        return
    n = min(g.shape[1], e.shape[1])
    diff = np.flatnonzero((g[:, :n] != e[:, :n]).any(axis=0))
    i = int(diff[0]) if diff.size else n
    doc = int(min(g[0, i] if i < g.shape[1] else 2**62, e[0, i] if i < e.shape[1] else 2**62))
    _fail(
        f"config {name}",
        f"tokens of document {doc} differ from the tokenized shards (missing, duplicated, "
        f"altered or out of order); {g.shape[1]} segments found, {e.shape[1]} expected",
    )


def _check_nesting(short: Segments, long: Segments, short_len: int) -> None:
    """Each short pack sits intact and contiguous in exactly one long row."""
    small = long.length <= short_len
    lk = long.doc[small] * (short_len + 1) + long.length[small]
    order = np.argsort(lk, kind="stable")
    lk_sorted = lk[order]
    if lk_sorted.size != short.doc.size:
        _fail(
            "nesting",
            f"long config has {lk_sorted.size} short-sized segments, short config "
            f"has {short.doc.size}",
        )
    if lk_sorted.size and (np.diff(lk_sorted) == 0).any():
        _fail("nesting", "a short-sized segment appears twice in the long config")
    sk = short.doc * (short_len + 1) + short.length
    pos = np.searchsorted(lk_sorted, sk)
    pos = np.minimum(pos, max(lk_sorted.size - 1, 0))
    if sk.size and not np.array_equal(lk_sorted[pos], sk):
        bad = int(np.flatnonzero(lk_sorted[pos] != sk)[0])
        _fail(
            "nesting",
            f"short row {short.row[bad]}: document {short.doc[bad]} is missing "
            "from the long config",
        )
    match = np.flatnonzero(small)[order[pos]]
    l_row, l_idx, l_hash = long.row[match], long.index[match], long.hash[match]
    if (bad := l_hash != short.hash).any():
        i = int(np.argmax(bad))
        _fail(
            "nesting",
            f"short row {short.row[i]}: document {short.doc[i]} has other tokens "
            "in the long config",
        )
    same_row = short.row[1:] == short.row[:-1]
    broken = same_row & ((l_row[1:] != l_row[:-1]) | (l_idx[1:] != l_idx[:-1] + 1))
    if broken.any():
        i = int(np.argmax(broken)) + 1
        _fail("nesting", f"short row {short.row[i]} is not intact and contiguous in one long row")


def verify_remote(url: str, *, use_shards: bool = True) -> dict[str, Any]:
    """Verify an output on object storage: its ``packcli.json`` and data files are
    downloaded to a temp folder (the disk needs room for the dataset) and checked there
    (``verify_copy``); messages name the URL."""
    import tempfile

    from packcli.fs import download_output

    with tempfile.TemporaryDirectory(prefix="packcli-verify-") as tmp:
        local = Path(tmp) / "out"
        download_output(url, local, card=False)  # its errors name the URL
        return verify_copy(local, url, Path(tmp), use_shards=use_shards)


def verify_copy(local: Path, url: str, scratch: Path, *, use_shards: bool = True) -> dict[str, Any]:
    """Verify ``local``, a downloaded copy of the output at ``url`` (``scratch``: a temp
    folder for the shards' mirror). The tokenized shards are those of the work folder the
    output names when it is on the store (fetched), else this machine's staging folder of
    ``url`` (``fs.staging_root``) when it holds the same run's. Every message, and every
    path in the summary, names the URL and the work folder's URL, never the temp copies."""
    from packcli.fs import is_url, staging_root

    work = staging_root(url) / ".packcli"
    store = None
    names: dict[Path, str] = {local: url}
    recorded = peek_marker(local).get("run", {}).get("work_dir")
    if use_shards and is_url(recorded):  # the work folder is on the store (workstore.py)
        from packcli.stages.workstore import WorkStore

        store = WorkStore(recorded, scratch / "work", url, scratch / "mirror-out")
        store.pull_records("tokens")
        work = store.local
        names[work] = recorded
    try:
        summary = verify_output(local, use_shards=use_shards, work=work, store=store)
    except VerifyError as exc:
        raise VerifyError(_named(str(exc), names)) from None
    return json.loads(_named(json.dumps(summary), names))


def _named(text: str, names: dict[Path, str]) -> str:
    """``text`` with each local copy's path replaced by the URL it is a copy of."""
    from packcli.fs import reword

    for local, url in names.items():
        text = reword(text, local, url)
    return text


def verify_folder(out: Path, url: str | None = None, *, use_shards: bool = True) -> dict[str, Any]:
    """The checks ``verify`` runs, for every caller that must refuse what verify refuses
    (``push``, ``push --dry-run``): ``out`` itself, or with ``url`` a downloaded copy of the
    output there (shards included when present, as verify finds them)."""
    if url is None:
        return verify_output(out, use_shards=use_shards)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packcli-verify-") as tmp:
        return verify_copy(out, url, Path(tmp), use_shards=use_shards)


def verify_output(
    out: Path,
    *,
    use_shards: bool = True,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
    work: Path | None = None,
    store: Any = None,
) -> dict[str, Any]:
    """Verify ``out``; returns a summary dict or raises ``VerifyError``. ``work``: a work
    folder to look for the tokenized shards in, used only when they are this run's;
    ``store``: the work folder on object storage that ``work`` mirrors (shards fetched)."""
    meta = read_marker(out)
    plan_cfg = meta["config"]["plan"]
    short_len, long_len = int(plan_cfg["short_len"]), int(plan_cfg["long_len"])
    vocab = int(meta["run"]["tokenizer"]["vocab_size"])
    caps = {"short": short_len, "long": long_len}
    segments: dict[str, Segments] = {}
    scans: dict[str, ConfigScan] = {}
    summary: dict[str, Any] = {"configs": {}}
    for name in CONFIG_NAMES:
        segs, scan = _scan_config(
            out,
            name,
            caps[name],
            vocab,
            meta["files"][name],
            None
            if progress is None
            else progress(name, sum(f["rows"] for f in meta["files"][name])),
        )
        segments[name], scans[name] = segs, scan
        tokens = int(segs.length.sum())
        summary["configs"][name] = {
            "rows": scan.rows,
            "tokens": tokens,
            "segments": int(segs.doc.size),
        }
    _check_nesting(segments["short"], segments["long"], short_len)

    recorded = Path(meta["run"].get("work_dir") or ".packcli")
    tokens_dir = (recorded if recorded.is_absolute() else out / recorded) / "tokens"
    if work is not None and read_json_object(work / "tokens" / "_SUCCESS.json").get(
        "fingerprint"
    ) == meta["run"].get("tokens_fingerprint"):
        tokens_dir = work / "tokens"
    summary["checked_against_shards"] = False
    doc_lengths: np.ndarray | None = None
    shards: TokenShards | None = None
    if not use_shards:
        summary["shards"] = "not read (--no-shards)"
    elif not (tokens_dir / "_SUCCESS.json").is_file():
        summary["shards"] = f"not found (no completed tokenize stage in {tokens_dir})"
    else:
        shards = TokenShards(tokens_dir, store if tokens_dir.parent == work else None)
        if shards.success.get("fingerprint") != meta["run"].get("tokens_fingerprint"):
            _fail(str(tokens_dir), "tokenized shards belong to another run")
        lengths: list[np.ndarray] = []
        try:
            exp = _expected_pieces(shards, long_len, plan_cfg["overlong"], lengths)
        except ShardError as exc:
            raise VerifyError(str(exc)) from None
        doc_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        _compare("long", segments["long"], exp)
        small = exp[1] <= short_len
        _compare("short", segments["short"], (exp[0][small], exp[1][small], exp[2][small]))
        summary["checked_against_shards"] = True
        summary["shards"] = f"checked: {len(shards)} shard(s) in {tokens_dir}"
    # Every figure packcli.json states, against the data it describes.
    derived = derive(meta, out, scans, shards if doc_lengths is not None else None, doc_lengths)
    summary["figures_checked"] = check_figures(meta, derived)
    report = meta["report"]
    pol = report["policy"]
    kept = report["input"]["tokens"] - pol["truncated_tokens"] - pol["dropped_tokens"]
    if summary["configs"]["long"]["tokens"] != kept:
        _fail(
            "config long",
            f"holds {summary['configs']['long']['tokens']} tokens; packcli.json's "
            f"report.input.tokens minus report.policy.truncated_tokens and dropped_tokens is "
            f"{kept}",
        )
    # The shards came out of the same tokenize stage: also encode some input again.
    from packcli.publish.recheck import check_against_input

    summary["checked_against_input"] = check_against_input(meta, segments["long"])
    return summary
