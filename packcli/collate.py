"""Training-time collator: turn packcli rows into what an attention kernel needs.

Why: a packed row is several documents back to back. Trained naively (plain positions, one
causal mask) every document attends to the unrelated ones before it, and the last token of a
document is trained to predict the first token of the next. ``PackedCollator`` turns the
stored boundaries (``seq_lengths``, TRL's column) into one of three equivalent forms
(``flash``: a flattened batch with ``cu_seq_lens``; ``position_ids``: per-document positions;
``mask4d``: a float block-causal mask), each of which makes a transformers model compute every
document exactly as if it were alone, and it sets the label of every document's first token to
-100 so no loss crosses a boundary. Also here: preference rows' per-segment log-probabilities
(``segment_logps``, ``preference_pairs``), per-document loss normalisation (``packed_loss``,
``PackedLossMixin``), context-parallel rows' TE boundaries (``te_thd_kwargs``,
``cp_rank_indices``) and numpy conversions for other frameworks.

docs/training.md says how to use each, which transformers mechanisms they rely on (read in
transformers 5.24) and the traps (a cache silently turns ``position_ids`` packing off; a
boolean 4D mask is added, not applied, on eager); the tests pin every mechanism that runs on
CPU (``tests/test_training_equivalence.py``: logits to 1e-4 on sdpa and eager), so an upgrade
that changes one fails loudly. torch is imported inside the functions that need it, so
``import packcli.collate`` works without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from packcli.names import IGNORE_INDEX as IGNORE_INDEX  # public here: trainers import it
from packcli.pack.padding import pad_positions, padded_length

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Mode = Literal["flash", "position_ids", "mask4d"]
MODES: tuple[Mode, ...] = get_args(Mode)
LossNormalization = Literal["token", "sequence"]
LOSS_NORMALIZATIONS: tuple[LossNormalization, ...] = get_args(LossNormalization)
# seq_roles values, as packcli writes them (packcli.write.PREFERENCE_ROW_SCHEMA).
ROLE_DOCUMENT, ROLE_CHOSEN, ROLE_REJECTED = 0, 1, 2


def _lengths_array(seq_lengths: Any) -> np.ndarray:
    lengths = np.asarray(seq_lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"seq_lengths must be one-dimensional, got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"seq_lengths must not be negative, got {lengths.tolist()}")
    return lengths


def cu_seqlens_from_lengths(seq_lengths: Any) -> np.ndarray:
    """Cumulative boundaries ``[0, l0, l0+l1, ...]`` as int32 (flash-attn varlen ``cu_seqlens``).

    >>> cu_seqlens_from_lengths([3, 2]).tolist()
    [0, 3, 5]
    """
    lengths = _lengths_array(seq_lengths)
    cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    return cu.astype(np.int32)


def position_ids_from_lengths(seq_lengths: Any) -> np.ndarray:
    """Per-token positions restarting at 0 in every segment, as int64.

    >>> position_ids_from_lengths([3, 2]).tolist()
    [0, 1, 2, 0, 1]
    """
    lengths = _lengths_array(seq_lengths)
    starts = np.cumsum(lengths) - lengths
    own_start = np.repeat(starts, lengths)
    positions: np.ndarray = np.arange(int(lengths.sum()), dtype=np.int64) - own_start
    return positions


def segment_ids_from_lengths(seq_lengths: Any) -> np.ndarray:
    """Per-token 1-based segment index as int32: the row's stored ``segment_ids`` column.

    >>> segment_ids_from_lengths([3, 2]).tolist()
    [1, 1, 1, 2, 2]
    """
    lengths = _lengths_array(seq_lengths)
    return np.repeat(np.arange(1, lengths.size + 1, dtype=np.int32), lengths)


def _lengths_from_segment_ids(segment_ids: Any) -> np.ndarray:
    seg = np.asarray(segment_ids, dtype=np.int64)
    if seg.size == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(np.diff(seg)) + 1
    edges = np.concatenate([[0], change, [seg.size]])
    return np.diff(edges)


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(
            f"mask_dtype must be a floating torch dtype such as 'bfloat16', got {dtype!r}"
        )
    return resolved


class PackedCollator:
    """Collate packcli rows (either config) into model inputs; see the module docstring.

    Always returns ``input_ids``, ``labels`` (the stored ``labels`` if present, else
    ``input_ids``; -100 at every segment's first token and on padding) and ``position_ids``
    restarting at 0 in every segment, all int64.

    * ``mode="flash"``: shape ``[1, total]`` plus ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32)
      and ``max_length_q``/``max_length_k`` (Python ints) for flash-attention varlen.
    * ``mode="position_ids"``: shape ``[batch, max_len]``, no ``attention_mask``; for sdpa,
      eager and flex with ``use_cache=False``.
    * ``mode="mask4d"``: shape ``[batch, max_len]`` plus a float ``attention_mask``
      ``[batch, 1, max_len, max_len]`` (0 = attend, ``finfo(mask_dtype).min`` = blocked);
      ``mask_dtype`` must match the model's dtype for sdpa (e.g. ``torch.bfloat16``).

    ``pad_token_id`` fills padding (any valid id: padding is never attended by real tokens
    and carries no loss). ``pad_to_multiple_of`` rounds the padded length up (the total
    length in ``flash`` mode); pass the row capacity for static shapes. ``return_seq_idx``
    adds ``seq_idx`` (int32, 0-based segment index per token, same shape as ``input_ids``;
    padding is one more segment) for kernels that take it (e.g. Mamba-2).

    Rows with ``seq_roles`` (preference rows) add ``seq_roles`` (int64 ``[S]``, one per real
    segment of the batch, in order; a row without the column counts as ordinary documents)
    and ``seq_spans`` (int64 ``[S, 3]``: each segment's ``(row, start, end)`` in the batch's
    layout), which ``segment_logps`` and ``preference_pairs`` read. Rows without the column
    give exactly the batch they gave before.

    ``loss_normalization`` (``"token"`` or ``"sequence"``) adds ``loss_weights`` (float32, the
    shape of ``labels``): the weight of each token's loss, 0 where the label is -100, 1
    (``"token"``) or 1 / (trained tokens of its segment) (``"sequence"``); ``packed_loss``
    divides their weighted loss by ``num_items_in_batch`` = the sum of the weights over the
    accumulated batch. These keys are not model inputs: pop them before ``model(**batch)``
    (transformers would silently ignore them), see ``model_inputs``.
    """

    def __init__(
        self,
        *,
        mode: Mode,
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        return_seq_idx: bool = False,
        mask_dtype: torch.dtype | str = "float32",
        loss_normalization: LossNormalization | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        if loss_normalization is not None and loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"loss_normalization must be one of {', '.join(LOSS_NORMALIZATIONS)} or None; "
                f"got {loss_normalization!r}"
            )
        if not isinstance(pad_token_id, int | np.integer) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be a non-negative int, got {pad_token_id!r}")
        if pad_to_multiple_of is not None and (
            not isinstance(pad_to_multiple_of, int | np.integer) or pad_to_multiple_of < 1
        ):
            raise ValueError(
                f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}"
            )
        self.mode: Mode = mode
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self.return_seq_idx = return_seq_idx
        self.mask_dtype = mask_dtype
        self.loss_normalization: LossNormalization | None = loss_normalization

    def __repr__(self) -> str:
        extra = (
            ""
            if self.loss_normalization is None
            else f", loss_normalization={self.loss_normalization!r}"
        )
        return (
            f"PackedCollator(mode={self.mode!r}, pad_token_id={self.pad_token_id}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, return_seq_idx={self.return_seq_idx}"
            f"{extra})"
        )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if len(rows) == 0:
            raise ValueError("PackedCollator got an empty batch")
        parsed = [_parse_row(row, i) for i, row in enumerate(rows)]
        batch = self._flatten(parsed) if self.mode == "flash" else self._pad(parsed)
        if self.mode == "flash" and any(row.get("seq_pad") is not None for row in rows):
            import torch

            pads = [_parse_pad(row, i, parsed[i][2]) for i, row in enumerate(rows)]
            real = np.concatenate([p[2] - pad for p, pad in zip(parsed, pads, strict=True)])
            padded = np.concatenate([p[2] for p in parsed])
            cu_padded = cu_seqlens_from_lengths(padded)
            cu_padded[-1] = batch["input_ids"].shape[1]  # trailing padding: in the last segment
            batch["cu_seqlens"] = torch.from_numpy(cu_seqlens_from_lengths(real))
            batch["cu_seqlens_padded"] = torch.from_numpy(cu_padded)
            batch["max_seqlen"] = int(np.diff(cu_padded).max())
        if any(row.get("seq_roles") is not None for row in rows):
            import torch

            roles = [_parse_roles(row, i, parsed[i][2].size) for i, row in enumerate(rows)]
            batch["seq_roles"] = torch.from_numpy(np.concatenate(roles))
            batch["seq_spans"] = torch.from_numpy(self._spans([p[2] for p in parsed]))
        if self.loss_normalization is not None:
            batch["loss_weights"] = loss_weights(batch, self.loss_normalization)
        return batch

    def _spans(self, lengths: list[np.ndarray]) -> np.ndarray:
        """(row, start, end) of every real segment in the batch layout, int64 ``[S, 3]``."""
        spans = []
        offset = 0
        for r, row_lengths in enumerate(lengths):
            cu = cu_seqlens_from_lengths(row_lengths).astype(np.int64)
            if self.mode == "flash":  # one flattened row: segments continue the previous row's
                part = np.stack(
                    [np.zeros(row_lengths.size, np.int64), cu[:-1] + offset, cu[1:] + offset], 1
                )
                offset += int(cu[-1])
            else:
                part = np.stack([np.full(row_lengths.size, r, np.int64), cu[:-1], cu[1:]], 1)
            spans.append(part)
        return np.concatenate(spans).reshape(-1, 3)

    def _padded_length(self, n: int) -> int:
        return padded_length(n, self.pad_to_multiple_of)

    def _flatten(self, parsed: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, Any]:
        import torch

        ids = np.concatenate([p[0] for p in parsed])
        labels = np.concatenate([p[1] for p in parsed])
        lengths = np.concatenate([p[2] for p in parsed])
        n_pad = self._padded_length(ids.size) - ids.size
        if n_pad:
            ids = np.concatenate([ids, np.full(n_pad, self.pad_token_id, dtype=np.int64)])
            labels = np.concatenate([labels, np.full(n_pad, IGNORE_INDEX, dtype=np.int64)])
            lengths = np.concatenate([lengths, [n_pad]])
        cu = cu_seqlens_from_lengths(lengths)
        labels[cu[:-1]] = IGNORE_INDEX
        cu_t = torch.from_numpy(cu)
        max_length = int(lengths.max())
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids)[None],
            "labels": torch.from_numpy(labels)[None],
            "position_ids": torch.from_numpy(position_ids_from_lengths(lengths))[None],
            "cu_seq_lens_q": cu_t,
            "cu_seq_lens_k": cu_t.clone(),
            "max_length_q": max_length,
            "max_length_k": max_length,
        }
        if self.return_seq_idx:
            batch["seq_idx"] = torch.from_numpy(segment_ids_from_lengths(lengths) - 1)[None]
        return batch

    def _pad(self, parsed: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, Any]:
        import torch

        width = self._padded_length(max(p[0].size for p in parsed))
        n_rows = len(parsed)
        ids = np.full((n_rows, width), self.pad_token_id, dtype=np.int64)
        labels = np.full((n_rows, width), IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros((n_rows, width), dtype=np.int64)
        segments = np.zeros((n_rows, width), dtype=np.int32)  # 1-based; padding = k + 1
        for r, (row_ids, row_labels, lengths) in enumerate(parsed):
            n = row_ids.size
            if width > n:
                lengths = np.concatenate([lengths, [width - n]])
            starts = cu_seqlens_from_lengths(lengths)[:-1]
            ids[r, :n] = row_ids
            labels[r, :n] = row_labels
            labels[r, starts] = IGNORE_INDEX
            positions[r] = position_ids_from_lengths(lengths)
            segments[r] = segment_ids_from_lengths(lengths)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
        }
        if self.mode == "mask4d":
            batch["attention_mask"] = block_causal_mask(
                torch.from_numpy(segments), _torch_dtype(self.mask_dtype)
            )
        if self.return_seq_idx:
            batch["seq_idx"] = torch.from_numpy(segments - 1)
        return batch


def block_causal_mask(
    segment_ids: torch.Tensor, dtype: torch.dtype | str = "float32"
) -> torch.Tensor:
    """Float 4D mask ``[batch, 1, L, L]`` from ``[batch, L]`` segment ids: 0 where a query may
    attend (same run of equal segment ids, key not after query), ``finfo(dtype).min`` elsewhere.

    One fill of the blocked value, then one write per segment of its lower triangle. Measured
    for 8 rows of 4096 (a 512 MiB float32 mask): 1.6 s, against 3.2 s when comparing every
    (query, key) pair; nearly all of it is allocating and filling the mask itself.
    """
    import torch

    dtype = _torch_dtype(dtype)
    batch, length = segment_ids.shape
    device = segment_ids.device
    mask = torch.full(
        (batch, 1, length, length), torch.finfo(dtype).min, dtype=dtype, device=device
    )
    tril = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    for r in range(batch):
        _, counts = torch.unique_consecutive(segment_ids[r], return_counts=True)
        start = 0
        for n in counts.tolist():
            mask[r, 0, start : start + n, start : start + n].masked_fill_(tril[:n, :n], 0)
            start += n
    return mask


def _parse_roles(row: Mapping[str, Any], index: int, n_segments: int) -> np.ndarray:
    """The row's ``seq_roles`` as int64, or all 0 (ordinary documents) when it has none."""
    if row.get("seq_roles") is None:
        return np.zeros(n_segments, dtype=np.int64)
    roles = np.asarray(row["seq_roles"], dtype=np.int64)
    if roles.shape != (n_segments,):
        raise ValueError(
            f"row {index}: seq_roles has {roles.size} entries but the row has {n_segments} "
            "segments (one role per seq_lengths entry)"
        )
    if roles.size and (roles.min() < ROLE_DOCUMENT or roles.max() > ROLE_REJECTED):
        raise ValueError(
            f"row {index}: seq_roles must be 0 (document), 1 (chosen) or 2 (rejected), "
            f"got {sorted(set(roles.tolist()))}"
        )
    return roles


