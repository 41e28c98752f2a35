"""The budgets a chat template renders under, and the meter that spends them.

Why budgets: a template from the Hub is code, and the sandbox alone stops escapes, not
endless loops or huge strings. Every loop iteration, call, lookup, operator and filter is
one step; the characters a template builds and writes are counted. The budgets are
deterministic and grow with the dialogue's size (``RenderLimits``), so long dialogues are
not refused; a wall-clock limit, checked every 17 steps, backs them up. One ``Meter`` per
render, found by the sandbox's hooks through a context variable (``METER``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.runtime import LoopContext
from jinja2.utils import Namespace

Span = tuple[int, int]  # a character range [start, end) of the rendered text


@dataclass(frozen=True)
class RenderLimits:
    """Budgets for rendering one dialogue; each is a base plus an allowance per character of
    the dialogue (message contents and other values), so long dialogues are not refused.

    ``steps``: loop iterations, calls, lookups, operators and filters. ``output``: characters
    written (nested macro/``set`` buffers count each time). ``work``: characters (and list
    items) built by operations, a bound on memory and time; no single value may exceed the
    output budget. ``seconds``: wall clock, a backstop checked at every step.
    """

    steps: int = 500_000
    steps_per_char: int = 64
    output: int = 1 << 20
    output_per_char: int = 8
    work: int = 8 << 20
    work_per_char: int = 64
    seconds: float = 5.0


DEFAULT_LIMITS = RenderLimits()


_SCALARS = (str, int, float, bool, type(None))
_SIZED = (str, list, tuple, dict, set, frozenset)
# No chat template needs bytes, and every bytes operation (repetition, join, center, replace,
# decode...) would need its own size check: refusing the type closes them all at once.
BINARY = (bytes, bytearray, memoryview)
NO_BYTES = "bytes are not allowed in chat templates"


class BudgetExceeded(Exception):
    """Raised inside a render when a budget runs out; never caught by templates or jinja."""


class Meter:
    """The budgets of the render in progress (one per render, found through ``METER``).

    The hot hooks (``call_binop``, ``getitem``, ``getattr``, ``sandbox._out``) inline ``tick`` and
    ``build`` as ``steps_left -= 1; if steps_left < next_check: meter.checkpoint()``: one
    comparison per step covers both the step budget and the every-17-steps look at the clock.
    """

    __slots__ = (
        "budget_dependent",
        "deadline",
        "emitted",
        "generation",
        "input_chars",
        "limits",
        "next_check",
        "now",
        "output_left",
        "steps_left",
        "value_limit",
        "work_left",
    )

    def __init__(self, limits: RenderLimits, input_chars: int, now: datetime | None) -> None:
        self.limits = limits
        self.input_chars = input_chars
        self.steps_left = limits.steps + limits.steps_per_char * input_chars
        self.output_left = limits.output + limits.output_per_char * input_chars
        self.work_left = limits.work + limits.work_per_char * input_chars
        self.value_limit = self.output_left
        self.deadline = time.monotonic() + limits.seconds
        # ``checkpoint`` runs once ``steps_left`` drops below this: at the first step (a first
        # look at the clock), then every 17 steps, and at the latest when the budget is spent.
        self.next_check = self.steps_left
        self.now = now
        self.emitted = 0  # characters the top-level render has yielded so far
        self.generation: list[Span] = []
        # Set when a check passed on a partial measure that the budgets cut short: larger
        # budgets could then change the outcome (see packcli.chat.renderer._Renderer.marked).
        self.budget_dependent = False

    def tick(self, n: int = 1) -> None:
        self.steps_left -= n
        if self.steps_left < self.next_check:
            self.checkpoint()

    def checkpoint(self) -> None:
        """The slow half of ``tick``: the step budget, then the clock (every 17 steps: each
        step is bounded by the value limit)."""
        if self.steps_left < 0:
            budget = self.limits.steps + self.limits.steps_per_char * self.input_chars
            raise BudgetExceeded(f"ran more than {budget:,} operations")
        self.next_check = max(self.steps_left - 16, 0)
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"ran longer than {self.limits.seconds:g} s")

    def reserve(self, size: int) -> None:
        """Refuse, before it is built, a value of ``size`` characters or items."""
        if size > self.value_limit:
            self.too_big(size)

    def build(self, size: int) -> None:
        if size > self.value_limit:
            self.too_big(size)
        self.work_left -= size
        if self.work_left < 0:
            self.overworked()

    def write(self, size: int) -> None:
        self.output_left -= size
        if self.output_left < 0:
            self.overwritten()

    # The errors, apart so that the hooks that inline the checks raise the same ones.
    def too_big(self, size: int) -> None:
        raise BudgetExceeded(
            f"tried to build a value of {size:,} characters (limit {self.value_limit:,})"
        )

    def overworked(self) -> None:
        budget = self.limits.work + self.limits.work_per_char * self.input_chars
        raise BudgetExceeded(f"built more than {budget:,} characters in total")

    def overwritten(self) -> None:
        raise BudgetExceeded(f"wrote more than {self.value_limit:,} characters")

    def stringable(self, value: object) -> None:
        """Before ``str(value)`` of a container: refuse one that would expand into a huge
        string (``[[big] * 1000] * 1000`` holds few objects but prints gigabytes)."""
        if not isinstance(value, _SCALARS):
            size, visited = deep_size(value, self.value_limit, max(self.steps_left, 0))
            self.tick(visited)
            self.reserve(size)

    def produced(self, value: Any) -> Any:
        """Account for the result of an operation; iterators are counted as they are consumed."""
        if isinstance(value, BINARY):
            raise SecurityError(NO_BYTES)
        if isinstance(value, _SIZED):
            self.build(len(value))
        elif hasattr(value, "__next__") and not isinstance(value, LoopContext):
            return counted(value, self)
        return value


METER: ContextVar[Meter | None] = ContextVar("packcli_chat_meter", default=None)
_current = METER.get  # the hooks' one lookup of the meter (a C call, no Python frame)
OUTSIDE = "packcli chat templates can only run inside chat.render"


def active_meter() -> Meter:
    meter = _current()
    if meter is None:
        # Also stops jinja from folding guarded filters into constants at compile time.
        raise RuntimeError(OUTSIDE)
    return meter


_SEQUENCES = (list, tuple, set, frozenset)


def deep_size(value: object, limit: int, max_visits: int) -> tuple[int, int]:
    """Characters ``value`` holds counting every reference (so aliasing is counted in full),
    and the objects visited; stops once past ``limit`` or ``max_visits`` (cycles end too)."""
    total = visited = 0
    stack = [value]
    while stack and total <= limit and visited <= max_visits:
        item = stack.pop()
        visited += 1
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, _SEQUENCES):
            total += len(item) + 2
            stack.extend(item)
        elif isinstance(item, Namespace):
            total += 16
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
        else:
            total += 8
    return total, visited


def counted(items: Iterable[Any], meter: Meter) -> Iterator[Any]:
    for item in items:
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        yield item


class CountedIterable:
    """What a ``{% for %}`` loop iterates: one step per item; keeps ``len`` for ``loop.length``."""

    __slots__ = ("_items",)

    def __init__(self, items: Any) -> None:
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return counted(self._items, active_meter())

    def __len__(self) -> int:
        return len(self._items)  # TypeError for generators: LoopContext then lists them
