"""Write stage: gather tokens by the plan and write the Hub-layout Parquet shards.

The plan says which slice of which document goes where; tokens come from the memory-mapped
tokenized shards. Gathering is one slice copy per segment (no per-token Python, no index
arrays of 8 bytes per token), and the per-token ``segment_ids`` column is one fill per
segment; both are ``packcli.jit`` kernels (compiled when there are many segments) and run on
threads over token-balanced ranges of segments. Rows are written in row groups of about
``row_group_tokens`` tokens (so readers can stream a 128k-token config without loading a
whole file) to ``data/<config>/train-NNNNN-of-NNNNN.parquet``, each under a temp name and
renamed when complete. Dictionary encoding is off: token ids are high-entropy and
dictionaries only cost time and bytes (measured: 1.14 vs 0.90 bytes/token with zstd).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from packcli.arrow_np import list_array, to_arrow, to_numpy
from packcli.atomic import atomic_path
from packcli.config import AUTO_FILES, PlanConfig, WriteConfig
from packcli.jit import kernel, pick
from packcli.names import CONFIG_NAMES, IGNORE_INDEX
from packcli.pack.mixture import key_doc, key_repeat, source_of
from packcli.pack.padding import pad_mask, padded_sizes
from packcli.pack.plan import Plan, RowLayout, piece_numbers, plan_two_tier
from packcli.pack.schedule import CostModel, segment_row_costs
from packcli.tokenize.shards import LazyShards, ShardTokens, TokenShards, distinct_shards

# The rows' layout, as a version: bumped when the same plan writes other bytes (2: the
# per-segment ``seq_pieces`` and ``seq_last`` columns), so a resumed run rewrites older files
# (part of the write fingerprint, ``packcli.stages.write``).
ROWS_VERSION = 2

# Per segment, which piece of its document it is and whether the document ends with it.
# ``seq_pieces``: 0-based index of the piece within its document (a document longer than
# ``long_len`` is split into consecutive pieces, ``--overlong split``; a whole document is
# piece 0). ``seq_last``: 1 when the segment is its document's last piece in the output (the
# document ends here, or was truncated to it), 0 when the document continues in a later
# piece, in another row. Why a flag column and not the piece count or an encoded value: a
# reader placing EOD (Megatron-style ``end_document``) or reassembling documents decides per
# segment with one lookup, without the other rows (which are shuffled) or a document table,
# and ``seq_pieces`` stays a plain index. int8 and not bool: Arrow bools are bit-packed and
# convert through pyarrow's slow path, and int8 matches ``seq_roles``. Chat and preference
# documents are never split (the config refuses ``split`` for them), so their segments are
# all piece 0, last 1: written anyway, so every output has the same segment columns.
PIECE_FIELDS = (
    pa.field("seq_pieces", pa.list_(pa.int32())),
    pa.field("seq_last", pa.list_(pa.int8())),
)
ROW_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("segment_ids", pa.list_(pa.int32())),
        pa.field("seq_lengths", pa.list_(pa.int32())),
        pa.field("doc_ids", pa.list_(pa.int64())),
        *PIECE_FIELDS,
        pa.field("num_tokens", pa.int32()),
    ]
)
# Chat outputs add ``labels``: the token id where loss is taken, -100 elsewhere, unshifted;
# -100 at the first token of every segment, so no loss crosses a document boundary.
CHAT_ROW_SCHEMA = ROW_SCHEMA.append(pa.field("labels", pa.list_(pa.int32())))
# Preference outputs add ``seq_roles``, per segment: 0 an ordinary document, 1 a pair's
# prompt+chosen, 2 its prompt+rejected (always right after its 1, same row, same doc id).
# Other outputs do not get the column, so their bytes are what they were.
PREFERENCE_ROW_SCHEMA = CHAT_ROW_SCHEMA.append(pa.field("seq_roles", pa.list_(pa.int8())))
ROLE_DOCUMENT, ROLE_CHOSEN, ROLE_REJECTED = 0, 1, 2
# A mixture's outputs add, per segment, the index of its source (``sources`` in the card and
# ``packcli.json``) and its repeat (0 for a document's first copy; ``packcli.pack.mixture``).
MIX_FIELDS = (
    pa.field("source_ids", pa.list_(pa.int16())),
    pa.field("doc_repeats", pa.list_(pa.int32())),
)
MIX_ROW_SCHEMA = ROW_SCHEMA.append(MIX_FIELDS[0]).append(MIX_FIELDS[1])


# Rows padded for context parallelism (``--cp-size``) add ``seq_pad``, per segment: how many
# of its ``seq_lengths`` tokens are padding, at its end (its real length is the difference).
# They always have ``labels`` (-100 on padding), so any trainer that reads labels leaves the
# padding out of the loss; text outputs get the column only when padded.
SEQ_PAD_FIELD = pa.field("seq_pad", pa.list_(pa.int32()))
# Asked for (``write.cost_model``, ``--cost-model``), rows add ``cost``: the row's training
# compute by the cost model (``packcli.pack.schedule.CostModel``: per token plus per squared
# segment length, over its ``seq_lengths`` as stored), what ``PackedDistributedSampler``
# balances. float64, not int64: the coefficients are real-valued estimates (FLOPs from an
# estimated parameter count), which an integer would only round; float64 holds a 70B model's
# 131k-token row (~6e16) to 1 part in 1e16, and it is what ``segment_row_costs`` and the sampler
# compute in. Off by default: without it the rows' bytes are what they were.
COST_FIELD = pa.field("cost", pa.float64())


def schema_for(
    *,
    labels: bool = False,
    pairs: bool = False,
    mixture: bool = False,
    padded: bool = False,
    cost: bool = False,
) -> pa.Schema:
    """The row schema of an output: the base columns, then those its format and settings
    add (the one place the card and the writer take it from)."""
    if mixture:  # never chat (the config refuses it); padded: labels before, seq_pad after
        schema = CHAT_ROW_SCHEMA if padded else ROW_SCHEMA
        schema = schema.append(MIX_FIELDS[0]).append(MIX_FIELDS[1])
        if padded:
            schema = schema.append(SEQ_PAD_FIELD)
    elif pairs:
        schema = PREFERENCE_ROW_SCHEMA
    elif padded:
        schema = CHAT_ROW_SCHEMA.append(SEQ_PAD_FIELD)
    else:
        schema = CHAT_ROW_SCHEMA if labels else ROW_SCHEMA
    return schema.append(COST_FIELD) if cost else schema


def row_schema(source: TokenSource, padded: bool = False, cost: bool = False) -> pa.Schema:
    return schema_for(
        labels=source.has_labels,
        pairs=source.has_pairs,
        mixture=source.source_first_doc is not None,
        padded=padded,
        cost=cost,
    )


@dataclass(frozen=True)
class PieceRule:
    """How the writer numbers segments as pieces of their documents (``seq_pieces``,
    ``seq_last``): the plan cut documents longer than ``long_len`` into consecutive slices of
    it, and ``truncate`` says per source (one entry when the output is no mixture) whether
    the overlong policy truncated them instead (then a document's one piece is its last)."""

    long_len: int
    truncate: tuple[bool, ...] = (False,)

    @classmethod
    def of_plan(cls, plan: Plan) -> PieceRule:
        """The rule for a plan with a long config and no truncation (tests, small callers)."""
        if plan.long is None:
            raise ValueError("a plan without a long config: give write a PieceRule")
        return cls(plan.long.capacity)


def pad_token_id(tokenizer: dict[str, object]) -> int:
    """The id context-parallel padding holds: the run's EOS, else 0. Any id would do (the
    padding is never attended to by real tokens and carries no loss); EOS is what a reader
    that ignores ``seq_pad`` would take for the end of a document."""
    eos = tokenizer.get("eos_id")
    return int(eos) if isinstance(eos, int) else 0


# Threads for the gather: the kernels release the GIL, and on the 2-core VM two threads
# copy ~2x faster than one (first-touching fresh pages is most of the cost).
_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
_PARALLEL_MIN_TOKENS = 1 << 22  # below this a thread pool costs more than it saves


@kernel(nogil=True)
def _place(
    values: np.ndarray,
    src_starts: np.ndarray | None,
    dst_starts: np.ndarray,
    lens: np.ndarray,
    out: np.ndarray,
    lo: int,
    hi: int,
) -> None:
    """Segments lo..hi-1 into ``out`` at ``dst_starts``: each the slice of ``values`` at
    ``src_starts`` (tokens, labels), or with ``src_starts`` None ``values[i]`` repeated (a
    token's 1-based segment index in its row; numba compiles each case without the test)."""
    for i in range(lo, hi):
        d = dst_starts[i]
        n = lens[i]
        if src_starts is None:
            out[d : d + n] = values[i]
        else:
            s = src_starts[i]
            out[d : d + n] = values[s : s + n]


def _run_split(kernel: Callable[..., None], lens: np.ndarray, *args: object) -> None:
    """``kernel(*args, lo, hi)`` over segments split into ``_THREADS`` runs of about equal
    tokens, on threads (the kernels release the GIL).

    The output arrays come from ``np.empty``: numpy asks for transparent huge pages on large
    allocations (numba's own allocator does not), which makes first-touching 2 GB of fresh
    output ~2.5x cheaper on the VM dev machine.
    """
    n = lens.shape[0]
    total = int(lens.sum())
    kernel = pick(kernel, n // 8)  # a slice copy per segment: ~1/8 of a best-fit item
    if _THREADS == 1 or total < _PARALLEL_MIN_TOKENS:
        kernel(*args, 0, n)
        return
    ends = np.cumsum(lens)
    cuts = np.searchsorted(ends, np.arange(1, _THREADS) * (total // _THREADS))
    bounds = [0, *cuts.tolist(), n]
    with ThreadPoolExecutor(_THREADS - 1) as pool:
        futures = [pool.submit(kernel, *args, bounds[t], bounds[t + 1]) for t in range(1, _THREADS)]
        kernel(*args, bounds[0], bounds[1])
        for f in futures:
            f.result()


class Scratch:
    """The per-token output arrays of a writing thread (tokens, segment ids, labels), reused
    from one row group to the next.

    Why: they are 12 bytes a token of fresh memory per row group, and first touching fresh
    pages (page faults, the VM's too) costs more than copying the tokens into them: writing a
    150 MB chat pack spent about as long faulting those pages in as the copies took. A buffer
    handed out again is valid until the next request of its name, so a table built from them
    must be written before the next one is built (``write_config_file`` does).
    """

    def __init__(self) -> None:
        self._held: dict[str, np.ndarray] = {}

    def empty(self, name: str, size: int) -> npt.NDArray[np.int32]:
        held = self._held.get(name)
        if held is None or held.size < size:
            # With headroom: a long config's row group is a little larger than a short
            # config's of the same row_group_tokens, and a thread writes both.
            held = np.empty(size + (size >> 3), dtype=np.int32)
            self._held[name] = held
        return held[:size]


def _empty(scratch: Scratch | None, name: str, size: int) -> npt.NDArray[np.int32]:
    return np.empty(size, dtype=np.int32) if scratch is None else scratch.empty(name, size)


def _segment_ids(
    seg_offsets: np.ndarray, lens: np.ndarray, scratch: Scratch | None = None
) -> np.ndarray:
    """``segment_ids`` column values: rows' segments are ``seg_offsets[r]:seg_offsets[r+1]``."""
    counts = np.diff(seg_offsets)
    seg_index = (np.arange(lens.size, dtype=np.int64) + 1).astype(np.int32)
    seg_index -= np.repeat(seg_offsets[:-1], counts).astype(np.int32)
    dst = np.cumsum(lens) - lens
    total = int(lens.sum())
    out = _empty(scratch, "segment_ids", total)
    _run_split(_place, lens, seg_index, None, dst, lens, out)
    return out


class TokenSource:
    """Random access to document slices across all tokenized shards."""

    def __init__(
        self,
        shards: Sequence[ShardTokens],
        *,
        first_doc: np.ndarray | None = None,
        columns: Collection[str] | None = None,
        source_first_doc: np.ndarray | None = None,
    ) -> None:
        """``first_doc`` (each shard's first document id) and ``columns`` (the shards'
        columns) when known without loading every shard (``of``); else read off ``shards``."""
        self.shards = shards
        if first_doc is None:
            first_doc = np.array([s.first_doc_id for s in shards], dtype=np.int64)
        if columns is None:
            columns = set()
            if shards and all(s.labels is not None for s in shards):
                columns.add("labels")
            if shards and all(s.chosen_len is not None for s in shards):
                columns.add("chosen_len")
        self.first_doc = first_doc
        self.has_labels = "labels" in columns
        self.has_pairs = self.has_labels and "chosen_len" in columns
        # A mixture: each source's first doc id (its documents are consecutive); the plan's
        # piece keys then carry a repeat above the doc id (packcli.pack.mixture.copy_key).
        self.source_first_doc = source_first_doc

    @classmethod
    def of(cls, shards: TokenShards) -> TokenSource:
        """All shards of a stage, each loaded when a row first needs it (from the index and
        the first shard's schema, not from every shard)."""
        mix = shards.success.sources
        return cls(
            LazyShards(shards),
            first_doc=shards.first_doc_ids,
            columns=shards.column_names(),
            source_first_doc=np.array([s.first_doc for s in mix], np.int64) if mix else None,
        )

    def doc_lengths(self, docs: np.ndarray) -> np.ndarray:
        """Per entry read (a doc id or copy key; in a tail shard, a piece's index there):
        the length of its document, of which it may be a piece."""
        if self.source_first_doc is not None:
            docs = key_doc(docs)
        out = np.zeros(docs.size, dtype=np.int64)
        shard_of = np.searchsorted(self.first_doc, docs, "right") - 1
        for s in distinct_shards(shard_of):
            shard = self.shards[int(s)]
            m = shard_of == s
            at = docs[m] - shard.first_doc_id
            if shard.doc_len is not None:
                out[m] = shard.doc_len[at]
            else:
                out[m] = shard.offsets[at + 1] - shard.offsets[at]
        return out

    def chosen_len(self, docs: np.ndarray) -> np.ndarray:
        """Per document, the length of a pair's first sequence (0: not a pair)."""
        out = np.zeros(docs.size, dtype=np.int64)
        shard_of = np.searchsorted(self.first_doc, docs, "right") - 1
        for s in distinct_shards(shard_of):
            shard = self.shards[int(s)]
            m = shard_of == s
            lens = shard.chosen_len
            assert lens is not None  # has_pairs: every shard has the column
            out[m] = lens[docs[m] - shard.first_doc_id]
        return out

    def gather(
        self,
        docs: np.ndarray,
        starts: np.ndarray,
        lens: np.ndarray,
        *,
        labels: bool = False,
        pad: np.ndarray | None = None,
        fill: int = 0,
        scratch: Scratch | None = None,
    ) -> np.ndarray:
        """Tokens (or labels) of the slices ``doc[start:start+len]``, in the given order;
        with ``pad``, each slice followed by ``pad[i]`` tokens of ``fill``. (``docs`` may be a
        mixture's copy keys: a copy's tokens are its document's.) ``scratch``: where the
        result goes (else a new array)."""
        if self.source_first_doc is not None:
            docs = key_doc(docs)
        name = "labels" if labels else "tokens"
        if pad is None:
            out = _empty(scratch, name, int(lens.sum()))
            dst = np.cumsum(lens) - lens
        else:
            sizes = lens + pad
            out = _empty(scratch, name, int(sizes.sum()))
            out.fill(fill)
            dst = np.cumsum(sizes) - sizes
        one = len(self.shards) == 1  # the common case: no masks, no copies
        shard_of = (
            np.zeros(1, np.int64) if one else np.searchsorted(self.first_doc, docs, "right") - 1
        )
        for s in distinct_shards(shard_of):
            shard = self.shards[int(s)]
            m = slice(None) if one else shard_of == s
            src = shard.offsets[docs[m] - shard.first_doc_id] + starts[m]
            values = shard.labels if labels else shard.values
            _run_split(_place, lens[m], values, src, dst[m], lens[m], out)
        return out


def rows_to_table(
    plan: Plan,
    layout: RowLayout,
    r0: int,
    r1: int,
    source: TokenSource,
    *,
    pad_id: int = 0,
    pieces: PieceRule | None = None,
    cost_model: CostModel | None = None,
    scratch: Scratch | None = None,
) -> pa.Table:
    """Rows ``r0..r1-1`` of a config as an Arrow table in the public row schema; a plan with
    context-parallel padding puts ``pad_id`` tokens after each segment's own (label -100),
    counted in the segment's ``seq_lengths`` and in ``seq_pad``. ``pieces``: how segments are
    numbered as pieces of their documents (default ``PieceRule.of_plan``); ``cost_model``:
    add each row's ``cost``; ``scratch``: the per-token columns are its buffers (the table
    is then valid until its next use)."""
    rule = pieces if pieces is not None else PieceRule.of_plan(plan)
    p0, p1 = int(layout.row_offsets[r0]), int(layout.row_offsets[r1])
    in_rows = layout.row_pieces[p0:p1]
    docs = plan.piece_doc[in_rows]
    starts = plan.piece_start[in_rows]
    lens = plan.piece_len[in_rows]
    seg_offsets = layout.row_offsets[r0 : r1 + 1] - p0
    # Where the tokens are read: by doc id and start, or (the tail) whole from a tail shard.
    if plan.piece_source is None:
        src, src_starts = docs, starts
    else:
        src, src_starts = plan.piece_source[in_rows], np.zeros_like(starts)
    truncated: np.ndarray | bool = rule.truncate[0]
    if source.source_first_doc is not None and len(rule.truncate) > 1:
        truncated = np.asarray(rule.truncate)[source_of(docs, source.source_first_doc)]
    piece, last = piece_numbers(starts, lens, source.doc_lengths(src), rule.long_len, truncated)
    roles = None
    if source.has_pairs:
        chosen = source.chosen_len(src)
        n_seg = 1 + (chosen > 0)
        docs = np.repeat(docs, n_seg)  # a pair's two sequences keep its doc id
        piece, last = np.repeat(piece, n_seg), np.repeat(last, n_seg)  # and its one piece
        src, src_starts, lens, seg_offsets, roles = pair_segments(
            src, src_starts, lens, seg_offsets, chosen
        )
    pad = None
    if plan.pad_multiple > 1:
        if roles is not None:
            raise ValueError("preference pairs are not padded for context parallelism")
        pad = padded_sizes(lens, plan.pad_multiple) - lens
    tokens = source.gather(src, src_starts, lens, pad=pad, fill=pad_id, scratch=scratch)
    sizes = lens if pad is None else lens + pad  # what each segment takes of its row

    segment_ids = _segment_ids(seg_offsets, sizes, scratch)
    row_tokens = layout.row_tokens[r0:r1]
    tok_offsets = np.zeros(r1 - r0 + 1, dtype=np.int64)
    np.cumsum(row_tokens, out=tok_offsets[1:])
    if tok_offsets[-1] >= 2**31:
        raise ValueError("a row group exceeds 2**31 tokens; lower write.row_group_tokens")
    columns = [
        list_array(tok_offsets, tokens, pa.int32()),
        list_array(tok_offsets, segment_ids, pa.int32()),
        list_array(seg_offsets, sizes, pa.int32()),
        list_array(seg_offsets, docs, pa.int64()),
        list_array(seg_offsets, piece, pa.int32()),
        list_array(seg_offsets, last, pa.int8()),
        to_arrow(row_tokens, pa.int32()),
    ]
    if source.has_labels or pad is not None:
        if source.has_labels:
            labels = source.gather(
                src, src_starts, lens, labels=True, pad=pad, fill=IGNORE_INDEX, scratch=scratch
            )
        elif pad is not None:  # text: every real token is trained, padding never
            labels = tokens.copy()
            labels[pad_mask(sizes, pad)] = IGNORE_INDEX
        labels[np.cumsum(sizes) - sizes] = IGNORE_INDEX  # no loss on a segment's first token
        columns.append(list_array(tok_offsets, labels, pa.int32()))
    if roles is not None:
        columns.append(list_array(seg_offsets, roles, pa.int8()))
    if source.source_first_doc is not None:
        keys = columns[3]  # doc_ids as planned: copy keys
        columns[3] = list_array(seg_offsets, key_doc(docs), pa.int64())
        src_ids = source_of(docs, source.source_first_doc).astype(np.int16)
        columns.append(list_array(seg_offsets, src_ids, pa.int16()))
        columns.append(list_array(seg_offsets, key_repeat(docs).astype(np.int32), pa.int32()))
        del keys
    if pad is not None:
        columns.append(list_array(seg_offsets, pad, pa.int32()))
    if cost_model is not None:
        columns.append(to_arrow(segment_row_costs(seg_offsets, sizes, cost_model), pa.float64()))
    schema = row_schema(source, pad is not None, cost_model is not None)
    return pa.Table.from_arrays(columns, schema=schema)


def pair_segments(
    docs: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    seg_offsets: np.ndarray,
    chosen_len: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Planned pieces -> output segments: a pair (``chosen_len > 0``), planned as one piece,
    becomes its two sequences, prompt+chosen then prompt+rejected, with the same doc id.

    Returns ``(docs, starts, lens, seg_offsets, roles)`` with rows' segment ranges moved to
    match. A pair is whole in the plan (it is never longer than ``long_len``: the preference
    path refuses ``split`` and fits it while tokenizing), which is checked here.
    """
    is_pair = chosen_len > 0
    if ((starts[is_pair] != 0) | (lens[is_pair] <= chosen_len[is_pair])).any():
        raise ValueError("a preference pair is not whole in the plan; run `packcli plan` again")
    n_seg = 1 + is_pair.astype(np.int64)
    ends = np.cumsum(n_seg)
    piece = np.repeat(np.arange(docs.size), n_seg)
    second = np.zeros(piece.size, dtype=bool)
    second[ends[is_pair] - 1] = True
    first = chosen_len[piece]
    paired = is_pair[piece]
    out_starts = starts[piece] + np.where(second, first, 0)
    out_lens = np.where(second, lens[piece] - first, np.where(paired, first, lens[piece]))
    roles = np.where(second, ROLE_REJECTED, np.where(paired, ROLE_CHOSEN, ROLE_DOCUMENT))
    moved = np.concatenate([[0], ends])[seg_offsets]
    return docs[piece], out_starts, out_lens, moved, roles.astype(np.int8)


def files_wanted(config: WriteConfig, tokens: int, parts: int = 1) -> int:
    """How many files one part's rows of a config (``tokens`` of them) are cut into at least,
    when the plan has ``parts`` groups (each cuts its own files: the count is spread)."""
    wanted = AUTO_FILES if config.min_files is None else config.min_files
    per_part = -(-wanted // max(1, parts))
    if config.min_files is None:  # one file per row group's tokens (rounded up) at most
        per_part = min(per_part, -(-tokens // config.row_group_tokens))
    return max(1, per_part)


def file_ranges(layout: RowLayout, shard_tokens: int, min_files: int = 1) -> list[tuple[int, int]]:
    """Split rows into consecutive files of roughly ``shard_tokens`` tokens (at least one);
    where that makes fewer than ``min_files``, into ``min(min_files, rows)`` files of about
    equal tokens instead."""
    n = layout.num_rows
    if n == 0:
        return [(0, 0)]
    starts = np.cumsum(layout.row_tokens) - layout.row_tokens
    file_of_row = starts // shard_tokens
    bounds = np.flatnonzero(np.diff(file_of_row)) + 1
    edges = [0, *bounds.tolist(), n]
    count = min(min_files, n)
    if len(edges) - 1 >= count:
        return list(itertools.pairwise(edges))
    total = int(layout.row_tokens.sum())
    targets = np.arange(1, count, dtype=np.int64) * total // count
    edges = [0]
    for j, first in enumerate(np.searchsorted(starts, targets).tolist(), start=1):
        # The first row starting at or after the j-th share, but every file gets a row.
        edges.append(min(max(first, edges[-1] + 1), n - (count - j)))
    edges.append(n)
    return list(itertools.pairwise(edges))


def write_config_file(
    plan: Plan,
    layout: RowLayout,
    source: TokenSource,
    final: Path,
    config: WriteConfig,
    f0: int,
    f1: int,
    on_tokens: Callable[[int], object] | None = None,  # its result is not used
    *,
    pad_id: int = 0,
    pieces: PieceRule | None = None,
    cost_model: CostModel | None = None,
    scratch: Scratch | None = None,
) -> None:
    """Rows ``f0..f1-1`` of a config into one Parquet file: temp name, fsync, rename.

    A file under its final name is therefore always complete, which is what lets an
    interrupted run keep it. ``scratch``: the row groups' buffers (one thread's, kept from
    file to file); each group is written before the next is built.
    """
    scratch = scratch if scratch is not None else Scratch()
    final.parent.mkdir(parents=True, exist_ok=True)
    rows_per_group = max(1, config.row_group_tokens // layout.capacity)
    compression = None if config.compression == "none" else config.compression
    level = config.compression_level if compression in ("zstd", "gzip") else None
    schema = row_schema(source, plan.pad_multiple > 1, cost_model is not None)
    with (
        atomic_path(final) as tmp,
        pq.ParquetWriter(
            str(tmp),
            schema,
            compression=compression,
            compression_level=level,
            use_dictionary=False,
        ) as writer,
    ):
        if f1 == f0:
            writer.write_table(schema.empty_table())
        for g0 in range(f0, f1, rows_per_group):
            g1 = min(f1, g0 + rows_per_group)
            table = rows_to_table(
                plan,
                layout,
                g0,
                g1,
                source,
                pad_id=pad_id,
                pieces=pieces,
                cost_model=cost_model,
                scratch=scratch,
            )
            writer.write_table(in_chunks(table, layout.capacity), row_group_size=g1 - g0)
            del table  # its buffers are the next group's
            if on_tokens is not None:
                on_tokens(int(layout.row_tokens[g0:g1].sum()))


# Tokens of a row group's table handed to the Parquet writer at a time (whole rows).
CHUNK_TOKENS = 1 << 17


def in_chunks(table: pa.Table, capacity: int) -> pa.Table:
    """``table`` as chunks of whole rows of at most ``CHUNK_TOKENS`` tokens (one row where a
    row holds more): zero-copy slices, the same Parquet bytes (the writer cuts pages by the
    values it was given, not by how they were chunked; ``test_chunked_write_same_bytes``).

    Why: the writer builds each chunk's repetition and definition levels (4 bytes a token
    per list column) in buffers it grows by doubling; for a 16M-token row group that is
    ~200 MB of fresh memory per column set, re-faulted and copied in every file (measured:
    the write stage's threads spent ~a quarter of their time zeroing fresh pages).
    Chunks of 128k tokens keep those buffers small and reused."""
    rows = max(1, CHUNK_TOKENS // max(1, capacity))
    if table.num_rows <= rows:
        return table
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), schema=table.schema)


def pack_table(
    table: pa.Table,
    config: PlanConfig,
    column: str = "input_ids",
    *,
    configs: tuple[str, ...] = CONFIG_NAMES,
) -> tuple[pa.Table | None, pa.Table | None, Plan]:
    """In-memory two-tier packing of already tokenized documents: ``(long, short, plan)``.

    For callers that hold tokens in Arrow (e.g. a ``datasets.Dataset``'s table) rather than
    jsonl on disk; the tables use the public row schema. Document ``i`` of ``table`` gets
    doc id ``i``. ``configs`` picks which tables to build (the other is ``None``): building
    one gathers every token once instead of twice, and plans only what that config needs
    (the returned plan's other layout is ``None`` too). A table is the same either way.
    """
    col = table.column(column)
    if col.num_chunks == 1:
        ids = col.chunk(0)  # no copy
    elif col.num_chunks == 0:
        ids = list_array(np.zeros(1, np.int32), np.zeros(0, np.int32), pa.int32())
    else:
        ids = col.combine_chunks()
    if not pa.types.is_integer(ids.type.value_type):
        raise ValueError(f"column {column!r} must be a list of integers, got {ids.type}")
    offsets = to_numpy(ids.offsets).astype(np.int64)
    values = to_numpy(ids.values).astype(np.int32, copy=False)
    plan = plan_two_tier(np.diff(offsets), config, configs=tuple(configs))
    source = TokenSource([ShardTokens(values=values, offsets=offsets, first_doc_id=0)])
    rule = PieceRule(config.long_len, (config.overlong == "truncate",))
    tables = {
        name: rows_to_table(
            plan, getattr(plan, name), 0, getattr(plan, name).num_rows, source, pieces=rule
        )
        if name in configs
        else None
        for name in CONFIG_NAMES
    }
    return tables["long"], tables["short"], plan
