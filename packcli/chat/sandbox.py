"""The jinja2 environment chat templates run in: sandboxed, and metered at every step.

Untrusted templates: a template from the Hub is code. It runs in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute escapes, no mutation, no file access: there is
no loader and ``include``/``import``/``extends`` are refused at compile time,
``packcli.chat.execute``) and under a budget (``packcli.chat.budget``): every loop iteration,
call, lookup, operator and filter is one step; the characters a template builds and writes
are counted, and operations that could build a huge value in one call are checked before
they run (``packcli.chat.size_checks``). Bytes cannot be made at all (``str.encode``,
``int.to_bytes`` are refused: no chat template needs them, and each bytes method would need
its own check), nor can ``pprint`` be used (its indentation is unbounded). A hostile template
therefore fails fast with ``ChatTemplateError`` instead of hanging the job or eating the
machine's memory.

The hooks run for every step of every render, so the common cases (``str + str``,
``message['role']``, ``loop.index``, output) take shortcuts; the meter counts every step and
character as the generic path would, so the smallest budgets that render a dialogue do not
depend on the shortcuts (``scripts/bench_render.py --budgets`` checks it).
"""

from __future__ import annotations

import json
from datetime import datetime
from types import MethodType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, missing
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from packcli.chat.budget import (
    BINARY,
    METER,
    NO_BYTES,
    OUTSIDE,
    BudgetExceeded,
    CountedIterable,
    Meter,
    active_meter,
)
from packcli.chat.size_checks import as_int, check_percent, check_str_method, guard_filter

_current = METER.get  # the hooks' one lookup of the meter (a C call, no Python frame)

_MAX_INT_BITS = 1 << 16  # integers a template may build (2**65536 is ~20k digits)
_MAX_INDENT = 64  # tojson indent / separators length
_MACRO_STEPS = 16


