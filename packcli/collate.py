"""Training-time collator: turn packcli rows into what an attention kernel needs.

Why: a packed row is several documents back to back. Trained naively (plain positions, one
causal mask) every document attends to the unrelated ones before it and the last token of a
document is trained to predict the first token of the next. ``PackedCollator`` turns the
stored boundaries (``seq_lengths``, TRL's column) into one of three equivalent forms, each of
which makes a transformers model compute every document exactly as if it were alone
(``tests/test_training_equivalence.py`` proves it to 1e-4 on sdpa and eager), and it sets
the label of every document's first token to -100 so no loss crosses a boundary.

Transformers mechanisms relied upon, as read in transformers 5.24.0 (the tests pin every one
that runs on CPU, so an upgrade that changes one fails loudly; the flash-attn call itself
needs a GPU and is covered by a reference varlen attention that reads only ``cu_seq_lens``):

* ``mode="flash"``: the batch is flattened to ``[1, total]`` with ``cu_seq_lens_q/k`` and
  ``max_length_q/k``. The model forwards these keyword arguments to the attention function,
  and ``modeling_flash_attention_utils._flash_attention_forward`` calls
  ``flash_attn_varlen_func`` with them when all four are given and ``attention_mask`` is
  None (the names ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` emits). The
  restarting ``position_ids`` of the same batch also make sdpa/eager exact (next item), so a
  ``flash`` batch is correct on any backend.
* ``mode="position_ids"``: ``masking_utils._preprocess_mask_arguments`` calls
  ``find_packed_sequence_indices(position_ids)`` when ``attention_mask`` is None **and there
  is no cache**; a new sequence starts wherever ``position_ids`` does not step by +1, and
  ``create_causal_mask`` ANDs ``packed_sequence_mask_function`` into the causal mask (tested
  on sdpa and eager; flex builds its block mask from the same function). Two traps: (1)
  the model creates a ``DynamicCache`` whenever ``use_cache`` is on - ``config.use_cache``
  defaults to True even in training mode - and then the packing is silently ignored, so
  call the model with ``use_cache=False`` (HF ``Trainer`` sets ``config.use_cache =
  args.use_cache``, False by default); (2) flash-attention derives varlen boundaries from
  ``position_ids`` only for batch size 1 (``_is_packed_sequence``), so a padded
  ``[batch, len]`` batch is *not* separated there: use ``mode="flash"`` with it.
* ``mode="mask4d"``: ``_preprocess_mask_arguments`` returns a 4D ``attention_mask`` as is.
  ``eager_attention_forward`` *adds* it to the scores, and ``sdpa_attention_forward`` passes
  it to ``F.scaled_dot_product_attention`` (float: additive; bool: True = attend). So the
  mask is float (0 = attend, dtype-min = blocked): a boolean mask added by eager becomes
  biases of 1.0 and 0.0, which masks nothing. It works with or without a cache. It costs
  ``batch * len**2`` elements (8 rows of 4096: 512 MiB, ~1.5 s to build on one CPU core),
  so prefer the other modes for long rows.

Padding (``position_ids`` and ``mask4d`` pad every row on the right to the batch's longest
row; ``flash`` pads only for ``pad_to_multiple_of``): the pad tokens of a row form one extra
segment of their own, with positions restarting at 0, label -100, and in ``mask4d`` a causal
block of their own. Real tokens never attend to them, so the real tokens' logits are exact,
and no query row of the mask is fully blocked (such a row yields NaN with a boolean or
-inf mask in sdpa, whose gradient poisons the step). TRL pads ``position_ids`` with 0
instead, making every pad token its own one-token segment; both are exact for the real
tokens.

``position_ids_from_lengths``, ``cu_seqlens_from_lengths`` and ``segment_ids_from_lengths``
are the same conversions in numpy without torch, for other frameworks. torch is imported
inside the functions that need it, so ``import packcli.collate`` works without it. Cost,
measured on one CPU core: 0.6 ms (``flash``) and 0.9 ms (``position_ids``) for 4 rows of 512
tokens, 4-6 ms for 8 rows of 4096; ``mask4d`` is dominated by its mask (above).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Mode = Literal["flash", "position_ids", "mask4d"]
MODES: tuple[str, ...] = ("flash", "position_ids", "mask4d")
IGNORE_INDEX = -100


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
    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


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
    """

    def __init__(
        self,
        *,
        mode: Mode,
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        return_seq_idx: bool = False,
        mask_dtype: torch.dtype | str = "float32",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
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

    def __repr__(self) -> str:
        return (
            f"PackedCollator(mode={self.mode!r}, pad_token_id={self.pad_token_id}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, return_seq_idx={self.return_seq_idx})"
        )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if len(rows) == 0:
            raise ValueError("PackedCollator got an empty batch")
        parsed = [_parse_row(row, i) for i, row in enumerate(rows)]
        if self.mode == "flash":
            return self._flatten(parsed)
        return self._pad(parsed)

    def _padded_length(self, n: int) -> int:
        m = self.pad_to_multiple_of
        return n if m is None else -(-n // m) * m

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


def _parse_row(row: Mapping[str, Any], index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, labels, seq_lengths) of one row as int64 arrays, checked for agreement."""
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
            f"{ids.size} input_ids"
        )
    if row.get("labels") is not None:
        labels = np.array(row["labels"], dtype=np.int64)
        if labels.shape != ids.shape:
            raise ValueError(
                f"row {index}: labels has {labels.size} entries but input_ids has {ids.size}"
            )
    else:
        labels = ids.copy()
    return ids, labels, lengths
