"""Dialogues in, rendered text with its assistant spans out: the chat stage's render step.

Why a renderer object per batch: compiling the template, merging its globals with the
variables and finding its turn markers are done once for a batch, not per dialogue. A
template without generation tags needs a second, sentinel rendering per dialogue
(``packcli.chat.spans``); dialogues of one shape (the same roles and other fields, in the
same order) share it within a batch, where their budgets allow (``_Renderer.marked``).
``render_batch`` is also what the rendering worker processes run
(``packcli.chat.render_pool``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tokenizers import Tokenizer

from packcli.chat.budget import DEFAULT_LIMITS, Meter, RenderLimits, Span
from packcli.chat.errors import ChatFormatError
from packcli.chat.execute import compile_template, count_input_chars, run_compiled
from packcli.chat.markers import TurnMarkers, turn_markers
from packcli.chat.spans import located_spans
from packcli.chat.templates import ChatTemplate


@dataclass(frozen=True)
class Rendered:
    text: str
    assistant_spans: list[Span]  # trained character span of each assistant turn, in order
    generation_spans: list[Span] | None  # the template's {% generation %} blocks, or None


_MAX_SHAPES = 1024  # sentinel renderings kept per batch


_Shape = tuple[tuple[tuple[str, str], ...], ...]  # each message's (key, value) pairs


def _shape(messages: Sequence[Mapping[str, Any]]) -> _Shape | None:
    """All the template sees of sentinel messages, as a key; None unless every message is
    a dict of strings (what other values do inside a template is not worth predicting)."""
    shape: list[tuple[tuple[str, str], ...]] = []
    for message in messages:
        if type(message) is not dict:
            return None
        items = tuple(message.items())
        for key, value in items:
            if type(key) is not str or type(value) is not str:  # exact: Markup behaves apart
                return None
        shape.append(items)
    return tuple(shape)


class _Renderer:
    """What rendering with one template and one set of variables needs, made once for a
    batch of dialogues: the compiled template, the variables merged with its globals, their
    size, and the turn markers (looked up when first needed, as a per-dialogue call would)."""

    def __init__(
        self,
        template: ChatTemplate,
        variables: Mapping[str, Any] | None,
        bos_token: str,
        eos_token: str,
        control_tokens: Collection[str],
        *,
        limits: RenderLimits,
        now: datetime | None,
        add_generation_prompt: bool,
    ) -> None:
        self.template = template
        self.compiled = compile_template(template.text, template.source)
        context: dict[str, Any] = {"tools": None, "documents": None, **(variables or {})}
        context.update(
            add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
        )
        # jinja's generate(**context) merges the globals under the variables, per render.
        self.parent = dict(self.compiled.template.globals, **context)
        self.variable_chars = count_input_chars((), variables or {})
        self.bos_token, self.eos_token = bos_token, eos_token
        self.control_tokens = control_tokens
        self.limits, self.now = limits, now
        self._markers: TurnMarkers | None = None
        # Sentinel renderings by dialogue shape (see ``marked``); none where the output could
        # change between two renders of the same variables (the clock, ``random``) or budgets
        # could shrink as dialogues grow.
        growing = min(limits.steps_per_char, limits.work_per_char, limits.output_per_char) >= 0
        shareable = now is not None and self.compiled.deterministic and growing
        self._marked: dict[_Shape, tuple[int, str | None]] | None = {} if shareable else None

    def run(
        self, messages: Sequence[Mapping[str, Any]], input_chars: int, meter: Meter | None = None
    ) -> tuple[str, list[Span]]:
        parent = self.parent.copy()
        parent["messages"] = messages
        if meter is None:
            meter = Meter(self.limits, input_chars, self.now)
        return run_compiled(self.compiled, self.template.source, parent, meter)

    def marked(self, sentinels: list[Mapping[str, Any]], input_chars: int) -> str | None:
        """The sentinel rendering of a dialogue (None: the template refused the sentinels).

        It depends on the messages' roles and other fields but not on their contents, so
        dialogues of the same shape share it: a batch holds a few shapes, so most dialogues
        of a template without generation tags render once instead of twice. Budgets are what
        could tell two such dialogues apart, and they only grow with the input: a rendering
        made under the budgets of ``n`` input characters (and none of whose checks passed on
        a measure the budgets cut short) is what a dialogue of ``n`` or more characters would
        render, or be refused, identically. A smaller dialogue renders its own.
        """
        cache = self._marked
        shape = _shape(sentinels) if cache is not None else None
        if cache is not None and shape is not None:
            known = cache.get(shape)
            if known is not None and known[0] <= input_chars:
                return known[1]
        meter = Meter(self.limits, input_chars, self.now)
        try:
            marked: str | None = self.run(sentinels, input_chars, meter)[0]
        except ChatFormatError:  # the template refused the sentinels (it checks contents)
            marked = None
        if cache is not None and shape is not None and not meter.budget_dependent:
            known = cache.get(shape)
            if (known is None and len(cache) < _MAX_SHAPES) or (
                known is not None and input_chars < known[0]
            ):
                cache[shape] = (input_chars, marked)
        return marked

    def render(self, messages: Sequence[Mapping[str, Any]]) -> Rendered:
        input_chars = count_input_chars(messages, {}) + self.variable_chars
        text, generation = self.run(messages, input_chars)
        if self.compiled.has_generation:
            return Rendered(text, [s for s in generation if s[1] > s[0]], generation)
        if self._markers is None:
            self._markers = turn_markers(
                self.template,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                control_tokens=self.control_tokens,
            )
        spans = located_spans(self.marked, messages, text, self._markers, input_chars)
        return Rendered(text, spans, None)


def render(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    bos_token: str = "",
    eos_token: str = "",
    control_tokens: Collection[str] = (),
    variables: Mapping[str, Any] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
) -> Rendered:
    """Render one dialogue in the sandbox and find its assistant turns.

    ``variables``: extra template variables (other special tokens, ``tools``,
    ``date_string``...); ``tools`` and ``documents`` default to None as in transformers.
    ``control_tokens``: the tokenizer's added tokens, to recognise the end-of-turn marker
    when the template has no generation tags. ``now``: what ``strftime_now`` formats (pin it
    for reproducible output; default: the current time, as transformers does).
    ``assistant_spans`` are the non-empty generation blocks when the template has them.
    """
    renderer = _Renderer(
        template, variables, bos_token, eos_token, control_tokens,
        limits=limits, now=now, add_generation_prompt=add_generation_prompt,
    )  # fmt: skip
    return renderer.render(messages)


def control_tokens_of(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The tokenizer's added tokens: the candidates for the end-of-turn marker."""
    return tuple(sorted(t.content for t in tokenizer.get_added_tokens_decoder().values()))


