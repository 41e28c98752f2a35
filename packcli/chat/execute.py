"""Compile a chat template in the sandbox, and run it under a meter.

Why a step of its own: compiling is where templates are refused before any dialogue
(``{% include %}`` and friends, ``{% generation %}`` blocks whose position jinja buffers),
and running is where whatever a template does wrong becomes one message: a budget or the
sandbox broken is the template's fault (``ChatTemplateError``, the run stops), a template
failing on one dialogue is that line's (``ChatFormatError``, the bad-line policy applies).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.runtime import Context

from packcli.chat.budget import METER, BudgetExceeded, Meter, Span
from packcli.chat.errors import ChatFormatError, ChatTemplateError
from packcli.chat.sandbox import ENV, Guard, TemplateRaised

_FORBIDDEN = {
    nodes.Include: "{% include %}",
    nodes.Import: "{% import %}",
    nodes.FromImport: "{% from ... import %}",
    nodes.Extends: "{% extends %}",
}
_BUFFERED = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock, nodes.For)


def _is_generation(node: nodes.Node) -> bool:
    return (
        isinstance(node, nodes.CallBlock)
        and isinstance(node.call.node, nodes.ExtensionAttribute)
        and node.call.node.name == "_generation"
    )


@dataclass(frozen=True)
class Compiled:
    template: jinja2.Template
    has_generation: bool
    deterministic: bool  # same variables, same output (no ``random`` filter)
    # The names of the template's globals, as jinja's ``Template.new_context`` gives every
    # context: found once here (listing a ChainMap's keys costs ~1 us a render).
    globals_keys: frozenset[str] = frozenset()

    def new_context(self, parent: dict[str, Any]) -> Context:
        """``template.new_context(parent, shared=True)``, with the globals' names made once."""
        template = self.template
        context = template.environment.context_class(
            template.environment, parent, template.name, template.blocks
        )
        context.globals_keys = set(self.globals_keys)
        return context


@lru_cache(maxsize=64)
def compile_template(text: str, source: str) -> Compiled:
    try:
        tree = ENV.parse(text)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template ({source}) has a syntax error on line {exc.lineno}: {exc.message}"
        ) from None
    for kind, tag in _FORBIDDEN.items():
        if next(tree.find_all(kind), None) is not None:
            raise ChatTemplateError(
                f"chat template ({source}) uses {tag}: chat templates must be self-contained"
            )
    for outer in tree.find_all(_BUFFERED):
        if isinstance(outer, nodes.For) and not outer.recursive:
            continue
        if any(_is_generation(inner) for inner in outer.find_all(nodes.CallBlock)):
            raise ChatTemplateError(
                f"chat template ({source}) has a {{% generation %}} block inside a macro, a "
                "set/filter/call block or a recursive loop; put it at the top level"
            )
    has_generation = any(_is_generation(node) for node in tree.find_all(nodes.CallBlock))
    deterministic = all(node.name != "random" for node in tree.find_all(nodes.Filter))
    guarded = Guard(ENV).visit(tree)
    try:
        template = ENV.from_string(guarded)
    except TemplateError as exc:  # pragma: no cover - the parse above catches syntax errors
        raise ChatTemplateError(f"chat template ({source}) does not compile: {exc}") from None
    return Compiled(template, has_generation, deterministic, frozenset(template.globals))


def count_input_chars(messages: Sequence[Mapping[str, Any]], variables: Mapping[str, Any]) -> int:
    total = 0
    for value in (*messages, variables):
        for item in value.values():
            total += len(item) if isinstance(item, str) else len(str(item))
    return total


def run_compiled(
    compiled: Compiled, source: str, parent: dict[str, Any], meter: Meter
) -> tuple[str, list[Span]]:
    """Render with ``parent`` (the template's globals and the variables, merged) under
    ``meter``: jinja's ``generate`` less its per-call copies, and its traceback rewriting,
    which only changes tracebacks that are turned into messages here anyway."""
    input_chars = meter.input_chars
    token = METER.set(meter)
    try:
        template = compiled.template
        chunks = template.root_render_func(compiled.new_context(parent))
        if not compiled.has_generation:  # only {% generation %} reads meter.emitted
            return "".join(chunks), meter.generation
        parts = []
        for chunk in chunks:
            meter.emitted += len(chunk)
            parts.append(chunk)
        return "".join(parts), meter.generation
    except BudgetExceeded as exc:
        where = f"chat template ({source})"
        raise ChatTemplateError(
            f"{where} {exc} on a dialogue of {input_chars:,} characters: it loops without "
            "end or is hostile (budgets: packcli.chat.RenderLimits)"
        ) from None
    except SecurityError as exc:
        where = f"chat template ({source})"
        raise ChatTemplateError(f"{where} broke the sandbox: {exc}") from None
    except RecursionError:
        where = f"chat template ({source})"
        raise ChatTemplateError(f"{where} recursed too deeply") from None
    except MemoryError:
        where = f"chat template ({source})"
        raise ChatTemplateError(f"{where} ran out of memory") from None
    except TemplateRaised as exc:
        raise ChatFormatError(f"the chat template rejected the dialogue: {exc.message}") from None
    except (ChatFormatError, ChatTemplateError):
        raise
    except TemplateError as exc:
        raise ChatFormatError(f"the chat template failed on this dialogue: {exc}") from None
    except Exception as exc:  # a template bug on this data (TypeError, ValueError...)
        raise ChatFormatError(
            f"the chat template failed on this dialogue: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        METER.reset(token)