def _parse_pad(row: Mapping[str, Any], index: int, lengths: np.ndarray) -> np.ndarray:
    """The row's ``seq_pad`` as int64 (all 0 when it has none), checked against its segments."""
    if row.get("seq_pad") is None:
        return np.zeros(lengths.size, dtype=np.int64)
    pad = np.asarray(row["seq_pad"], dtype=np.int64)
    if pad.shape != lengths.shape or (pad < 0).any() or (pad >= lengths).any():
        raise ValueError(
            f"row {index}: seq_pad must hold one count per segment, each under its seq_lengths "
            f"entry; got seq_pad {pad.tolist()} for seq_lengths {lengths.tolist()}"
        )
    return pad


def _parse_row(row: Mapping[str, Any], index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, labels, seq_lengths) of one row as int64 arrays, checked for agreement;
    context-parallel padding (``seq_pad``) gets label -100."""
    if "input_ids" not in row:
        raise ValueError(f"row {index} has no input_ids column")
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"row {index}: input_ids must be a non-empty list of token ids")
    if row.get("seq_lengths") is not None:
        lengths = _lengths_array(row["seq_lengths"])
    elif row.get("segment_ids") is not None:
        lengths = _lengths_from_segment_ids(row["segment_ids"])
    else:
        raise ValueError(
            f"row {index} has no seq_lengths (or segment_ids) column, so its document boundaries "
            "are unknown; with HF Trainer pass TrainingArguments(remove_unused_columns=False)"
        )
    if lengths.size == 0 or lengths.min() < 1:
        raise ValueError(f"row {index}: seq_lengths must be positive, got {lengths.tolist()}")
    if int(lengths.sum()) != ids.size:
        raise ValueError(
            f"row {index}: seq_lengths sum to {int(lengths.sum())} but the row has "
            f"{ids.size} input_ids; if a trainer cut the rows, turn its truncation off "
            "(TRL: SFTConfig(max_length=None); its default 1024 cuts input_ids, not seq_lengths)"
        )
    if row.get("labels") is not None:
        labels = np.array(row["labels"], dtype=np.int64)
        if labels.shape != ids.shape:
            raise ValueError(
                f"row {index}: labels has {labels.size} entries but input_ids has {ids.size}"
            )
    else:
        labels = ids.copy()
    if row.get("seq_pad") is not None:
        labels[pad_positions(lengths, _parse_pad(row, index, lengths))] = IGNORE_INDEX
    return ids, labels, lengths


def te_thd_kwargs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Transformer Engine ``DotProductAttention`` keyword arguments for a ``mode="flash"``
    batch of context-parallel rows (THD layout, one causal block per segment, padding at
    each segment's end): the real and padded boundaries for queries and keys alike, and the
    longest padded segment. Megatron's ``PackedSeqParams`` takes the same names (without
    ``attn_mask_type``)."""
    if "cu_seqlens_padded" not in batch:
        raise ValueError(
            "the batch has no cu_seqlens_padded: collate rows packed with --cp-size using "
            "PackedCollator(mode='flash')"
        )
    cu, cu_padded, longest = batch["cu_seqlens"], batch["cu_seqlens_padded"], batch["max_seqlen"]
    return {
        "qkv_format": "thd",
        "attn_mask_type": "padding_causal",
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        "cu_seqlens_q_padded": cu_padded,
        "cu_seqlens_kv_padded": cu_padded,
        "max_seqlen_q": longest,
        "max_seqlen_kv": longest,
    }


