"""Size checks for the operations that can build a huge value in one call.

Why before, not after: ``'x' * n``, ``center``, ``%``/``format`` widths, ``translate``, case
mappings, ``escape``, ``urlencode``, ``urlize``... would allocate gigabytes before a meter
counting results could object, so their result's size is predicted from their arguments and
refused against the render's value limit before they run. ``guard_filter`` wraps each of
jinja's builtin filters with its check (``FILTER_CHECKS``); ``check_str_method`` does the
same for string methods called from a template.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import update_wrapper
from typing import Any

from jinja2.exceptions import SecurityError

from packcli.chat.budget import METER, OUTSIDE, Meter, deep_size

_current = METER.get  # the hooks' one lookup of the meter (a C call, no Python frame)


# Unicode case mappings grow a string at most 3x ("ΐ".upper() is 3 characters).
_CASE_METHODS = frozenset({"upper", "lower", "casefold", "title", "capitalize", "swapcase"})


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")


def check_percent(meter: Meter, fmt: str, args: object) -> None:
    """``fmt % args``: widths and precisions must be literal and within the value limit."""
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for number in (width, precision):
            if number == "*":
                raise SecurityError("'*' widths in % formatting are not allowed in chat templates")
            if number:
                meter.reserve(int(number))
    meter.stringable(args)


def _check_str_format(
    meter: Meter, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``fmt.format(...)``: no nested replacement fields in specs, numbers within limits."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _literal, _field, spec, _conversion in fields:
        if spec:
            if "{" in spec:
                raise SecurityError("nested format specs are not allowed in chat templates")
            for number in re.findall(r"\d+", spec):
                meter.reserve(int(number))
    meter.stringable(args)
    meter.stringable(kwargs)


def as_int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _replace_size(text: str, old: object, new: object, count: object) -> int:
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(text)
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _translate_size(meter: Meter, text: str, table: Any) -> int:
    """Length of ``text.translate(table)``: each distinct character looked up once (``table``
    is the template's value: anything with ``__getitem__``, as ``translate`` takes)."""
    counts = Counter(text)
    meter.tick(len(counts))
    size = 0
    for char, n in counts.items():
        try:
            value = table[ord(char)]
        except LookupError:
            value = char
        size += n * (len(value) if isinstance(value, str) else int(isinstance(value, int)))
    return size


def check_str_method(
    meter: Meter, text: str, name: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Predict the size of the string methods that can build a large string in one call."""
    if name in _CASE_METHODS:
        meter.reserve(3 * len(text))
    elif name == "translate" and args:
        meter.reserve(_translate_size(meter, text, args[0]))
    elif name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        meter.reserve(max(len(text), as_int(width)))
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        meter.reserve(len(text) + text.count("\t") * max(0, as_int(size)))
    elif name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        meter.reserve(_replace_size(text, args[0], args[1], count))
    elif name == "join" and args:
        items = list(args[0])
        meter.tick(len(items))
        sizes = sum(len(item) for item in items if isinstance(item, str))
        meter.reserve(sizes + len(text) * max(0, len(items) - 1))
        args[0] = items
    elif name in ("format", "format_map"):
        _check_str_format(meter, text, tuple(args), kwargs)


def _filter_arg(
    args: list[Any], kwargs: dict[str, Any], position: int, key: str, default: object
) -> object:
    """A builtin filter's argument by position (after the value) or keyword."""
    return args[position + 1] if len(args) > position + 1 else kwargs.get(key, default)


def _text(args: list[Any]) -> str:
    return args[0] if args and isinstance(args[0], str) else ""


def _check_center(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    width = _filter_arg(args, kwargs, 0, "width", 80)
    meter.reserve(max(len(_text(args)), as_int(width)))


def _check_indent(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    width = _filter_arg(args, kwargs, 0, "width", 4)
    pad = len(width) if isinstance(width, str) else as_int(width)
    meter.reserve(len(_text(args)) + (_text(args).count("\n") + 1) * pad)


def _check_format(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    check_percent(meter, _text(args), args[1:] or kwargs)


def _check_replace(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    old, new = _filter_arg(args, kwargs, 0, "old", ""), _filter_arg(args, kwargs, 1, "new", "")
    count = _filter_arg(args, kwargs, 2, "count", -1)
    meter.reserve(_replace_size(_text(args), old, new, count))


def _check_wordwrap(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    wrap = _filter_arg(args, kwargs, 2, "wrapstring", None)
    meter.reserve(len(_text(args)) * (1 + (len(wrap) if isinstance(wrap, str) else 1)))


def _check_join(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    if args and not isinstance(args[0], str):
        items = list(args[0])  # a generator is consumed here, counted, and passed on as a list
        meter.tick(len(items))
        sep = _filter_arg(args, kwargs, 0, "d", "")
        meter.reserve(len(sep) * max(0, len(items) - 1) if isinstance(sep, str) else 0)
        args[0] = items


def _check_case(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    meter.reserve(3 * len(_text(args)))


def _str_size(meter: Meter, args: list[Any]) -> int:
    """Characters of the filtered value as a string (containers: their ``str`` estimate)."""
    if not args or isinstance(args[0], str):
        return len(_text(args))
    limit, max_visits = meter.value_limit, max(meter.steps_left, 0)
    size, visited = deep_size(args[0], limit, max_visits)
    if size > limit or visited > max_visits:  # cut short: an estimate the budgets shaped
        meter.budget_dependent = True
    return size


def _check_escape(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    text = _text(args)
    if not args or isinstance(args[0], str):  # exact: & < > " ' grow to &amp; &lt; &#34;...
        grow = 4 * (text.count("&") + text.count('"') + text.count("'"))
        meter.reserve(len(text) + grow + 3 * (text.count("<") + text.count(">")))
    else:
        meter.reserve(6 * _str_size(meter, args))


def _check_urlencode(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    # Percent-encoding: 3 characters per UTF-8 byte, at most 4 bytes per character.
    ascii_only = not args or (isinstance(args[0], str) and args[0].isascii())
    meter.reserve((3 if ascii_only else 12) * _str_size(meter, args))


def _check_urlize(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    text = _text(args)
    extra = 64  # <a href="..."> and </a>, rel and target attribute names
    for position, key in ((2, "target"), (3, "rel")):
        value = _filter_arg(args, kwargs, position, key, None)
        extra += len(value) if isinstance(value, str) else 0
    # Each link repeats its escaped text (<= 6x) in href, and one link per word at most.
    meter.reserve(12 * len(text) + (len(text) // 2 + 1) * extra)


def _check_batch(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    if _filter_arg(args, kwargs, 1, "fill_with", None) is not None:  # pads to linecount
        meter.reserve(as_int(_filter_arg(args, kwargs, 0, "linecount", 0)))


def _check_round(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    if abs(as_int(_filter_arg(args, kwargs, 0, "precision", 0))) > 100:  # 10**precision
        raise SecurityError("round() precision beyond 100 digits is not allowed in chat templates")


def _check_sum(meter: Meter, args: list[Any], kwargs: dict[str, Any]) -> None:
    if not isinstance(_filter_arg(args, kwargs, 1, "start", 0), int | float):  # quadratic
        raise SecurityError("sum() over non-numbers is not allowed in chat templates")


# Size checks run before a builtin filter (``args[0]`` is the filtered value); the filters
# that turn their value and arguments into strings check containers first (``stringable``).
FILTER_CHECKS = {
    "center": _check_center,
    "indent": _check_indent,
    "format": _check_format,
    "replace": _check_replace,
    "wordwrap": _check_wordwrap,
    "join": _check_join,
    "batch": _check_batch,
    "round": _check_round,
    "sum": _check_sum,
    "upper": _check_case,
    "lower": _check_case,
    "title": _check_case,
    "capitalize": _check_case,
    "e": _check_escape,
    "escape": _check_escape,
    "forceescape": _check_escape,
    "xmlattr": _check_escape,
    "urlencode": _check_urlencode,
    "urlize": _check_urlize,
}
# fmt: off
_STRINGIFYING_FILTERS = frozenset((
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "join", "lower",
    "replace", "safe", "string", "striptags", "title", "tojson", "trim", "truncate",
    "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
))
# fmt: on


def guard_filter(name: str, func: Any) -> Any:
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    check = FILTER_CHECKS.get(name)
    stringifying = name in _STRINGIFYING_FILTERS

    def guarded(*args: Any, **kwargs: Any) -> Any:
        meter = _current()
        if meter is None:
            raise RuntimeError(OUTSIDE)  # also keeps jinja from folding it at compile time
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        if check is None and not stringifying:
            return meter.produced(func(*args, **kwargs))
        head, rest = args[:skip], list(args[skip:])
        if stringifying:
            for value in (*rest, *kwargs.values()):
                meter.stringable(value)
        if check is not None:
            check(meter, rest, kwargs)
        return meter.produced(func(*head, *rest, **kwargs))

    return update_wrapper(guarded, func)  # keeps jinja_pass_arg