# Methods refused before they run: they make bytes, or integers past _MAX_INT_BITS.
_REFUSED_METHODS = {str: frozenset({"encode"}), int: frozenset({"to_bytes", "from_bytes"})}


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: no HTML escaping, and its options (kept small here)."""
    if (len(indent) if isinstance(indent, str) else as_int(indent)) > _MAX_INDENT:
        raise SecurityError(f"tojson indent beyond {_MAX_INDENT} is not allowed in chat templates")
    if separators is not None and sum(len(str(s)) for s in separators) > _MAX_INDENT:
        raise SecurityError("tojson separators this long are not allowed in chat templates")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class TemplateRaised(TemplateError):
    """``raise_exception(...)`` in a template: the template refuses this dialogue."""


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    meter = active_meter()
    return (meter.now or datetime.now()).strftime(str(fmt))


class _TemplateDict:
    """``dict`` for templates without the type itself (as transformers does)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """``namespace`` that refuses underscore attributes (as transformers does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


class _GenerationTags(Extension):
    """``{% generation %}...{% endgeneration %}``: record where the block lands in the output.

    Same semantics as transformers' AssistantTracker: the span starts at the number of
    characters the top-level render has yielded so far. That is only right at the top level,
    so ``compile_template`` refuses blocks inside macros, ``set``/``filter``/``call`` blocks and
    recursive loops, whose output is buffered.
    """

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API

    def parse(self, parser: jinja2.parser.Parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = nodes.CallBlock(self.call_method("_generation"), [], [], body)
        block.set_lineno(lineno)  # in place (it returns the node as a plain Node)
        return block

    def _generation(self, caller: Any) -> str:
        text = _block_text(caller)
        meter = active_meter()
        meter.generation.append((meter.emitted, meter.emitted + len(text)))
        return text


def _block_text(caller: Any) -> str:
    """What ``caller()`` returns for a block's body: jinja's ``Macro.__call__`` less its
    argument matching, which a body without arguments (every ``{% generation %}`` block's)
    does not need; it was ~15% of rendering a dialogue. Anything else goes through it."""
    if (
        type(caller) is Macro
        and not caller.arguments
        and not (caller.caller or caller.catch_kwargs or caller.catch_varargs)
        and not caller._environment.is_async
    ):
        text: str = caller._func()
        return Markup(text) if caller._default_autoescape else text
    body: str = caller()
    return body


def _out(value: Any) -> str:
    """Every piece of output (literal text and ``{{ }}``) passes here to be counted."""
    meter = _current()
    if meter is None:
        raise RuntimeError(OUTSIDE)  # also keeps jinja from folding it at compile time
    meter.steps_left -= 1  # meter.tick(), inlined: the hottest hook
    if meter.steps_left < meter.next_check:
        meter.checkpoint()
    if isinstance(value, str):
        text = value
    else:
        meter.stringable(value)
        text = str(value)
    meter.output_left -= len(text)  # meter.write(len(text)), inlined
    if meter.output_left < 0:
        meter.overwritten()
    return text


def _concat(parts: list[Any]) -> str:
    """The ``~`` operator, size-checked before the join."""
    meter = active_meter()
    meter.tick()
    for part in parts:
        if not isinstance(part, str):
            meter.stringable(part)
    pieces = [str(part) for part in parts]
    meter.build(sum(map(len, pieces)))
    return "".join(pieces)


def _for_items(items: Any) -> CountedIterable:
    active_meter()
    return CountedIterable(items)


class _SandboxEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Fail loudly at once (jinja's default renders an unsafe attribute as "").
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        meter = _current()
        if meter is None:
            raise RuntimeError(OUTSIDE)
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        if operator == "+":
            kinds = (type(left), type(right))
            if kinds == _TWO_STR:  # the common case: the size check of the generic path,
                size = len(left) + len(right)  # then the result's, as one
                if size > meter.value_limit:
                    meter.too_big(size)
                meter.work_left -= 2 * size
                if meter.work_left < 0:
                    meter.overworked()
                return left + right
            if kinds == _TWO_INT:  # loop.index0 + 1: nothing to count
                return left + right
        elif operator == "%" and type(left) is int and type(right) is int:
            return left % right  # loop.index0 % 2
        return self._guarded_binop(meter, context, operator, left, right)

    def _guarded_binop(
        self, meter: Meter, context: Any, operator: str, left: Any, right: Any
    ) -> Any:
        if isinstance(left, BINARY) or isinstance(right, BINARY):
            raise SecurityError(NO_BYTES)
        if operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                meter.build(len(left) + len(right))
        elif operator == "*":
            if isinstance(left, str | list | tuple) and isinstance(right, int):
                meter.build(len(left) * max(0, right))
            elif isinstance(right, str | list | tuple) and isinstance(left, int):
                meter.build(len(right) * max(0, left))
            elif (
                isinstance(left, int)
                and isinstance(right, int)
                and left.bit_length() + right.bit_length() > _MAX_INT_BITS
            ):
                raise BudgetExceeded("tried to build an integer of over 65,536 bits")
        elif (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and left.bit_length() * right > _MAX_INT_BITS
        ):
            raise BudgetExceeded("tried to build an integer of over 65,536 bits")
        elif operator == "%" and isinstance(left, str):
            check_percent(meter, left, right)
        return meter.produced(super().call_binop(context, operator, left, right))

    def getitem(self, obj: Any, argument: Any) -> Any:
        meter = _current()
        if meter is None:  # constant folding at compile time: a literal, so bounded
            return super().getitem(obj, argument)
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        if type(obj) is dict and type(argument) is str:  # message['role']
            # What the sandbox tries first; a plain dict's ``get`` is its ``[]`` without the
            # KeyError, which ``message['tool_calls'] is defined`` raised once a turn.
            value = obj.get(argument, missing)
            if value is not missing:
                return value
            if argument not in _DICT_ATTRIBUTES:  # then no attribute of that name either
                return self.undefined(obj=obj, name=argument)
        value = super().getitem(obj, argument)
        return meter.produced(value) if isinstance(argument, slice) else value

    def getattr(self, obj: Any, attribute: str) -> Any:
        meter = _current()
        if meter is not None:
            meter.steps_left -= 1  # meter.tick(), inlined
            if meter.steps_left < meter.next_check:
                meter.checkpoint()
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:  # message.role
            # The sandbox's getattr finds no such attribute, then looks the key up.
            value = obj.get(attribute, missing)
            return self.undefined(obj=obj, name=attribute) if value is missing else value
        elif kind is LoopContext and attribute in _LOOP_ATTRIBUTES:
            return getattr(obj, attribute)  # plain values: what the sandbox lets through
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        meter = active_meter()
        if type(__obj) is MethodType and __obj.__func__ is _GENERATION:
            # {% generation %}: what the generic path below decides for it, decided once.
            meter.steps_left -= 1  # meter.tick(), inlined
            if meter.steps_left < meter.next_check:
                meter.checkpoint()
            kwargs.pop("_loop_vars", None)  # as Context.call
            kwargs.pop("_block_vars", None)
            try:
                text = __obj(*args, **kwargs)
            except StopIteration:  # as Context.call
                return __context.environment.undefined(
                    "value was undefined because a callable raised a StopIteration exception"
                )
            meter.build(len(text))
            return text
        # A macro call costs ~20x a loop step; weighing it so keeps the budget's time bound.
        meter.tick(_MACRO_STEPS if isinstance(__obj, Macro) else 1)
        arguments = list(args)
        if isinstance(__obj, LoopContext) and arguments:  # loop(children) in a recursive loop
            arguments[0] = CountedIterable(arguments[0])
        target = getattr(__obj, "__wrapped__", __obj)  # sandbox wraps str.format at lookup
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        owner_type = owner if isinstance(owner, type) else type(owner)  # classmethods too
        for kind, refused in _REFUSED_METHODS.items():
            if issubclass(owner_type, kind) and name in refused:
                raise SecurityError(f"{kind.__name__}.{name} is not allowed in chat templates")
        if isinstance(owner, str):
            check_str_method(meter, owner, name, arguments, kwargs)
        result = super().call(__context, __obj, *arguments, **kwargs)
        return meter.produced(result)


_TWO_STR = (str, str)
_TWO_INT = (int, int)
# Attribute names a plain dict has: for any other name the sandbox's getattr falls back to
# the key, which ``getattr`` then does directly.
_DICT_ATTRIBUTES = frozenset(dir(dict))
# LoopContext attributes that are plain numbers or booleans; previtem/nextitem (items, which
# the sandbox may wrap) and the methods go the generic way.
_LOOP_ATTRIBUTES = frozenset(
    ("index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0")
)
_GENERATION = _GenerationTags._generation


class Guard(NodeTransformer):
    """Rewrite a parsed template so loops, output and ``~`` go through the meter."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.environment = environment

    def _filter(self, node: nodes.Node, name: str, lineno: int) -> nodes.Filter:
        wrapped = nodes.Filter(node, name, [], [], None, None, lineno=lineno)
        wrapped.set_environment(self.environment)  # in place
        return wrapped

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._filter(node.iter, "packcli_for_items", node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        self.generic_visit(node)
        children: list[nodes.Expr] = []
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                child = nodes.Const(child.data, lineno=child.lineno)
            children.append(self._filter(child, "packcli_out", node.lineno))
        node.nodes = children
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        parts = nodes.List(node.nodes, lineno=node.lineno)
        parts.set_environment(self.environment)
        return self._filter(parts, "packcli_concat", node.lineno)


def _make_environment() -> _SandboxEnvironment:
    env = _SandboxEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTags, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = tojson
    env.filters = {name: guard_filter(name, func) for name, func in env.filters.items()}
    env.filters["packcli_out"] = _out
    env.filters["packcli_concat"] = _concat
    env.filters["packcli_for_items"] = _for_items
    del env.globals["lipsum"]  # lipsum(n=10**9) would build gigabytes in one call
    # pprint indents every nesting level, so its size is not bounded by its value's; it is a
    # debugging aid no chat template uses.
    del env.filters["pprint"]
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


ENV = _make_environment()
