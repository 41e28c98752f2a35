"""The tiny randomly initialised Llama every training proof runs (one definition)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# What the packed-vs-unpacked proofs share: the model's vocabulary, the attention
# implementations and collator modes they run over, the tolerances (logits, loss, gradients)
# and how far a negative control must differ (100x the logits' tolerance).
VOCAB = 97
IMPLS = ["sdpa", "eager"]
MODES = ["flash", "position_ids", "mask4d"]
TOL = 1e-4  # logits, absolute
LOSS_TOL = 1e-5  # a float32 mean of ~1000 losses near 6 is good to ~1e-6
GRAD_RTOL = 1e-4
MARGIN = 1e-2


def tiny_llama(
    vocab_size: int,
    impl: str = "sdpa",
    *,
    seed: int = 0,
    max_positions: int = 256,
    initializer_range: float = 0.2,
    train: bool = False,
) -> LlamaForCausalLM:
    """Seeded, float32. ``initializer_range`` 0.2 (not 0.02) gives logits of order 1-5, so
    tight tolerances mean something and the negative controls differ clearly."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model = model.train() if train else model.eval()
    model.set_attn_implementation(impl)
    return model
