"""Verify's checks of the rows of one Parquet batch, and each unit's summary (document,
length, hash of its tokens, row and place in the row) that the checks across rows and files
compare (``verify_part``).

What a row must be: ``num_tokens == len(input_ids) == len(segment_ids) == sum(seq_lengths)``,
``1 <= num_tokens <= capacity``, ``segment_ids`` running 1..k contiguously with run lengths
``seq_lengths``, ``len(doc_ids) == len(seq_lengths)``, token ids inside the vocabulary; chat
``labels`` one per token, -100 at every segment start, else the token; preference
``seq_roles`` pairing every prompt+chosen (1) with its prompt+rejected (2) right after it;
``seq_pieces`` (>= 0) and ``seq_last`` (0 or 1) one entry per segment, each unit summarised
with its piece tag ``2 * seq_pieces + seq_last`` (the conservation check in ``verify_part``
then proves every document's pieces are 0..k-1, once each, in token order, the last marked);
with a cost model, ``cost`` equal to the model's cost of the row's ``seq_lengths``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from packcli.arrow_np import to_numpy
from packcli.errors import VerifyError
from packcli.names import IGNORE_INDEX
from packcli.pack.padding import pad_mask
from packcli.pack.schedule import CostModel
from packcli.publish.expected import segment_hashes


@dataclass
class Segments:
    doc: np.ndarray
    length: np.ndarray
    hash: np.ndarray
    row: np.ndarray
    index: np.ndarray  # 0-based position of the segment within its row
    piece: np.ndarray  # piece tag: 2 * seq_pieces + seq_last (``piece_tags``)


def concat(parts: list[Segments]) -> Segments:
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return Segments(e, e, e.astype(np.uint64), e, e, e)
    return Segments(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in Segments.__annotations__)
    )


def fail(where: str, msg: str) -> None:
    raise VerifyError(f"{where}: {msg}")


def piece_tags(index: npt.ArrayLike, last: npt.ArrayLike) -> np.ndarray:
    """One int64 per piece for the multiset comparisons: its index within its document and
    whether it is the document's last (``seq_pieces``, ``seq_last``)."""
    return 2 * np.asarray(index, dtype=np.int64) + np.asarray(last, dtype=np.int64)


@dataclass(frozen=True)
class Padding:
    """The context-parallel padding policy an output states (``config.plan.cp_size`` > 1):
    every segment's stored length is a multiple of ``multiple``, made of its real tokens
    then the fewest ``pad_id`` tokens that get there (``seq_pad`` of them, label -100)."""

    multiple: int
    pad_id: int


def check_rows(
    batch: Any,
    where: str,
    row0: int,
    capacity: int,
    vocab: int,
    padding: Padding | None = None,
    cost: CostModel | None = None,
) -> Segments:
    """The row checks of one batch; its segments as units, their padding (if any) left out
    so that conservation compares real tokens only. ``cost``: the model the ``cost`` column
    must follow (None: the rows must have no such column)."""
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
            fail(where, f"column {what} has nulls")

    def first_bad(mask: np.ndarray) -> int:
        return row0 + int(np.flatnonzero(mask)[0])

    if (bad := n_ids != num_tokens).any():
        fail(where, f"row {first_bad(bad)}: num_tokens does not equal len(input_ids)")
    if (bad := np.diff(to_numpy(seg.offsets)) != n_ids).any():
        fail(where, f"row {first_bad(bad)}: len(segment_ids) != len(input_ids)")
    if (bad := np.diff(to_numpy(docs_col.offsets)) != seq_count).any():
        fail(where, f"row {first_bad(bad)}: len(doc_ids) != len(seq_lengths)")
    if (bad := (num_tokens < 1) | (num_tokens > capacity)).any():
        r = first_bad(bad)
        fail(where, f"row {r}: {num_tokens[r - row0]} tokens, outside 1..{capacity} (capacity)")
    if (bad := seq_count < 1).any():
        fail(where, f"row {first_bad(bad)}: no segments")

    def flat(col: Any) -> np.ndarray:
        o = to_numpy(col.offsets)
        return to_numpy(col.values)[o[0] : o[-1]]

    tokens = flat(ids)
    seq_lens = flat(lens_col).astype(np.int64)
    seg_ids = flat(seg)
    doc_ids = flat(docs_col).astype(np.int64)
    row_of_seg = np.repeat(np.arange(len(seq_count)), seq_count)
    if (seq_lens < 1).any():
        fail(where, f"row {row0 + int(row_of_seg[np.argmax(seq_lens < 1)])}: empty segment")
    sums = np.bincount(row_of_seg, weights=seq_lens, minlength=len(seq_count)).astype(np.int64)
    if (bad := sums != num_tokens).any():
        fail(where, f"row {first_bad(bad)}: sum(seq_lengths) != num_tokens")
    seg_start = np.cumsum(seq_count) - seq_count
    seg_index = np.arange(seq_lens.size) - np.repeat(seg_start, seq_count)
    expected = np.repeat((seg_index + 1).astype(seg_ids.dtype), seq_lens)
    if (bad := expected != seg_ids).any():
        pos = int(np.argmax(bad))
        tok_row = np.repeat(np.arange(len(seq_count)), n_ids)[pos]
        fail(
            where,
            f"row {row0 + int(tok_row)}: segment_ids do not run 1..k contiguously with the "
            f"lengths in seq_lengths (first mismatch at token "
            f"{pos - int(np.cumsum(n_ids)[tok_row] - n_ids[tok_row])})",
        )
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        fail(where, f"token id outside the vocabulary 0..{vocab - 1}")
    pieces = _check_pieces(batch, seq_count, where, row0)
    _check_cost(batch, cost, num_tokens, seq_lens, row_of_seg, where, row0)
    if "labels" in batch.schema.names:
        _check_labels(batch.column("labels"), n_ids, tokens, seq_lens, where, row0)
    if padding is not None or "seq_pad" in batch.schema.names:
        tokens, seq_lens = _strip_padding(batch, padding, seq_count, tokens, seq_lens, where, row0)
    if "seq_roles" in batch.schema.names:
        # A pair is one document in the tokenized shards: check it, then compare it whole.
        unit = _check_pairs(batch, seq_count, tokens, seq_lens, doc_ids, where, row0)
        rejected = np.setdiff1d(np.arange(seq_lens.size), unit)
        if (bad := pieces[rejected] != pieces[rejected - 1]).any():
            r = row0 + int(row_of_seg[rejected[np.argmax(bad)]])
            fail(where, f"row {r}: a pair's two sequences have different seq_pieces / seq_last")
        pieces = pieces[unit]
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
        piece=pieces,
    )