def cp_rank_indices(cu_seqlens_padded: Any, cp_size: int, cp_rank: int) -> np.ndarray:
    """The token indices context-parallel rank ``cp_rank`` of ``cp_size`` holds, in order:
    of every segment (``cu_seqlens_padded``), cut into ``2 * cp_size`` equal chunks, chunks
    ``cp_rank`` and ``2 * cp_size - 1 - cp_rank`` (TE's load-balanced split for causal
    attention, as its ``get_batch_on_this_cp_rank`` takes them). Take ``input_ids``,
    ``labels`` and ``position_ids`` of the batch at these indices on that rank."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    lengths = np.diff(cu)
    chunks = 2 * cp_size
    if (lengths % chunks).any():
        raise ValueError(
            f"every segment must be a multiple of 2 * cp_size = {chunks} tokens (pack with "
            f"--cp-size {cp_size}, collate with a pad_to_multiple_of that is a multiple of "
            f"{chunks}); got lengths {lengths.tolist()}"
        )
    size = lengths // chunks
    firsts = np.stack([cu[:-1] + cp_rank * size, cu[:-1] + (chunks - 1 - cp_rank) * size], 1)
    starts = firsts.reshape(-1)
    counts = np.repeat(size, 2)
    total = int(counts.sum())
    index: np.ndarray = (
        np.repeat(starts, counts) + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    )
    return index


# --- loss normalisation --------------------------------------------------------------------

# Batch keys the collator adds that are not model inputs.
NON_MODEL_KEYS: tuple[str, ...] = ("seq_roles", "seq_spans", "loss_weights")


def model_inputs(batch: Mapping[str, Any], *, labels: bool = True) -> dict[str, Any]:
    """The batch without the keys that are for the loss, not the model (``NON_MODEL_KEYS``;
    also ``labels`` with ``labels=False``, when the caller computes the loss itself).

    transformers models accept unknown keyword arguments and drop them without a word, so
    ``model(**batch)`` would run, and ignore the weights: strip them here, use them in
    ``packed_loss`` or ``segment_logps``.
    """
    drop = set(NON_MODEL_KEYS) | (set() if labels else {"labels"})
    return {k: v for k, v in batch.items() if k not in drop}


def loss_weights(batch: Mapping[str, Any], normalization: LossNormalization) -> torch.Tensor:
    """Per-token loss weights (float32, the shape of ``labels``) for a collated batch.

    ``"token"``: 1 on every trained token (label != -100), so ``sum(weights)`` is the number
    of trained tokens and the weighted mean is the usual token mean. ``"sequence"``: 1 / n on
    each of a segment's n trained tokens, so each segment (document) sums to 1 whatever its
    length and ``sum(weights)`` is the number of trained documents.

    Segments are read from ``position_ids`` (a new one at every 0), so this also works on
    batches from other packed collators (TRL's padding-free batch: its padding tokens, all at
    position 0, are one-token segments without loss). A document packcli split into pieces
    counts as one segment per piece.
    """
    import torch

    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(
            f"normalization must be one of {', '.join(LOSS_NORMALIZATIONS)}; got {normalization!r}"
        )
    labels: torch.Tensor = batch["labels"]
    trained = (labels != IGNORE_INDEX).to(torch.float32)
    if normalization == "token":
        return trained
    starts = (batch["position_ids"] == 0).reshape(-1)
    starts[0] = True  # a row's first token always opens a segment
    segment = torch.cumsum(starts.to(torch.int64), 0) - 1
    per_segment = torch.zeros(int(segment[-1]) + 1, dtype=torch.float32, device=labels.device)
    per_segment.index_add_(0, segment, trained.reshape(-1))
    return (trained.reshape(-1) / per_segment.clamp(min=1)[segment]).reshape(labels.shape)


def packed_loss(
    logits: torch.Tensor,
    batch: Mapping[str, Any],
    num_items_in_batch: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Weighted causal-LM loss of a batch with ``loss_weights``: ``sum(w * nll) / N``.

    The logits at position t predict ``labels[t + 1]`` (the shift happens here, within each
    row; the collator's -100 at every segment start keeps it within each document). ``N`` is
    ``num_items_in_batch``, the sum of ``loss_weights`` over every micro-batch of the
    optimizer step (``count_loss_items``; ``PackedLossMixin`` passes it in ``Trainer``), so
    summing the micro-batches' losses gives the whole step's mean; without it, this batch's
    own sum of weights.
    """
    import torch
    import torch.nn.functional as F

    if "loss_weights" not in batch:
        raise ValueError(
            "the batch has no loss_weights: make it with "
            "PackedCollator(..., loss_normalization='token' or 'sequence')"
        )
    labels: torch.Tensor = batch["labels"]
    weights: torch.Tensor = batch["loss_weights"]
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}: pass the "
            "logits of this batch"
        )
    targets = labels[..., 1:].to(logits.device)
    nll = F.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    total = (nll * weights[..., 1:].reshape(-1).to(nll.device)).sum()
    denominator = weights.sum() if num_items_in_batch is None else num_items_in_batch
    return total / torch.as_tensor(denominator, dtype=total.dtype, device=total.device)


