"""The planner's settings (``plan:`` of a config file, ``--short-len`` and the other plan flags).

Apart from ``config.py``, which reads YAML and knows every stage, so that the planner
(``plan.py``) stays pure: it imports these settings and nothing that reads files.
``packcli.config.PlanConfig`` re-exports the class.
"""

from __future__ import annotations

from dataclasses import dataclass

from packcli.errors import ConfigError, require_one_of
from packcli.names import BALANCE_MODES, OVERLONG_POLICIES, PLAN_ALGORITHMS, one_of

# The planner's time and memory grow with the row capacity (its structures are indexed by
# free room): 2**24 adds ~2 s and ~130 MB to planning 74 documents; 2**27 added ~26 s and
# 1 GB; 2**31 - 1 took 101 s for 300 documents.
MAX_LONG_LEN = 1 << 24
MAX_SEED = 2**63 - 1
# Context-parallel degrees beyond this are no training setup we know of (a 2**24-token row
# split 2 * 1024 ways is 8k tokens a rank); the bound keeps a typo from padding every row away.
MAX_CP_SIZE = 1024
# The default target of real tokens per optimizer step (``--tokens-per-step``): ~1M is a
# common pretraining/SFT step; any other target is one ``packcli.publish.steps.plan_steps``
# call away.
TOKENS_PER_STEP = 1 << 20


@dataclass(frozen=True)
class PlanConfig:
    short_len: int = 4096
    long_len: int = 131072
    overlong: str = "split"
    algorithm: str = "bfd"
    seed: int = 0
    balance: str = "none"  # none | attention (see packcli/pack/balance.py)
    # Tokens per group of token shards planned (and written) on its own (packcli/pack/groups.py)
    group_tokens: int = 1 << 28
    # Context-parallel degree the rows are made for: every segment is padded to a multiple
    # of 2 * cp_size (Transformer Engine's THD layout splits each sequence into 2 * cp
    # chunks); 1 = no padding, the rows of every earlier version.
    cp_size: int = 1
    # Real tokens per optimizer step (``--tokens-per-step``): a mixture's rows are ordered so
    # that every window of one step holds each source near its share, and the report's step
    # plan aims at it. A plain corpus's rows do not depend on it (not in its fingerprint).
    tokens_per_step: int = TOKENS_PER_STEP

    @property
    def pad_multiple(self) -> int:
        """Every segment's stored length is a multiple of this (1: segments as they are)."""
        return 2 * self.cp_size if self.cp_size > 1 else 1

    def __post_init__(self) -> None:
        if self.balance not in BALANCE_MODES:
            raise ConfigError(f"plan.balance must be {one_of(BALANCE_MODES)}, got {self.balance!r}")
        if self.short_len < 1:
            raise ConfigError(f"plan.short_len must be >= 1, got {self.short_len}")
        if self.long_len <= self.short_len:
            raise ConfigError(
                "tiers must be increasing: short_len < long_len, got "
                f"short_len={self.short_len}, long_len={self.long_len}"
            )
        if self.long_len > MAX_LONG_LEN:
            raise ConfigError(
                f"plan.long_len must be at most {MAX_LONG_LEN} (2**24; planning time and memory "
                f"grow with the row capacity), got {self.long_len}"
            )
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"plan.seed must be in 0..{MAX_SEED}, got {self.seed}")
        if self.tokens_per_step < 1:
            raise ConfigError(f"plan.tokens_per_step must be >= 1, got {self.tokens_per_step}")
        if self.group_tokens < 1:
            raise ConfigError(f"plan.group_tokens must be >= 1, got {self.group_tokens}")
        if not 1 <= self.cp_size <= MAX_CP_SIZE:
            raise ConfigError(
                f"plan.cp_size must be in 1..{MAX_CP_SIZE} (1 = no context-parallel padding), "
                f"got {self.cp_size}"
            )
        m = self.pad_multiple
        if self.short_len % m or self.long_len % m:
            raise ConfigError(
                f"plan.cp_size {self.cp_size} pads every segment to a multiple of {m}, so "
                f"short_len and long_len must be multiples of {m} too (a padded row must still "
                f"fit), got short_len={self.short_len}, long_len={self.long_len}"
            )
        require_one_of("plan.overlong", self.overlong, OVERLONG_POLICIES)
        require_one_of("plan.algorithm", self.algorithm, PLAN_ALGORITHMS)