def _check_pieces(batch: Any, seq_count: np.ndarray, where: str, row0: int) -> np.ndarray:
    """``seq_pieces`` and ``seq_last`` one entry per segment, a piece index >= 0 and a flag
    0 or 1; returns each segment's piece tag. Whether they number each document's pieces
    right needs all its pieces and its tokens: the conservation check (``verify_part``)."""
    names = batch.schema.names
    for name in ("seq_pieces", "seq_last"):
        if name not in names:
            fail(
                where,
                f"no {name} column: every packcli output since rows version 2 has one per "
                "segment; an output made before it is rewritten by running the same packcli "
                "pack again (its tokenized shards and plan are reused)",
            )
    index = _aligned(
        batch.column("seq_pieces"), "seq_pieces", seq_count, "seq_lengths", where, row0
    )
    last = _aligned(batch.column("seq_last"), "seq_last", seq_count, "seq_lengths", where, row0)
    index, last = index.astype(np.int64), last.astype(np.int64)
    row_of_seg = np.repeat(np.arange(seq_count.size), seq_count)
    if (bad := index < 0).any():
        k = int(np.argmax(bad))
        fail(where, f"row {row0 + int(row_of_seg[k])}: seq_pieces holds {int(index[k])} (< 0)")
    if (bad := (last != 0) & (last != 1)).any():
        k = int(np.argmax(bad))
        fail(where, f"row {row0 + int(row_of_seg[k])}: seq_last holds {int(last[k])} (0 or 1)")
    return piece_tags(index, last)


def _check_cost(
    batch: Any,
    model: CostModel | None,
    num_tokens: np.ndarray,
    seq_lens: np.ndarray,
    row_of_seg: np.ndarray,
    where: str,
    row0: int,
) -> None:
    """The ``cost`` column, when the output states a cost model: each row's value is the
    model's cost of its stored segments (``seq_lengths``, padding included), recomputed
    here exactly as the writer sums them (int64 tokens and squares, then the model)."""
    names = batch.schema.names
    if model is None:
        if "cost" in names:
            fail(where, "a cost column, but packcli.json's run.cost_model states no cost model")
        return
    if "cost" not in names:
        fail(where, "no cost column, but packcli.json's run.cost_model states one")
    col = batch.column("cost")
    if col.null_count:
        fail(where, "column cost has nulls")
    got = to_numpy(col).astype(np.float64)
    lens = seq_lens.astype(np.int64)
    squares = np.zeros(num_tokens.size, dtype=np.int64)
    np.add.at(squares, row_of_seg, lens * lens)
    want = model.row_cost(num_tokens, squares)
    if (bad := got != want).any():
        r = int(np.argmax(bad))
        fail(
            where,
            f"row {row0 + r}: cost {got[r]!r} differs from the cost model's {want[r]!r} for "
            "its seq_lengths",
        )


