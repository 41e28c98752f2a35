"""Public path of the two-tier planner: it lives in ``packcli/pack/plan.py`` (the pack stage),
which decides the tier of each document."""

from packcli.pack.plan import Plan, RowLayout, plan_two_tier

__all__ = ["Plan", "RowLayout", "plan_two_tier"]