def count_loss_items(batches: Sequence[Mapping[str, Any]]) -> float:
    """``num_items_in_batch`` for ``packed_loss``: the sum of ``loss_weights`` over the
    micro-batches of one optimizer step (trained tokens for ``"token"``, trained documents
    for ``"sequence"``). With several processes, sum it over them too and multiply each
    process's loss by the number of processes (DDP averages gradients), as ``Trainer`` does.
    """
    return float(sum(float(b["loss_weights"].double().sum()) for b in batches))


class PackedLossMixin:
    """Put before ``transformers.Trainer`` (or TRL's ``SFTTrainer``) to train with
    ``PackedCollator(loss_normalization=...)``: ``class PackedTrainer(PackedLossMixin,
    Trainer)``.

    Why: ``Trainer`` divides the summed loss by ``num_items_in_batch``, the trained tokens of
    the accumulated batch, which is the ``"token"`` convention and is already exact for packed
    rows with the plain ``Trainer``. A per-document mean needs the count of documents instead
    and per-token weights the model's own loss does not take. This mixin counts
    ``num_items_in_batch`` as the sum of ``loss_weights`` over the accumulated micro-batches
    (summed across processes when ``average_tokens_across_devices``, as ``Trainer`` does) and
    computes the loss with ``packed_loss``. Batches without ``loss_weights`` are left to the
    base class.
    """

    # Attributes of the Trainer this mixes into.
    args: Any
    accelerator: Any

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        trainer: Any = super()  # a mixin: the next class is the Trainer
        batch_samples, num_items = trainer.get_batch_samples(epoch_iterator, num_batches, device)
        if batch_samples and "loss_weights" in batch_samples[0]:
            import torch

            total = torch.tensor(count_loss_items(batch_samples), dtype=torch.float64)
            args = self.args
            if args.average_tokens_across_devices and args.world_size > 1:
                total = self.accelerator.gather(total.to(device)).sum()
            num_items = total.to(device)
        return batch_samples, num_items

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if "loss_weights" not in inputs:
            trainer: Any = super()  # a mixin: the next class is the Trainer
            return trainer.compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        # The loss below is already the step's mean: Trainer must not divide it by the
        # number of accumulation steps again.
        self.loss_is_scaled_for_ga = num_items_in_batch is not None
        forward = model_inputs(inputs, labels=False)
        forward["use_cache"] = False  # with a cache, position_ids do not separate documents
        outputs = model(**forward)
        loss = packed_loss(outputs.logits, inputs, num_items_in_batch)
        args = self.args
        if args.average_tokens_across_devices and num_items_in_batch is not None:
            # num_items_in_batch counts every process's items and DDP averages gradients.
            tp = self.get_tp_size() if hasattr(self, "get_tp_size") else 1
            loss = loss * (self.accelerator.num_processes // tp)
        return (loss, outputs) if return_outputs else loss


# --- preference pairs ----------------------------------------------------------------------


def segment_logps(
    logits: torch.Tensor, batch: Mapping[str, Any], *, average: bool = False
) -> torch.Tensor:
    """Per segment of the batch (``seq_spans`` order), the summed log-probability of its
    trained tokens (label != -100), float32 ``[S]``; with ``average=True`` divided by their
    number (SimPO, ORPO and TRL's IPO use the mean).

    The logits at position t score ``labels[t + 1]``, shifted within each segment: the
    collator's -100 at every segment start means no segment is scored on the previous one's
    last token. For the policy keep the graph (it is differentiable); for a reference model
    run it under ``torch.no_grad()``. Costs one float32 copy of the logits.
    """
    import torch

    if "seq_spans" not in batch:
        raise ValueError(
            "the batch has no seq_spans: collate rows that have a seq_roles column "
            "(packcli pack --format preference) with PackedCollator"
        )
    labels = batch["labels"].to(logits.device)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}: pass the "
            "logits of this batch"
        )
    spans = batch["seq_spans"].tolist()
    targets = labels[..., 1:]
    shifted = logits[..., :-1, :].float()
    trained = targets != IGNORE_INDEX
    picked = shifted.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    token_logps = picked - torch.logsumexp(shifted, dim=-1)
    segment = torch.full(labels.shape, -1, dtype=torch.int64, device=logits.device)
    for s, (r, a, b) in enumerate(spans):
        segment[r, a:b] = s
    segment = segment[..., 1:]  # the segment of the label each position predicts
    keep = trained & (segment >= 0)
    sums = torch.zeros(len(spans), dtype=torch.float32, device=logits.device)
    sums = sums.index_add(0, segment[keep], token_logps[keep])
    if not average:
        return sums
    counts = torch.zeros(len(spans), dtype=torch.float32, device=logits.device)
    counts.index_add_(0, segment[keep], torch.ones_like(token_logps[keep]))
    return sums / counts.clamp(min=1)