def _strip_padding(
    batch: Any,
    padding: Padding | None,
    seq_count: np.ndarray,
    tokens: np.ndarray,
    seq_lens: np.ndarray,
    where: str,
    row0: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Context-parallel padding checked against the stated policy: ``seq_pad`` one entry per
    segment, each segment's length a multiple of ``padding.multiple`` with fewer pad tokens
    than that and at least one real token, the pad tokens at its end all ``pad_id`` with
    label -100. Returns the real tokens and the segments' real lengths."""
    names = batch.schema.names
    if padding is None:
        fail(where, "a seq_pad column, but packcli.json's config.plan.cp_size is 1 (no padding)")
    assert padding is not None
    if "seq_pad" not in names:
        fail(where, f"no seq_pad column, but config.plan.cp_size pads to {padding.multiple}")
    if "labels" not in names:
        fail(where, "seq_pad without labels (padded rows mask their padding with labels)")
    col = batch.column("seq_pad")
    pad = _aligned(col, "seq_pad", seq_count, "seq_lengths", where, row0).astype(np.int64)
    row_of_seg = np.repeat(np.arange(seq_count.size), seq_count)
    m = padding.multiple
    bad = (pad < 0) | (pad >= seq_lens) | (pad >= m) | (seq_lens % m != 0)
    if bad.any():
        k = int(np.argmax(bad))
        fail(
            where,
            f"row {row0 + int(row_of_seg[k])}: a segment of {int(seq_lens[k])} tokens with "
            f"{int(pad[k])} padding is not its real tokens padded to the next multiple of {m}",
        )
    is_pad = pad_mask(seq_lens, pad)
    if pad.any():
        lo = to_numpy(batch.column("labels").offsets)
        labels = to_numpy(batch.column("labels").values)[lo[0] : lo[-1]]
        row_of_token = np.repeat(row_of_seg, seq_lens)
        if (wrong := is_pad & (tokens != padding.pad_id)).any():
            r = row0 + int(row_of_token[np.argmax(wrong)])
            fail(where, f"row {r}: a padding token is not the pad id {padding.pad_id}")
        if (wrong := is_pad & (labels != IGNORE_INDEX)).any():
            r = row0 + int(row_of_token[np.argmax(wrong)])
            fail(where, f"row {r}: a padding token has a label (loss on padding)")
    return tokens[~is_pad], seq_lens - pad


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
        fail(where, "seq_roles without labels (a preference output has both)")
    roles = _aligned(col, "seq_roles", seq_count, "seq_lengths", where, row0).astype(np.int64)
    row_of_seg = np.repeat(np.arange(seq_count.size), seq_count)
    if (bad := (roles < 0) | (roles > 2)).any():
        r = row0 + int(row_of_seg[np.argmax(bad)])
        fail(where, f"row {r}: seq_roles holds {int(roles[np.argmax(bad)])} (0, 1 or 2 only)")
    chosen = np.flatnonzero(roles == 1)
    rejected = chosen + 1
    last = np.cumsum(seq_count) - 1  # each row's last segment
    unpaired = (rejected > last[row_of_seg[chosen]]) if chosen.size else np.zeros(0, bool)
    if unpaired.any():
        r = row0 + int(row_of_seg[chosen[np.argmax(unpaired)]])
        fail(where, f"row {r}: a chosen sequence (role 1) is not followed by its rejected one")
    if (roles == 2).sum() != chosen.size or (chosen.size and (roles[rejected] != 2).any()):
        bad_at = np.flatnonzero(roles == 2)
        bad_at = bad_at[~np.isin(bad_at, rejected)]
        r = row0 + int(row_of_seg[bad_at[0] if bad_at.size else chosen[0]])
        fail(where, f"row {r}: a rejected sequence (role 2) does not follow its chosen one")
    if (bad := doc_ids[chosen] != doc_ids[rejected]).any():
        r = row0 + int(row_of_seg[chosen[np.argmax(bad)]])
        fail(where, f"row {r}: a pair's chosen and rejected sequences have different doc_ids")
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
            fail(
                where,
                f"row {r}: document {int(doc_ids[chosen[pair]])}: chosen and rejected do not "
                "start with the same prompt tokens",
            )
    return np.flatnonzero(roles != 2)


def _check_labels(
    col: Any, n_ids: np.ndarray, tokens: np.ndarray, seq_lens: np.ndarray, where: str, row0: int
) -> None:
    """Chat labels: one per token, -100 at every segment start, else equal to the token."""
    labels = _aligned(col, "labels", n_ids, "input_ids", where, row0)
    row_of_token = np.repeat(np.arange(n_ids.size), n_ids)
    starts = np.cumsum(seq_lens) - seq_lens
    if (bad := labels[starts] != IGNORE_INDEX).any():
        r = row0 + int(row_of_token[starts[np.argmax(bad)]])
        fail(where, f"row {r}: a segment's first token has a label (loss across a boundary)")
    trained = labels != IGNORE_INDEX
    if (bad := trained & (labels != tokens)).any():
        r = row0 + int(row_of_token[np.argmax(bad)])
        fail(where, f"row {r}: a label differs from its token (labels are unshifted)")


def _aligned(
    col: Any, name: str, counts: np.ndarray, along: str, where: str, row0: int
) -> np.ndarray:
    """The values of list column ``name``, flat, once it has no nulls and each row holds as
    many entries as ``along`` (``counts`` per row): one entry per token or per segment."""
    if col.null_count or col.values.null_count:
        fail(where, f"column {name} has nulls")
    if (bad := np.diff(to_numpy(col.offsets)) != counts).any():
        fail(where, f"row {row0 + int(np.argmax(bad))}: len({name}) != len({along})")
    o = to_numpy(col.offsets)
    return to_numpy(col.values)[o[0] : o[-1]]
