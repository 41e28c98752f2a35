"""transformers' own flash-attention dispatch, run on CPU with plain-torch kernels.

flash-attn needs a GPU. What decides whether a packed batch is separated on flash-attention
is not the kernel but transformers' dispatch (``_flash_attention_forward``: varlen when
``cu_seq_lens`` are given, varlen from ``position_ids`` only for batch size 1, plain causal
otherwise; ``flash_attention_mask`` drops the packed-sequence mask). This registers an
attention implementation that runs that very dispatch with reference kernels computing what
``flash_attn_func`` / ``flash_attn_varlen_func`` compute, so the tests see what a flash model
would see.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
import transformers.modeling_flash_attention_utils as fa_utils
from transformers import AttentionInterface
from transformers.integrations.flash_attention import flash_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

# No "flash" in the name: transformers would look for a flash-attn package for it.
NAME = "packcli_fa_dispatch_reference"


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Causal attention of ``[seq, heads, dim]`` tensors, grouped heads repeated."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale
    )
    return out.transpose(0, 1)


def flash_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
    causal: bool = True,
) -> torch.Tensor:  # fmt: skip
    """``flash_attn_func``: ``[batch, seq, heads, dim]``, causal within each row."""
    assert causal
    return torch.stack([_attend(q[b], k[b], v[b], softmax_scale) for b in range(q.shape[0])])


def flash_varlen_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    softmax_scale: float | None = None, causal: bool = True,
) -> torch.Tensor:  # fmt: skip
    """``flash_attn_varlen_func``: ``[total, heads, dim]``, causal within each cu block."""
    assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k)
    cu = cu_seqlens_q.tolist()
    blocks = [_attend(q[a:b], k[a:b], v[a:b], softmax_scale) for a, b in itertools.pairwise(cu)]
    return torch.cat(blocks)


def _imports(*_: Any, **__: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    process = fa_utils._lazy_define_process_function(flash_varlen_fn)
    kernels = (flash_fn, flash_varlen_fn, None, fa_utils._pad_input, fa_utils._unpad_input)
    return kernels, (process, dict)


@contextmanager
def reference_flash() -> Iterator[str]:
    """Within the block, ``model.set_attn_implementation(NAME)`` runs transformers' flash
    path on the reference kernels; yields ``NAME``."""
    AttentionInterface.register(NAME, flash_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
    saved = fa_utils.lazy_import_flash_attention
    fa_utils.lazy_import_flash_attention = _imports
    try:
        yield NAME
    finally:
        fa_utils.lazy_import_flash_attention = saved