def preference_pairs(batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into ``segment_logps``' output of each pair's chosen and rejected segment.

    packcli writes a pair as two adjacent segments of one row, chosen (role 1) first; this
    checks that layout, so a batch built some other way fails here instead of pairing the
    wrong sequences. Ordinary documents (role 0) are left out (e.g. for an SFT term).
    """
    import torch

    if "seq_roles" not in batch:
        raise ValueError(
            "the batch has no seq_roles: collate rows that have a seq_roles column "
            "(packcli pack --format preference) with PackedCollator"
        )
    roles = batch["seq_roles"]
    chosen = torch.nonzero(roles == ROLE_CHOSEN).flatten()
    rejected = torch.nonzero(roles == ROLE_REJECTED).flatten()
    if chosen.numel() != rejected.numel() or not torch.equal(rejected, chosen + 1):
        raise ValueError(
            f"seq_roles do not form pairs ({chosen.numel()} chosen, {rejected.numel()} "
            "rejected): every chosen segment (1) must be followed by its rejected segment (2)"
        )
    spans = batch.get("seq_spans")
    if spans is not None and chosen.numel():
        split = spans[chosen, 0] != spans[rejected, 0]
        if bool(split.any()):
            raise ValueError("a chosen segment and its rejected segment are in different rows")
    return chosen, rejected


# --- TRL ---------------------------------------------------------------------------------

# What TRL 1.16 + transformers 5.24 do with packcli rows, derived from their source
# (trl/trainer/sft_trainer.py: SFTTrainer.__init__ and _prepare_dataset; transformers:
# masking_utils._preprocess_mask_arguments, modeling_flash_attention_utils._flash_attention_forward)
# and checked combination by combination in tests/test_trl_configs.py, where TRL itself and a
# tiny model are the oracle. Worst first: a config TRL refuses, then one that trains but not as
# if every document were alone, then one that is exact but attends over a whole flattened batch.
Verdict = Literal["ok", "slow", "wrong", "refused"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


@dataclass(frozen=True)
class SFTCheck:
    """``check_sft_config``'s finding: the worst verdict and one reason per problem."""

    verdict: Verdict
    reasons: tuple[str, ...] = ()


def _is_flash(attn_implementation: str | None) -> bool:
    return attn_implementation is not None and "flash" in attn_implementation


def collator_mode_for(attn_implementation: str) -> Mode:
    """The ``PackedCollator`` mode that is exact and cheapest on an attention kernel.

    flash-attention: ``"flash"`` (varlen ``cu_seq_lens``; ``"position_ids"`` is not separated
    there once a batch holds two rows). Every other kernel (sdpa, eager, flex): ``"position_ids"``
    (one ``len x len`` mask per row, where ``"flash"`` would build one ``total x total`` mask).
    """
    return "flash" if _is_flash(attn_implementation) else "position_ids"


def _longest_row(train_dataset: Any) -> int | None:
    if train_dataset is None:
        return None
    names = getattr(train_dataset, "column_names", None) or []
    if "num_tokens" in names:
        return max(train_dataset["num_tokens"], default=0)
    if "input_ids" in names:
        return max((len(ids) for ids in train_dataset["input_ids"]), default=0)
    return None


def sft_config_verdict(
    args: Any,
    data_collator: Any = None,
    *,
    attn_implementation: str | None = None,
    train_dataset: Any = None,
) -> SFTCheck:
    """What TRL's ``SFTTrainer`` would do with packcli rows under ``args`` (an ``SFTConfig``).

    ``"refused"``: ``SFTTrainer(...)`` raises. ``"wrong"``: it trains, but documents attend to
    each other, lose tokens, or a target crosses a boundary. ``"slow"``: exact, but on sdpa or
    eager the batch is one flattened row, so attention builds a ``total x total`` mask (TRL's
    ``padding_free=True``, or ``PackedCollator(mode="flash")``). ``"ok"``: exact at per-row cost.

    ``attn_implementation`` (``model.config._attn_implementation``) decides the last two and
    whether ``mode="position_ids"`` is separated (not on flash-attention with two rows or more);
    without it those are not judged. ``train_dataset`` (packcli rows) lets a ``max_length`` that
    no row exceeds pass; without it any ``max_length`` counts as cutting, since ``None`` is always
    right for rows packcli already fitted. ``remove_unused_columns`` does not matter:
    ``SFTTrainer`` keeps ``input_ids``, ``labels`` and ``seq_lengths`` either way.
    """
    packing = bool(getattr(args, "packing", False))
    padding_free = bool(getattr(args, "padding_free", False))
    max_length = getattr(args, "max_length", None)
    strategy = getattr(args, "packing_strategy", "bfd")
    batch = int(getattr(args, "per_device_train_batch_size", 1) or 1)
    # TRL turns padding-free on for its bfd packing as well (SFTTrainer.__init__).
    flattened = padding_free or (packing and strategy in {"bfd", "bfd_split"})
    refused, wrong, slow = [], [], []
    if flattened and data_collator is not None:
        refused.append(
            'TRL refuses a custom data_collator with padding_free=True ("Passing a custom data '
            'collator is not supported when using padding-free"): pass padding_free=False, '
            "PackedCollator lays the batch out itself"
        )
    if flattened and not packing and max_length is not None:
        refused.append(
            f'TRL refuses padding_free=True with max_length={max_length} ("max_length is not '
            'enforced"): pass max_length=None'
        )
    if packing and max_length is None:
        refused.append("TRL refuses packing=True with max_length=None: pass packing=False")
    if packing:
        wrong.append(
            "packing=True packs each packcli row again as one document, losing its "
            "boundaries: pass packing=False"
        )
    longest = _longest_row(train_dataset)
    if max_length is not None and not packing and (longest is None or longest > max_length):
        wrong.append(
            f"max_length={max_length} cuts input_ids of every longer row but not seq_lengths "
            "(TRL's default is 1024): pass max_length=None, packcli rows already fit"
        )
    if not flattened and data_collator is None:
        wrong.append(
            "padding_free=False with TRL's own collator ignores seq_lengths, so documents "
            "attend to each other: pass data_collator=PackedCollator(mode=collator_mode_for("
            "model.config._attn_implementation))"
        )
    if isinstance(data_collator, PackedCollator) and attn_implementation is not None:
        flash = _is_flash(attn_implementation)
        if flash and data_collator.mode == "position_ids" and batch > 1:
            wrong.append(
                "flash-attention reads document boundaries from position_ids only for one row "
                "a batch, so with per_device_train_batch_size > 1 mode='position_ids' lets "
                "documents attend to each other: use PackedCollator(mode='flash')"
            )
        if flash and data_collator.mode == "mask4d":
            wrong.append(
                "flash-attention takes no 4D mask, so mode='mask4d' fails or mixes documents: "
                "use PackedCollator(mode='flash')"
            )
        if not flash and data_collator.mode == "flash" and batch > 1:
            slow.append(
                f"mode='flash' on {attn_implementation} flattens the batch into one row, so "
                "attention builds a total x total mask: use mode='position_ids'"
            )
    slow_kernel = attn_implementation is not None and not _is_flash(attn_implementation)
    if flattened and data_collator is None and batch > 1 and slow_kernel:
        slow.append(
            f"padding_free=True on {attn_implementation} flattens the batch into one row, so "
            "attention builds a total x total mask: pass padding_free=False and "
            "data_collator=PackedCollator(mode='position_ids')"
        )
    found: tuple[tuple[Verdict, list[str]], ...] = (
        ("refused", refused),
        ("wrong", wrong),
        ("slow", slow),
    )
    for verdict, reasons in found:
        if reasons:
            return SFTCheck(verdict, tuple(refused + wrong + slow))
    return SFTCheck("ok")


def check_sft_config(
    args: Any,
    data_collator: Any = None,
    *,
    attn_implementation: str | None = None,
    train_dataset: Any = None,
) -> None:
    """Raise if TRL's ``SFTTrainer`` would refuse ``args`` or silently train packcli rows
    wrongly; log a warning if it would be exact but slow (``sft_config_verdict`` says which).

    Why: TRL's defaults cut packcli rows (``max_length=1024``) and ignore their boundaries
    (``padding_free=False`` with its own collator), and its padding-free path on sdpa builds a
    ``total x total`` mask. The config that is exact and per-row on every kernel is
    ``SFTConfig(packing=False, padding_free=False, max_length=None,
    remove_unused_columns=False)`` with
    ``data_collator=PackedCollator(mode=collator_mode_for(model.config._attn_implementation))``.
    """
    found = sft_config_verdict(
        args, data_collator, attn_implementation=attn_implementation, train_dataset=train_dataset
    )
    if found.verdict in ("refused", "wrong"):
        raise ValueError("SFTConfig for packcli rows: " + "; ".join(found.reasons))
    if found.verdict == "slow":
        logger.warning("SFTConfig for packcli rows: %s", "; ".join(found.reasons))
