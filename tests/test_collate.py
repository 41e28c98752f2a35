"""PackedCollator and the numpy helpers on hand-made rows: exact expected tensors.

The proof that these tensors make a model compute each document exactly as if it were alone
is in ``test_training_equivalence.py``; here every output is pinned value by value, and the
flash-mode output is checked against transformers' own ``DataCollatorWithFlattening`` and
``prepare_fa_kwargs_from_position_ids``.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from packcli.collate import (
    PackedCollator,
    block_causal_mask,
    cu_seqlens_from_lengths,
    position_ids_from_lengths,
    segment_ids_from_lengths,
)

NEG = torch.finfo(torch.float32).min

# Two rows: [a a a | b b] and [c c]; ids chosen so every token is distinguishable.
ROWS: list[dict[str, Any]] = [
    {"input_ids": [11, 12, 13, 21, 22], "seq_lengths": [3, 2], "segment_ids": [1, 1, 1, 2, 2]},
    {"input_ids": [31, 32], "seq_lengths": [2], "segment_ids": [1, 1]},
]


def t(values: list[Any], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# --- numpy helpers -------------------------------------------------------------------------


def test_numpy_helpers_exact() -> None:
    assert cu_seqlens_from_lengths([3, 2, 1]).tolist() == [0, 3, 5, 6]
    assert cu_seqlens_from_lengths([3, 2, 1]).dtype == np.int32
    assert position_ids_from_lengths([3, 2, 1]).tolist() == [0, 1, 2, 0, 1, 0]
    assert position_ids_from_lengths([3, 2, 1]).dtype == np.int64
    assert segment_ids_from_lengths([3, 2, 1]).tolist() == [1, 1, 1, 2, 2, 3]
    assert segment_ids_from_lengths([3, 2, 1]).dtype == np.int32
    # Empty rows and numpy / int32 inputs (what datasets hands out with a numpy format).
    assert cu_seqlens_from_lengths([]).tolist() == [0]
    assert position_ids_from_lengths(np.array([], dtype=np.int32)).tolist() == []
    assert segment_ids_from_lengths(np.array([2, 1], dtype=np.int32)).tolist() == [1, 1, 2]


@pytest.mark.parametrize("bad", [[3, -1], [[1, 2]]])
def test_numpy_helpers_reject_bad_lengths(bad: Any) -> None:
    with pytest.raises(ValueError, match="seq_lengths"):
        position_ids_from_lengths(bad)


def test_numpy_helpers_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "import packcli.collate as c\n"
        "assert c.position_ids_from_lengths([2, 1]).tolist() == [0, 1, 0]\n"
        "c.PackedCollator(mode='flash', loss_normalization='sequence')\n"
        "class T(c.PackedLossMixin): pass\n"
        "c.check_sft_config(type('A', (), {'padding_free': True, 'max_length': None})())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- flash mode ----------------------------------------------------------------------------


def test_flash_mode_exact() -> None:
    batch = PackedCollator(mode="flash", return_seq_idx=True)(ROWS)
    assert set(batch) == {
        "input_ids",
        "labels",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "seq_idx",
    }
    assert torch.equal(batch["input_ids"], t([[11, 12, 13, 21, 22, 31, 32]]))
    assert torch.equal(batch["labels"], t([[-100, 12, 13, -100, 22, -100, 32]]))
    assert torch.equal(batch["position_ids"], t([[0, 1, 2, 0, 1, 0, 1]]))
    assert torch.equal(batch["cu_seq_lens_q"], t([0, 3, 5, 7], torch.int32))
    assert torch.equal(batch["cu_seq_lens_k"], t([0, 3, 5, 7], torch.int32))
    assert batch["max_length_q"] == batch["max_length_k"] == 3
    assert type(batch["max_length_q"]) is int
    assert torch.equal(batch["seq_idx"], t([[0, 0, 0, 1, 1, 2, 2]], torch.int32))


def test_flash_mode_pad_to_multiple_of_adds_one_pad_segment() -> None:
    batch = PackedCollator(mode="flash", pad_token_id=7, pad_to_multiple_of=4)(ROWS)
    assert torch.equal(batch["input_ids"], t([[11, 12, 13, 21, 22, 31, 32, 7]]))
    assert torch.equal(batch["labels"], t([[-100, 12, 13, -100, 22, -100, 32, -100]]))
    assert torch.equal(batch["position_ids"], t([[0, 1, 2, 0, 1, 0, 1, 0]]))
    assert torch.equal(batch["cu_seq_lens_q"], t([0, 3, 5, 7, 8], torch.int32))
    # Already a multiple: nothing added.
    batch = PackedCollator(mode="flash", pad_to_multiple_of=7)(ROWS)
    assert batch["input_ids"].shape == (1, 7)


def test_flash_mode_matches_transformers_flattening_collator() -> None:
    """Our flattened batch equals transformers' DataCollatorWithFlattening fed one document
    per example, and our cu_seq_lens equal what transformers derives from our position_ids."""
    from transformers import DataCollatorWithFlattening
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    rows = [*ROWS, {"input_ids": [41, 42, 43, 51], "seq_lengths": [3, 1]}]
    ours = PackedCollator(mode="flash", return_seq_idx=True)(rows)
    documents = []
    for row in rows:
        cu = cu_seqlens_from_lengths(row["seq_lengths"])
        documents += [{"input_ids": row["input_ids"][a:b]} for a, b in itertools.pairwise(cu)]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        documents
    )
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(ours["position_ids"])
    assert torch.equal(cu_q, ours["cu_seq_lens_q"]) and torch.equal(cu_k, ours["cu_seq_lens_k"])
    assert int(max_q) == ours["max_length_q"] and int(max_k) == ours["max_length_k"]


# --- padded modes --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["position_ids", "mask4d"])
def test_padded_modes_exact(mode: str) -> None:
    batch = PackedCollator(mode=mode, pad_token_id=0, return_seq_idx=True)(ROWS)
    expected_keys = {"input_ids", "labels", "position_ids", "seq_idx"}
    assert set(batch) == expected_keys | ({"attention_mask"} if mode == "mask4d" else set())
    assert torch.equal(batch["input_ids"], t([[11, 12, 13, 21, 22], [31, 32, 0, 0, 0]]))
    assert torch.equal(batch["labels"], t([[-100, 12, 13, -100, 22], [-100, 32, -100, -100, -100]]))
    # Padding is one segment of its own, positions restarting at 0.
    assert torch.equal(batch["position_ids"], t([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]))
    assert torch.equal(batch["seq_idx"], t([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]], torch.int32))


def test_mask4d_exact() -> None:
    mask = PackedCollator(mode="mask4d")(ROWS)["attention_mask"]
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.float32
    allowed = t(
        [
            [
                [1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 1, 0, 0],
                [0, 0, 0, 1, 0],
                [0, 0, 0, 1, 1],
            ],
            [  # row 2: the document, then the padding as its own causal block
                [1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 1, 1, 1],
            ],
        ]
    )[:, None].bool()
    assert torch.equal(mask, torch.where(allowed, 0.0, NEG))
    # Every query attends to at least itself, so softmax never sees a fully blocked row.
    assert (mask.diagonal(dim1=-2, dim2=-1) == 0).all()


def test_mask4d_dtype_follows_mask_dtype() -> None:
    for dtype in ("bfloat16", torch.bfloat16, "torch.float16"):
        mask = PackedCollator(mode="mask4d", mask_dtype=dtype)(ROWS)["attention_mask"]
        expected = torch.bfloat16 if "bfloat16" in str(dtype) else torch.float16
        assert mask.dtype == expected
        assert mask.min() == torch.finfo(expected).min and mask.max() == 0
    with pytest.raises(ValueError, match="mask_dtype"):
        PackedCollator(mode="mask4d", mask_dtype="int32")(ROWS)


def test_block_causal_mask_helper_equals_collator_mask() -> None:
    segments = t([[1, 1, 1, 2, 2], [1, 1, 2, 2, 2]], torch.int32)
    assert torch.equal(
        block_causal_mask(segments), PackedCollator(mode="mask4d")(ROWS)["attention_mask"]
    )


@pytest.mark.parametrize("mode", ["position_ids", "mask4d"])
def test_pad_to_multiple_of(mode: str) -> None:
    batch = PackedCollator(mode=mode, pad_token_id=9, pad_to_multiple_of=4)(ROWS)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0].tolist() == [11, 12, 13, 21, 22, 9, 9, 9]
    assert batch["labels"][0, 5:].tolist() == [-100] * 3
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    if mode == "mask4d":
        assert batch["attention_mask"].shape == (2, 1, 8, 8)


def test_padded_positions_are_read_by_transformers_as_our_segments() -> None:
    """transformers' find_packed_sequence_indices (what sdpa/eager use when there is no
    attention_mask) recovers exactly our segments, padding included, from our position_ids."""
    from transformers.masking_utils import find_packed_sequence_indices

    rows = [*ROWS, {"input_ids": [1, 2, 3, 4], "seq_lengths": [1, 1, 2]}]
    batch = PackedCollator(mode="position_ids", return_seq_idx=True)(rows)
    found = find_packed_sequence_indices(batch["position_ids"])
    assert torch.equal(found, batch["seq_idx"].long())


# --- labels and inputs ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["flash", "position_ids", "mask4d"])
def test_stored_labels_are_used_and_boundaries_masked(mode: str) -> None:
    rows = [
        {"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2], "labels": [-100, -100, 3, 4, 5]},
        {"input_ids": [6, 7], "seq_lengths": [2], "labels": [6, -100]},
    ]
    labels = PackedCollator(mode=mode)(rows)["labels"]
    if mode == "flash":
        assert labels.tolist() == [[-100, -100, 3, -100, 5, -100, -100]]
    else:
        assert labels.tolist() == [[-100, -100, 3, -100, 5], [-100, -100, -100, -100, -100]]
    assert rows[0]["labels"] == [-100, -100, 3, 4, 5]  # the input row is not modified


@pytest.mark.parametrize("mode", ["flash", "position_ids", "mask4d"])
def test_rows_as_numpy_or_torch_or_segment_ids_only(mode: str) -> None:
    collate = PackedCollator(mode=mode, return_seq_idx=True)
    expected = collate(ROWS)
    as_numpy = [{k: np.asarray(v, dtype=np.int32) for k, v in r.items()} for r in ROWS]
    as_torch = [{k: torch.tensor(v) for k, v in r.items()} for r in ROWS]
    segment_ids_only = [{k: v for k, v in r.items() if k != "seq_lengths"} for r in ROWS]
    for rows in (as_numpy, as_torch, segment_ids_only):
        got = collate(rows)
        assert got.keys() == expected.keys()
        for key in expected:
            if isinstance(expected[key], torch.Tensor):
                assert torch.equal(got[key], expected[key]), key
                assert got[key].dtype == expected[key].dtype, key
            else:
                assert got[key] == expected[key]


def test_errors_say_what_is_wrong() -> None:
    collate = PackedCollator(mode="position_ids")
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        collate([{"input_ids": [1, 2, 3]}])  # what Trainer hands over when it drops columns
    with pytest.raises(ValueError, match="sum to 4 but the row has 3"):
        collate([{"input_ids": [1, 2, 3], "seq_lengths": [2, 2]}])
    # ... and names the usual cause: a trainer's truncation (TRL cuts rows to 1024 by default).
    with pytest.raises(ValueError, match=r"SFTConfig\(max_length=None\)"):
        collate([{"input_ids": [1, 2, 3], "seq_lengths": [2, 2]}])
    with pytest.raises(ValueError, match="must be positive"):
        collate([{"input_ids": [1, 2], "seq_lengths": [2, 0]}])
    with pytest.raises(ValueError, match="labels has 1 entries"):
        collate([{"input_ids": [1, 2], "seq_lengths": [2], "labels": [1]}])
    with pytest.raises(ValueError, match="non-empty"):
        collate([{"input_ids": [], "seq_lengths": []}])
    with pytest.raises(ValueError, match="empty batch"):
        collate([])
    with pytest.raises(ValueError, match="mode must be one of"):
        PackedCollator(mode="sdpa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PackedCollator(mode="flash", pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="pad_token_id"):
        PackedCollator(mode="flash", pad_token_id=-1)