def render_dialogues(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    dialogues: Sequence[Sequence[Mapping[str, Any]]],
    special_tokens: Mapping[str, str] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
    on_error: Callable[[int, ChatFormatError], None] | None = None,
    add_generation_prompt: bool = False,
) -> list[tuple[int, Rendered]]:
    """``(index, Rendered)`` of each dialogue, with the tokenizer's special tokens as template
    variables. A dialogue the template rejects raises ``ChatFormatError`` with ``index`` set,
    or, given ``on_error``, is reported to it and left out (a skip policy).
    ``add_generation_prompt``: render prompts (preference pairs) as a model would see them."""
    return render_batch(
        template,
        dialogues,
        special_tokens or {},
        control_tokens_of(tokenizer),
        limits=limits,
        now=now,
        on_error=on_error,
        add_generation_prompt=add_generation_prompt,
    )


def render_batch(
    template: ChatTemplate,
    dialogues: Sequence[Sequence[Mapping[str, Any]]],
    special_tokens: Mapping[str, str],
    controls: Collection[str],
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
    on_error: Callable[[int, ChatFormatError], None] | None = None,
    add_generation_prompt: bool = False,
) -> list[tuple[int, Rendered]]:
    """``render_dialogues`` with the tokenizer's control tokens given: what a rendering
    worker process runs (``packcli.chat.render_pool``), without a tokenizer."""
    variables = dict(special_tokens)
    bos, eos = variables.pop("bos_token", ""), variables.pop("eos_token", "")
    rendered: list[tuple[int, Rendered]] = []
    if not dialogues:
        return rendered
    renderer = _Renderer(  # once for the batch, not once per dialogue
        template, variables, bos, eos, controls,
        limits=limits, now=now, add_generation_prompt=add_generation_prompt,
    )  # fmt: skip
    for index, messages in enumerate(dialogues):
        try:
            rendered.append((index, renderer.render(messages)))
        except ChatFormatError as exc:
            exc.index = index
            if on_error is None:
                raise
            on_error(index, exc)
    return rendered
