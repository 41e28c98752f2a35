"""Chat (SFT) dialogues: validate them, render them with the chat template, mask the loss.

Why this module exists: an SFT row must train on what the assistant says and on nothing else,
and the only faithful source for "what the assistant says" is the chat template's rendered
text, not a guess about role headers. So a dialogue (one jsonl line, ``{"messages": [...]}``)
is rendered once with the model's own Jinja chat template, the character spans of the
assistant turns are taken from that rendering, and the spans are mapped onto tokens through
the fast tokenizer's character offsets. The whole dialogue stays one sequence (one packed
segment), so every assistant turn is trained in one forward pass.

Spans, in order of preference:

1. ``{% generation %}...{% endgeneration %}`` blocks in the template (transformers'
   ``AssistantTracker`` convention): exactly those characters are trained.
2. Otherwise each assistant turn is located in the rendered text. A turn starts after the
   assistant header (the template's generation prompt, e.g. ``<|im_start|>assistant\\n``,
   found by rendering a probe dialogue once per template), or at its content when the
   template has no header, and ends after the template's end-of-turn marker (see
   ``turn_markers``). Reasoning, the content and tool calls that the template writes inside
   the turn are all trained. Where each message's content lies is not searched for (a user
   message holding ``<|im_start|>assistant\\n`` and a fake answer would then move the trained
   span into the user's text): the dialogue is rendered a second time with every content
   replaced by a sentinel (a Private Use Area character absent from the data, around the
   message's index), so the sentinels' places give each content's exact place, and turn
   markers are looked for only in the template's own text (``_located_spans``). Rendering
   every prefix of the dialogue and diffing (transformers/TRL's way for multi-turn masks)
   would be immune too, but costs O(n^2) renders and needs a template whose output for a prefix is
   a prefix of its output for the dialogue, which templates that drop earlier reasoning are
   not; the sentinel rendering costs one more render and needs only that the template write
   contents without looking inside them. Whitespace trimmed off (``| trim``) and JSON
   escaping (``| tojson``) are followed. A template that rewrites or branches on contents
   otherwise falls back to searching the text in order with a cursor
   (``locate_assistant_spans``), allowed only for a dialogue whose contents hold no turn
   marker; one that does is refused (``ChatFormatError``): only ``{% generation %}`` tags
   can place its turns safely.

Token rule: a token is trained when any of its characters lies in a trained span (the rule
of transformers' ``assistant_masks``, so the masks agree token for token). Every trained
character is therefore in a trained token; a byte-level token that straddles a boundary,
such as ``"\\n "`` = the header's newline + the content's leading space, is trained.
Control-token text inside a message (a literal ``<|im_end|>``) is tokenized as that token,
as transformers does by default; the mask follows characters, so it is trained only inside
an assistant turn.

Untrusted templates: a template from the Hub is code. It runs in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute escapes, no mutation, no file access: there is
no loader and ``include``/``import``/``extends`` are refused at compile time) and under a
budget: every loop iteration, call, lookup, operator and filter is one step; the characters a
template builds and writes are counted, and operations that could build a huge value in one
call (``'x' * n``, ``center``, ``%``/``format`` widths, ``**``, ``translate``, case mappings,
``escape``, ``urlencode``, ``urlize``) are checked before they run. Bytes cannot be made at all
(``str.encode``, ``int.to_bytes`` are refused: no chat template needs them, and each bytes
method would need its own check), nor can ``pprint`` be used (its indentation is unbounded).
The budgets are deterministic and grow with the dialogue's size (``RenderLimits``); a
wall-clock limit, checked every 16 steps, backs them up. A hostile template therefore fails
fast with ``ChatTemplateError`` instead of hanging the job or eating the machine's memory.
Measured (2-core dev box, ``scripts/bench_render.py``: ``render_batch`` of 1,000 dialogues of
real text, 4.7 messages and 1.1k characters each): ~0.09 ms a dialogue with the built-in
ChatML template (0.21 ms before the hooks took shortcuts for the common cases; transformers
renders the text alone, unguarded, in ~0.12 ms), ~0.13-0.21 ms with Qwen2.5's and
Llama-3.1's templates (0.38-0.59 ms before). Those have no generation tags, so each dialogue
needs the sentinel rendering too; dialogues of one shape (the same roles and other fields,
in the same order) share it within a batch, where their budgets allow
(``_Renderer.marked``). The meter counts every step and character as it did before the
shortcuts: the smallest budgets that render a dialogue are unchanged (``--budgets``).
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import string
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, update_wrapper
from importlib import resources
from pathlib import Path
from types import MethodType
from typing import Any, Literal

import jinja2
import numpy as np
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from tokenizers import Tokenizer

from packcli.errors import ConfigError, InputError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
TRAIN_ON = ("assistant", "last", "all")
TrainOn = Literal["assistant", "last", "all"]
Span = tuple[int, int]


class ChatFormatError(InputError, ValueError):
    """A dialogue is malformed, or the chat template rejected it. The message is the reason;
    the reader prefixes ``file:line``. ``index`` is the dialogue's position in a batch."""

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        super().__init__(reason)
        self.index = index


class ChatTemplateError(ConfigError):
    """The chat template cannot be found or compiled, or it broke the sandbox or a budget."""


# ---------------------------------------------------------------------------------------------
# Validation


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    return {str: "string", list: "list", int: "int", float: "float"}.get(
        type(value), type(value).__name__
    )


def validate_messages(obj: object, field: str = "messages") -> list[dict[str, Any]]:
    """Check one parsed jsonl line and return its messages, ready for the template.

    Each message needs ``role`` (one of ``ROLES``) and string ``content``. Other keys
    (``name``, ``tool_calls``, ``reasoning_content``...) are kept for the template; keys whose
    value is null are dropped, as transformers does. An assistant message with ``tool_calls``
    may have null content, which becomes ``""``. Other keys of the line are ignored.
    """
    if not isinstance(obj, dict):
        raise ChatFormatError(f"line is not a JSON object (got {_kind(obj)})")
    if field not in obj:
        raise ChatFormatError(f"field {field!r} is missing")
    value = obj[field]
    if not isinstance(value, list):
        raise ChatFormatError(f"field {field!r} is not a list (got {_kind(value)})")
    if not value:
        raise ChatFormatError(f"field {field!r} is empty")
    messages = []
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise ChatFormatError(f"message {number} is not an object (got {_kind(message)})")
        role = message.get("role")
        if role is None:
            raise ChatFormatError(f"message {number} has no role")
        if not isinstance(role, str):
            raise ChatFormatError(f"message {number} role is not a string (got {_kind(role)})")
        if role not in ROLES:
            raise ChatFormatError(
                f"message {number} has unknown role {role!r} (expected one of {', '.join(ROLES)})"
            )
        if "content" not in message:
            raise ChatFormatError(f"message {number} has no content")
        content = message["content"]
        clean = {key: item for key, item in message.items() if item is not None}
        if content is None and role == "assistant" and message.get("tool_calls"):
            clean["content"] = ""
        elif not isinstance(content, str):
            raise ChatFormatError(
                f"message {number} content is not a string (got {_kind(content)})"
            )
        messages.append(clean)
    return messages


# ---------------------------------------------------------------------------------------------
# Finding the template

_ASSETS = resources.files("packcli") / "assets"


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # where the text came from, for messages and the run record
    text: str

    @property
    def has_generation_tags(self) -> bool:
        return _compile(self.text, self.source).has_generation


def builtin_templates() -> list[str]:
    """Names of the templates shipped as ``packcli/assets/<name>.jinja``."""
    return sorted(
        p.name.removesuffix(".jinja") for p in _ASSETS.iterdir() if p.name.endswith(".jinja")
    )


def _builtin(name: str) -> ChatTemplate | None:
    resource = _ASSETS / f"{name}.jinja"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not resource.is_file():
        return None
    return ChatTemplate(f"built-in {name}", resource.read_text(encoding="utf-8"))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _config_templates(config: dict, where: str) -> dict[str, ChatTemplate]:
    """``chat_template`` of a tokenizer config: a string, or a list of {name, template}."""
    value = config.get("chat_template")
    if isinstance(value, str):
        return {"default": ChatTemplate(f"'chat_template' in {where}", value)}
    found = {}
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and isinstance(entry.get("template"), str):
                name = str(entry.get("name", "default"))
                found[name] = ChatTemplate(f"chat template {name!r} in {where}", entry["template"])
    elif value is not None:
        raise ChatTemplateError(f"'chat_template' in {where} is neither a string nor a list")
    return found


def _tokenizer_templates(spec: str) -> tuple[dict[str, ChatTemplate], list[str]]:
    """Templates that come with a tokenizer (name -> template; the main one is "default"),
    and the places looked at, for the error message when there are none."""
    path = Path(spec)
    if path.is_dir() or path.is_file():
        folder = path if path.is_dir() else path.parent
        stem = "tokenizer" if path.is_dir() else path.name.removesuffix(".json")
        looked = [str(folder / "chat_template.jinja")]
        templates: dict[str, ChatTemplate] = {}
        # Same config lookup as packcli.tokenizer: tokenizer_config.json, then <stem>_config.json.
        for name in dict.fromkeys(("tokenizer_config.json", f"{stem}_config.json")):
            config_path = folder / name
            looked.append(f"'chat_template' in {config_path}")
            if config_path.is_file():
                templates = _config_templates(_read_json(config_path), str(config_path))
                break
        extra = folder / "additional_chat_templates"
        if extra.is_dir():
            for file in sorted(extra.glob("*.jinja")):
                text = file.read_text(encoding="utf-8")
                templates[file.name.removesuffix(".jinja")] = ChatTemplate(str(file), text)
        main = folder / "chat_template.jinja"
        if main.is_file():  # transformers: the .jinja file wins over the config's string
            templates["default"] = ChatTemplate(str(main), main.read_text(encoding="utf-8"))
        return templates, looked
    if spec.startswith((".", "/")) or spec.endswith(".json"):
        return {}, [f"{spec} (no such file or folder)"]
    return _hub_templates(spec)


def _hub_templates(repo_id: str) -> tuple[dict[str, ChatTemplate], list[str]]:
    looked = [f"chat_template.jinja and tokenizer_config.json of Hub repo {repo_id}"]
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - a dependency of the project
        return {}, looked
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        try:
            file = Path(hf_hub_download(repo_id, name))
        except Exception as exc:  # absent file, no network, offline mode: try the next place
            log.info("no %s in %s: %s", name, repo_id, exc)
            continue
        if name.endswith(".jinja"):
            text = file.read_text(encoding="utf-8")
            return {"default": ChatTemplate(f"{repo_id}/{name}", text)}, looked
        return _config_templates(_read_json(file), f"{repo_id}/{name}"), looked
    return {}, looked


def load_chat_template(tokenizer_spec: str | None, override: str | None) -> ChatTemplate:
    """Find the chat template the way transformers does, and check that it compiles.

    ``override`` (``--chat-template``) wins: inline Jinja text, a ``.jinja`` file, a
    ``tokenizer_config.json``-style ``.json`` file, the name of one of the tokenizer's named
    templates, or a built-in name (``builtin_templates()``, e.g. ``chatml``). Without it:
    ``chat_template.jinja`` beside the tokenizer, else ``chat_template`` in
    ``tokenizer_config.json`` (or ``<stem>_config.json`` beside ``<stem>.json``); a list of
    named templates yields the one named "default".
    """
    template = _find_template(tokenizer_spec, override)
    if not template.text.strip():
        raise ChatTemplateError(f"chat template ({template.source}) is empty")
    _compile(template.text, template.source)
    return template


def _find_template(tokenizer_spec: str | None, override: str | None) -> ChatTemplate:
    if override and ("{{" in override or "{%" in override):
        return ChatTemplate("inline template", override)
    if override and Path(override).is_file():
        path = Path(override)
        if path.suffix == ".json":
            found = _config_templates(_read_json(path), str(path))
            if "default" not in found:
                raise ChatTemplateError(f"{path} has no default 'chat_template'")
            return found["default"]
        return ChatTemplate(str(path), path.read_text(encoding="utf-8"))
    # Only now look beside the tokenizer (for a Hub id, that is a download).
    templates, looked = _tokenizer_templates(tokenizer_spec) if tokenizer_spec else ({}, [])
    if override:
        if override in templates:
            return templates[override]
        builtin = _builtin(override)
        if builtin is not None:
            return builtin
        if "/" in override or Path(override).suffix in (".jinja", ".json"):
            raise ChatTemplateError(f"chat template file not found: {override}")
        named = ", ".join(sorted(templates)) or "none"
        raise ChatTemplateError(
            f"unknown chat template {override!r}: pass a .jinja file, one of the tokenizer's "
            f"templates ({named}) or a built-in ({', '.join(builtin_templates())})"
        )
    if "default" in templates:
        return templates["default"]
    if templates:
        raise ChatTemplateError(
            f"the tokenizer has chat templates named {', '.join(sorted(templates))} but none "
            "named 'default': pass --chat-template NAME"
        )
    where = f" (looked for {', '.join(looked)})" if looked else ""
    raise ChatTemplateError(
        f"no chat template found{where}: pass --chat-template with a .jinja file or a "
        f"built-in ({', '.join(builtin_templates())})"
    )


# ---------------------------------------------------------------------------------------------
# The sandbox and its budgets


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
_MAX_INT_BITS = 1 << 16  # integers a template may build (2**65536 is ~20k digits)
_MAX_INDENT = 64  # tojson indent / separators length
_MACRO_STEPS = 16


_SCALARS = (str, int, float, bool, type(None))
_SIZED = (str, list, tuple, dict, set, frozenset)
# No chat template needs bytes, and every bytes operation (repetition, join, center, replace,
# decode...) would need its own size check: refusing the type closes them all at once.
_BINARY = (bytes, bytearray, memoryview)
_NO_BYTES = "bytes are not allowed in chat templates"
# Methods refused before they run: they make bytes, or integers past _MAX_INT_BITS.
_REFUSED_METHODS = {str: frozenset({"encode"}), int: frozenset({"to_bytes", "from_bytes"})}
# Unicode case mappings grow a string at most 3x ("ΐ".upper() is 3 characters).
_CASE_METHODS = frozenset({"upper", "lower", "casefold", "title", "capitalize", "swapcase"})


class _BudgetExceeded(Exception):
    """Raised inside a render when a budget runs out; never caught by templates or jinja."""


class _Meter:
    """The budgets of the render in progress (one per render, found through ``_METER``).

    The hot hooks (``call_binop``, ``getitem``, ``getattr``, ``_out``) inline ``tick`` and
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
        # budgets could then change the outcome (see _Renderer.marked).
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
            raise _BudgetExceeded(f"ran more than {budget:,} operations")
        self.next_check = max(self.steps_left - 16, 0)
        if time.monotonic() > self.deadline:
            raise _BudgetExceeded(f"ran longer than {self.limits.seconds:g} s")

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
        raise _BudgetExceeded(
            f"tried to build a value of {size:,} characters (limit {self.value_limit:,})"
        )

    def overworked(self) -> None:
        budget = self.limits.work + self.limits.work_per_char * self.input_chars
        raise _BudgetExceeded(f"built more than {budget:,} characters in total")

    def overwritten(self) -> None:
        raise _BudgetExceeded(f"wrote more than {self.value_limit:,} characters")

    def stringable(self, value: object) -> None:
        """Before ``str(value)`` of a container: refuse one that would expand into a huge
        string (``[[big] * 1000] * 1000`` holds few objects but prints gigabytes)."""
        if not isinstance(value, _SCALARS):
            size, visited = _deep_size(value, self.value_limit, max(self.steps_left, 0))
            self.tick(visited)
            self.reserve(size)

    def produced(self, value: Any) -> Any:
        """Account for the result of an operation; iterators are counted as they are consumed."""
        if isinstance(value, _BINARY):
            raise SecurityError(_NO_BYTES)
        if isinstance(value, _SIZED):
            self.build(len(value))
        elif hasattr(value, "__next__") and not isinstance(value, LoopContext):
            return _counted(value, self)
        return value


_METER: ContextVar[_Meter | None] = ContextVar("packcli_chat_meter", default=None)
_current = _METER.get  # the hooks' one lookup of the meter (a C call, no Python frame)
_OUTSIDE = "packcli chat templates can only run inside chat.render"


def _meter() -> _Meter:
    meter = _current()
    if meter is None:
        # Also stops jinja from folding guarded filters into constants at compile time.
        raise RuntimeError(_OUTSIDE)
    return meter


_SEQUENCES = (list, tuple, set, frozenset)


def _deep_size(value: object, limit: int, max_visits: int) -> tuple[int, int]:
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


def _counted(items: Iterable[Any], meter: _Meter) -> Iterator[Any]:
    for item in items:
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        yield item


class _CountedIterable:
    """What a ``{% for %}`` loop iterates: one step per item; keeps ``len`` for ``loop.length``."""

    __slots__ = ("_items",)

    def __init__(self, items: Any) -> None:
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return _counted(self._items, _meter())

    def __len__(self) -> int:
        return len(self._items)  # TypeError for generators: LoopContext then lists them


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent(meter: _Meter, fmt: str, args: object) -> None:
    """``fmt % args``: widths and precisions must be literal and within the value limit."""
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for number in (width, precision):
            if number == "*":
                raise SecurityError("'*' widths in % formatting are not allowed in chat templates")
            if number:
                meter.reserve(int(number))
    meter.stringable(args)


def _check_str_format(meter: _Meter, fmt: str, args: tuple, kwargs: dict) -> None:
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


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _replace_size(text: str, old: object, new: object, count: object) -> int:
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(text)
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _translate_size(meter: _Meter, text: str, table: object) -> int:
    """Length of ``text.translate(table)``: each distinct character looked up once."""
    counts = Counter(text)
    meter.tick(len(counts))
    size = 0
    for char, n in counts.items():
        try:
            value = table[ord(char)]  # type: ignore[index]  # what translate itself does
        except LookupError:
            value = char
        size += n * (len(value) if isinstance(value, str) else int(isinstance(value, int)))
    return size


def _check_str_method(meter: _Meter, text: str, name: str, args: list, kwargs: dict) -> None:
    """Predict the size of the string methods that can build a large string in one call."""
    if name in _CASE_METHODS:
        meter.reserve(3 * len(text))
    elif name == "translate" and args:
        meter.reserve(_translate_size(meter, text, args[0]))
    elif name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        meter.reserve(max(len(text), _as_int(width)))
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        meter.reserve(len(text) + text.count("\t") * max(0, _as_int(size)))
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


def _filter_arg(args: list, kwargs: dict, position: int, key: str, default: object) -> object:
    """A builtin filter's argument by position (after the value) or keyword."""
    return args[position + 1] if len(args) > position + 1 else kwargs.get(key, default)


def _text(args: list) -> str:
    return args[0] if args and isinstance(args[0], str) else ""


def _check_center(meter: _Meter, args: list, kwargs: dict) -> None:
    width = _filter_arg(args, kwargs, 0, "width", 80)
    meter.reserve(max(len(_text(args)), _as_int(width)))


def _check_indent(meter: _Meter, args: list, kwargs: dict) -> None:
    width = _filter_arg(args, kwargs, 0, "width", 4)
    pad = len(width) if isinstance(width, str) else _as_int(width)
    meter.reserve(len(_text(args)) + (_text(args).count("\n") + 1) * pad)


def _check_format(meter: _Meter, args: list, kwargs: dict) -> None:
    _check_percent(meter, _text(args), args[1:] or kwargs)


def _check_replace(meter: _Meter, args: list, kwargs: dict) -> None:
    old, new = _filter_arg(args, kwargs, 0, "old", ""), _filter_arg(args, kwargs, 1, "new", "")
    count = _filter_arg(args, kwargs, 2, "count", -1)
    meter.reserve(_replace_size(_text(args), old, new, count))


def _check_wordwrap(meter: _Meter, args: list, kwargs: dict) -> None:
    wrap = _filter_arg(args, kwargs, 2, "wrapstring", None)
    meter.reserve(len(_text(args)) * (1 + (len(wrap) if isinstance(wrap, str) else 1)))


def _check_join(meter: _Meter, args: list, kwargs: dict) -> None:
    if args and not isinstance(args[0], str):
        items = list(args[0])  # a generator is consumed here, counted, and passed on as a list
        meter.tick(len(items))
        sep = _filter_arg(args, kwargs, 0, "d", "")
        meter.reserve(len(sep) * max(0, len(items) - 1) if isinstance(sep, str) else 0)
        args[0] = items


def _check_case(meter: _Meter, args: list, kwargs: dict) -> None:
    meter.reserve(3 * len(_text(args)))


def _str_size(meter: _Meter, args: list) -> int:
    """Characters of the filtered value as a string (containers: their ``str`` estimate)."""
    if not args or isinstance(args[0], str):
        return len(_text(args))
    limit, max_visits = meter.value_limit, max(meter.steps_left, 0)
    size, visited = _deep_size(args[0], limit, max_visits)
    if size > limit or visited > max_visits:  # cut short: an estimate the budgets shaped
        meter.budget_dependent = True
    return size


def _check_escape(meter: _Meter, args: list, kwargs: dict) -> None:
    text = _text(args)
    if not args or isinstance(args[0], str):  # exact: & < > " ' grow to &amp; &lt; &#34;...
        grow = 4 * (text.count("&") + text.count('"') + text.count("'"))
        meter.reserve(len(text) + grow + 3 * (text.count("<") + text.count(">")))
    else:
        meter.reserve(6 * _str_size(meter, args))


def _check_urlencode(meter: _Meter, args: list, kwargs: dict) -> None:
    # Percent-encoding: 3 characters per UTF-8 byte, at most 4 bytes per character.
    ascii_only = not args or (isinstance(args[0], str) and args[0].isascii())
    meter.reserve((3 if ascii_only else 12) * _str_size(meter, args))


def _check_urlize(meter: _Meter, args: list, kwargs: dict) -> None:
    text = _text(args)
    extra = 64  # <a href="..."> and </a>, rel and target attribute names
    for position, key in ((2, "target"), (3, "rel")):
        value = _filter_arg(args, kwargs, position, key, None)
        extra += len(value) if isinstance(value, str) else 0
    # Each link repeats its escaped text (<= 6x) in href, and one link per word at most.
    meter.reserve(12 * len(text) + (len(text) // 2 + 1) * extra)


def _check_batch(meter: _Meter, args: list, kwargs: dict) -> None:
    if _filter_arg(args, kwargs, 1, "fill_with", None) is not None:  # pads to linecount
        meter.reserve(_as_int(_filter_arg(args, kwargs, 0, "linecount", 0)))


def _check_round(meter: _Meter, args: list, kwargs: dict) -> None:
    if abs(_as_int(_filter_arg(args, kwargs, 0, "precision", 0))) > 100:  # 10**precision
        raise SecurityError("round() precision beyond 100 digits is not allowed in chat templates")


def _check_sum(meter: _Meter, args: list, kwargs: dict) -> None:
    if not isinstance(_filter_arg(args, kwargs, 1, "start", 0), int | float):  # quadratic
        raise SecurityError("sum() over non-numbers is not allowed in chat templates")


# Size checks run before a builtin filter (``args[0]`` is the filtered value); the filters
# that turn their value and arguments into strings check containers first (``stringable``).
_FILTER_CHECKS = {
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


def _guard_filter(name: str, func: Any) -> Any:
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    check = _FILTER_CHECKS.get(name)
    stringifying = name in _STRINGIFYING_FILTERS

    def guarded(*args: Any, **kwargs: Any) -> Any:
        meter = _current()
        if meter is None:
            raise RuntimeError(_OUTSIDE)  # also keeps jinja from folding it at compile time
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


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: no HTML escaping, and its options (kept small here)."""
    if (len(indent) if isinstance(indent, str) else _as_int(indent)) > _MAX_INDENT:
        raise SecurityError(f"tojson indent beyond {_MAX_INDENT} is not allowed in chat templates")
    if separators is not None and sum(len(str(s)) for s in separators) > _MAX_INDENT:
        raise SecurityError("tojson separators this long are not allowed in chat templates")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _TemplateRaised(TemplateError):
    """``raise_exception(...)`` in a template: the template refuses this dialogue."""


def _raise_exception(message: object) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    meter = _meter()
    return (meter.now or datetime.now()).strftime(str(fmt))


class _TemplateDict:
    """``dict`` for templates without the type itself (as transformers does)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
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
    so ``_compile`` refuses blocks inside macros, ``set``/``filter``/``call`` blocks and
    recursive loops, whose output is buffered.
    """

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API

    def parse(self, parser: jinja2.parser.Parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller: Any) -> str:
        text = caller()
        meter = _meter()
        meter.generation.append((meter.emitted, meter.emitted + len(text)))
        return text


def _out(value: Any) -> str:
    """Every piece of output (literal text and ``{{ }}``) passes here to be counted."""
    meter = _current()
    if meter is None:
        raise RuntimeError(_OUTSIDE)  # also keeps jinja from folding it at compile time
    meter.steps_left -= 1  # meter.tick(), inlined: the hottest hook
    if meter.steps_left < meter.next_check:
        meter.checkpoint()
    if not isinstance(value, str):
        meter.stringable(value)
        value = str(value)
    meter.output_left -= len(value)  # meter.write(len(value)), inlined
    if meter.output_left < 0:
        meter.overwritten()
    return value


def _concat(parts: list[Any]) -> str:
    """The ``~`` operator, size-checked before the join."""
    meter = _meter()
    meter.tick()
    for part in parts:
        if not isinstance(part, str):
            meter.stringable(part)
    pieces = [str(part) for part in parts]
    meter.build(sum(map(len, pieces)))
    return "".join(pieces)


def _for_items(items: Any) -> _CountedIterable:
    _meter()
    return _CountedIterable(items)


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
            raise RuntimeError(_OUTSIDE)
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
        self, meter: _Meter, context: Any, operator: str, left: Any, right: Any
    ) -> Any:
        if isinstance(left, _BINARY) or isinstance(right, _BINARY):
            raise SecurityError(_NO_BYTES)
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
                raise _BudgetExceeded("tried to build an integer of over 65,536 bits")
        elif (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and left.bit_length() * right > _MAX_INT_BITS
        ):
            raise _BudgetExceeded("tried to build an integer of over 65,536 bits")
        elif operator == "%" and isinstance(left, str):
            _check_percent(meter, left, right)
        return meter.produced(super().call_binop(context, operator, left, right))

    def getitem(self, obj: Any, argument: Any) -> Any:
        meter = _current()
        if meter is None:  # constant folding at compile time: a literal, so bounded
            return super().getitem(obj, argument)
        meter.steps_left -= 1  # meter.tick(), inlined
        if meter.steps_left < meter.next_check:
            meter.checkpoint()
        if type(obj) is dict and type(argument) is str:  # message['role']
            try:
                return obj[argument]  # what the sandbox tries first
            except KeyError:
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
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        elif kind is LoopContext and attribute in _LOOP_ATTRIBUTES:
            return getattr(obj, attribute)  # plain values: what the sandbox lets through
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        meter = _meter()
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
            arguments[0] = _CountedIterable(arguments[0])
        target = getattr(__obj, "__wrapped__", __obj)  # sandbox wraps str.format at lookup
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        owner_type = owner if isinstance(owner, type) else type(owner)  # classmethods too
        for kind, refused in _REFUSED_METHODS.items():
            if issubclass(owner_type, kind) and name in refused:
                raise SecurityError(f"{kind.__name__}.{name} is not allowed in chat templates")
        if isinstance(owner, str):
            _check_str_method(meter, owner, name, arguments, kwargs)
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


class _Guard(NodeTransformer):
    """Rewrite a parsed template so loops, output and ``~`` go through the meter."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.environment = environment

    def _filter(self, node: nodes.Expr, name: str, lineno: int) -> nodes.Filter:
        wrapped = nodes.Filter(node, name, [], [], None, None, lineno=lineno)
        return wrapped.set_environment(self.environment)

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._filter(node.iter, "packcli_for_items", node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        self.generic_visit(node)
        children = []
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                child = nodes.Const(child.data, lineno=child.lineno)
            children.append(self._filter(child, "packcli_out", node.lineno))
        node.nodes = children
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        parts = nodes.List(node.nodes, lineno=node.lineno).set_environment(self.environment)
        return self._filter(parts, "packcli_concat", node.lineno)


def _make_environment() -> _SandboxEnvironment:
    env = _SandboxEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTags, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, func) for name, func in env.filters.items()}
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


_ENV = _make_environment()
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
class _Compiled:
    template: jinja2.Template
    has_generation: bool
    deterministic: bool  # same variables, same output (no ``random`` filter)


@lru_cache(maxsize=64)
def _compile(text: str, source: str) -> _Compiled:
    try:
        tree = _ENV.parse(text)
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
    guarded = _Guard(_ENV).visit(tree)
    try:
        template = _ENV.from_string(guarded)
    except TemplateError as exc:  # pragma: no cover - the parse above catches syntax errors
        raise ChatTemplateError(f"chat template ({source}) does not compile: {exc}") from None
    return _Compiled(template, has_generation, deterministic)


def _input_chars(messages: Sequence[Mapping[str, Any]], variables: Mapping[str, Any]) -> int:
    total = 0
    for value in (*messages, variables):
        for item in value.values():
            total += len(item) if isinstance(item, str) else len(str(item))
    return total


def _run(
    template: ChatTemplate,
    context: dict[str, Any],
    input_chars: int,
    limits: RenderLimits,
    now: datetime | None,
) -> tuple[str, list[Span]]:
    compiled = _compile(template.text, template.source)
    parent = dict(compiled.template.globals, **context)  # what jinja's generate() passes
    return _run_compiled(compiled, template.source, parent, _Meter(limits, input_chars, now))


def _run_compiled(
    compiled: _Compiled, source: str, parent: dict[str, Any], meter: _Meter
) -> tuple[str, list[Span]]:
    """Render with ``parent`` (the template's globals and the variables, merged) under
    ``meter``: jinja's ``generate`` less its per-call copies, and its traceback rewriting,
    which only changes tracebacks that are turned into messages here anyway."""
    input_chars = meter.input_chars
    token = _METER.set(meter)
    try:
        template = compiled.template
        chunks = template.root_render_func(template.new_context(parent, shared=True))
        if not compiled.has_generation:  # only {% generation %} reads meter.emitted
            return "".join(chunks), meter.generation
        parts = []
        for chunk in chunks:
            meter.emitted += len(chunk)
            parts.append(chunk)
        return "".join(parts), meter.generation
    except _BudgetExceeded as exc:
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
    except _TemplateRaised as exc:
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
        _METER.reset(token)


# ---------------------------------------------------------------------------------------------
# Rendering and locating assistant turns


@dataclass(frozen=True)
class TurnMarkers:
    """How the template opens and closes an assistant turn, found by rendering probes.

    ``header``: the generation prompt (``render([user], add_generation_prompt=True)`` minus
    ``render([user])``), kept only when the probe shows it right before an assistant turn's
    content. ``end``: the control token right after an assistant turn's content (whitespace
    may come between), kept when it is the EOS token, or when it also closes user turns
    (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``<|end|>``) and is not part of the
    header. A token found only after assistant turns, or one the header holds (a template
    without end markers: ``<|im_start|>`` follows every turn), opens the next turn: not
    trusted. Without a marker a turn ends with its content.
    """

    header: str | None
    end: str | None


_PROBE = ("pkqzu1", "pkqza1", "pkqzu2", "pkqza2")


def _probe_dialogue(with_system: bool) -> list[dict[str, str]]:
    roles = ("user", "assistant", "user", "assistant")
    messages = [{"role": r, "content": c} for r, c in zip(roles, _PROBE, strict=True)]
    return [{"role": "system", "content": "pkqzs0"}, *messages] if with_system else messages


def _token_at(text: str, pos: int, tokens: Sequence[str]) -> str | None:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return next((tok for tok in tokens if text.startswith(tok, pos)), None)


# The probe dialogue is tiny: a real template renders it in a few thousand steps, and a
# hostile one costs at most this much more than the render that triggered the probe.
_PROBE_LIMITS = RenderLimits(steps=100_000, output=1 << 16, work=1 << 20, seconds=1.0)


def _probe(template: ChatTemplate, context: dict[str, Any], prompt: bool) -> str:
    return _run(template, {**context, "add_generation_prompt": prompt}, 0, _PROBE_LIMITS, None)[0]


@lru_cache(maxsize=64)
def _turn_markers(
    text: str, source: str, bos: str, eos: str, control_tokens: tuple[str, ...]
) -> TurnMarkers:
    template = ChatTemplate(source, text)
    tokens = sorted({*control_tokens, *(t for t in (bos, eos) if t)}, key=len, reverse=True)
    base = {"bos_token": bos, "eos_token": eos, "tools": None, "documents": None}
    for with_system in (False, True):  # some templates insist on a system message
        messages = _probe_dialogue(with_system)
        first = {**base, "messages": messages[: 2 if with_system else 1]}
        try:
            full = _probe(template, {**base, "messages": messages}, prompt=False)
            plain, prompt = _probe(template, first, prompt=False), _probe(template, first, True)
        except ChatFormatError:
            continue
        except ChatTemplateError:
            break
        # The first user/assistant pair the template writes verbatim (some hide early turns).
        pairs = [(full.find(u), full.find(a), u, a) for u, a in (_PROBE[:2], _PROBE[2:])]
        found = [(u, a, un, an) for u, a, un, an in pairs if 0 <= u < a]
        if not found:
            continue
        u1, a1, user, assistant = found[0]
        header = prompt[len(plain) :] if prompt.startswith(plain) else ""
        if not header or not full[:a1].endswith(header):
            header = ""
        end = _token_at(full, a1 + len(assistant), tokens)
        if end is not None and end != eos:
            closes_user = end == _token_at(full, u1 + len(user), tokens)
            if not closes_user or end in header:  # in the header: it opens the next turn
                end = None
        return TurnMarkers(header or None, end)
    return TurnMarkers(None, eos or None)


def turn_markers(
    template: ChatTemplate,
    *,
    bos_token: str = "",
    eos_token: str = "",
    control_tokens: Collection[str] = (),
) -> TurnMarkers:
    """The template's assistant header and end-of-turn marker (cached per template)."""
    return _turn_markers(
        template.text, template.source, bos_token, eos_token, tuple(sorted(set(control_tokens)))
    )


def _find_before(text: str, needle: str, start: int, end: int, latest: int) -> int:
    """``needle`` within ``text[start:end]``, starting no later than ``latest``; else -1."""
    pos = text.find(needle, start, end)
    return pos if pos <= latest else -1


def locate_assistant_spans(
    text: str, messages: Sequence[Mapping[str, Any]], markers: TurnMarkers
) -> list[Span]:
    """Character span of each assistant turn in ``text``, in order, found by searching the
    text: the fallback for templates that rewrite contents (see ``_located_spans``), since
    content holding a turn marker could move a span.

    The cursor walk: every message's content is searched from the end of the previous match
    and, when the template has an assistant header, before the next header, so a user message
    quoting the answer, or an answer repeated, is matched in place. A non-assistant content
    the template does not write verbatim is skipped; an assistant one (also tried stripped of
    surrounding whitespace) is an error, because the turn cannot be trained reliably: the
    template rewrites it and needs ``{% generation %}`` tags.
    """
    header, end_marker = markers.header, markers.end

    def next_header(after: int) -> int:
        """Where the next assistant header starts (the end of the text when there is none)."""
        found = text.find(header, after) if header else -1
        return len(text) if found < 0 else found

    cursor = 0
    spans: list[Span] = []
    for number, message in enumerate(messages, 1):
        content = message.get("content") or ""
        opens = next_header(cursor)
        if message.get("role") != "assistant":
            if content:  # searched only before the next assistant turn
                pos = text.find(content, cursor, opens)
                if pos >= 0:
                    cursor = pos + len(content)
            continue
        anchored = opens < len(text)  # the turn's header was found: the turn starts after it
        start = opens + len(header) if anchored and header else cursor
        if content:
            # The content starts before the turn's first end marker (it may hold the marker's
            # text itself) and ends before the next assistant header.
            closes = next_header(start)
            first_end = text.find(end_marker, start, closes) if end_marker else -1
            latest = closes if first_end < 0 else first_end
            pos = _find_before(text, content, start, closes, latest)
            if pos < 0 and content.strip() and content.strip() != content:
                content = content.strip()
                pos = _find_before(text, content, start, closes, latest)
            if pos < 0:
                raise ChatFormatError(
                    f"message {number} (assistant): its content does not appear in the "
                    "rendered text (the template rewrites it); use a chat template with "
                    "{% generation %} tags"
                )
            begin, finish = (start if anchored else pos), pos + len(content)
        elif anchored:
            begin = finish = start  # e.g. a turn of tool calls only
        else:
            continue  # nothing anchors an empty turn in a template without a header
        if end_marker:
            marker = text.find(end_marker, finish, next_header(finish))
            if marker >= 0:
                finish = marker + len(end_marker)
        if finish > begin:
            spans.append((begin, finish))
        cursor = finish
    return spans


# Sentinels: a Private Use Area character (one absent from the dialogue and its rendering)
# around the message's index. Templates leave such text alone: trim, upper, lower and tojson
# (without ensure_ascii) write it unchanged.
_PUA = re.compile("[\ue000-\uf8ff]")


def _sentinel_mark(text: str, messages: Sequence[Mapping[str, Any]]) -> str | None:
    # Usually nothing holds a Private Use Area character, and the first candidate is free:
    # in UTF-8 those characters start with byte 0xEE or 0xEF, and two byte searches in one
    # encoding of the non-ASCII strings take a fraction of the regex's time.
    strings = [text]
    for message in messages:
        for value in message.values():
            if isinstance(value, str) and not value.isascii():
                strings.append(value)
    data = "".join(strings).encode("utf-8", "surrogatepass")  # lone surrogates: 0xED
    if b"\xee" not in data and b"\xef" not in data:
        return "\ue000"
    used = set(_PUA.findall(text))
    for message in messages:
        for value in message.values():
            if isinstance(value, str):
                used.update(_PUA.findall(value))
    return next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used), None)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _written_length(text: str, pos: int, content: str, after: str, final: bool) -> int | None:
    """How many characters of ``text`` from ``pos`` are the message's content, as written.

    The template may have written ``content`` verbatim, stripped of some of its surrounding
    whitespace (``| trim``, ``.strip()``, ``.lstrip('\\n')``), or JSON-escaped (``| tojson``);
    the literal template text ``after`` must follow (and end the text when ``final``).
    """

    def fits(length: int) -> bool:
        end = pos + length
        return text.startswith(after, end) and (not final or end + len(after) == len(text))

    if text.startswith(content, pos) and fits(len(content)):
        return len(content)
    core = content.strip()
    if core:
        lead = len(content) - len(content.lstrip())
        window = text[pos : pos + lead + 1]
        kept = len(window) - len(window.lstrip())  # the whitespace the template kept in front
        if kept <= lead and window[:kept] == content[lead - kept : lead]:
            start = pos + kept + len(core)
            if text.startswith(core, pos + kept):
                trail = content[lead + len(core) :]
                same = _common_prefix(text[start : start + len(trail)], trail)
                if final:
                    found = len(text) - len(after)
                else:  # the most trailing whitespace kept that ``after`` then follows
                    found = text.rfind(after, start, start + same + len(after))
                if start <= found <= start + same and fits(found - pos):
                    return found - pos
    elif fits(0):
        return 0
    for ensure_ascii in (False, True):
        escaped = json.dumps(content, ensure_ascii=ensure_ascii)[1:-1]
        if text.startswith(escaped, pos) and fits(len(escaped)):
            return len(escaped)
    return None


def _content_regions(
    text: str, marked: str, mark: str, messages: Sequence[Mapping[str, Any]]
) -> list[Span | None] | None:
    """Where each message's content lies in ``text`` (None: not written), given ``marked``,
    the same dialogue rendered with each content replaced by its sentinel; None when the two
    renderings do not line up (the template branches on or rewrites the contents)."""
    # Literal text and sentinel numbers alternate: "lit <mark>0<mark> lit <mark>1<mark> lit".
    pieces = marked.split(mark)
    literals, numbers = pieces[0::2], pieces[1::2]
    if len(pieces) % 2 == 0 or not all(n.isascii() and n.isdigit() for n in numbers):
        return None  # a stray mark
    order = [int(n) for n in numbers]
    if len(set(order)) != len(order):
        return None  # a content written twice
    if any(i >= len(messages) or not messages[i].get("content") for i in order):
        return None
    if not order:  # no content written: the two renderings must be the same text
        return [None] * len(messages) if marked == text else None
    if not text.startswith(literals[0]):
        return None
    regions: list[Span | None] = [None] * len(messages)
    pos, last = len(literals[0]), len(order) - 1
    for k, (index, after) in enumerate(zip(order, literals[1:], strict=True)):
        content = messages[index]["content"]
        end = pos + len(content)
        if (  # written verbatim: _written_length's first case, without the call
            text.startswith(content, pos)
            and text.startswith(after, end)
            and (k < last or end + len(after) == len(text))
        ):
            length: int | None = len(content)
        else:
            length = _written_length(text, pos, content, after, k == last)
        if length is None:
            return None
        regions[index] = (pos, pos + length)
        pos += length + len(after)
    return regions  # the last content's ``after`` ends the text (``final``)


def _spans_from_regions(
    text: str,
    messages: Sequence[Mapping[str, Any]],
    regions: Sequence[Span | None],
    markers: TurnMarkers,
) -> list[Span]:
    """Character span of each assistant turn, from where each content was written.

    Only template text is searched for turn markers: an assistant turn starts after the last
    assistant header between the content written before it and its own (at its content
    without a header), and ends after the first end-of-turn marker before the next written
    content. A turn without content (tool calls only) starts after the first header after
    the previous message. Contents need not be written in message order (Mistral's template
    moves the system message into the last user turn).
    """
    header, end_marker = markers.header, markers.end
    # (position, message index): a content can be empty (trimmed away), so a turn's own
    # content is told from its neighbours by index, not by position.
    ends = sorted((r[1], i) for i, r in enumerate(regions) if r is not None)
    starts = sorted((r[0], i) for i, r in enumerate(regions) if r is not None)
    following = [len(text)] * (len(messages) + 1)  # first start among the later contents
    for i in range(len(messages) - 1, -1, -1):
        region = regions[i]
        following[i] = min(following[i + 1], region[0] if region is not None else len(text))
    spans: list[Span] = []
    cursor = 0  # end of the previous message's content or turn
    for number, (message, region) in enumerate(zip(messages, regions, strict=True), 1):
        if message.get("role") != "assistant":
            if region is not None:
                cursor = region[1]
            continue
        if region is not None:
            # The header is looked for after everything written before the content.
            k = bisect.bisect_right(ends, (region[0], len(regions))) - 1
            if k >= 0 and ends[k][1] == number - 1:
                k -= 1
            after = max(ends[k][0] if k >= 0 else 0, cursor if cursor <= region[0] else 0)
            found = text.rfind(header, after, region[0]) if header else -1
            begin = found + len(header) if found >= 0 else region[0]  # type: ignore[arg-type]
            finish = region[1]
        elif message.get("content"):
            raise ChatFormatError(
                f"message {number} (assistant): its content does not appear in the rendered "
                "text (the template rewrites or hides it); use a chat template with "
                "{% generation %} tags"
            )
        else:
            found = text.find(header, cursor, following[number]) if header else -1
            if found < 0:
                continue  # nothing anchors an empty turn
            begin = finish = found + len(header)  # type: ignore[arg-type]
        if end_marker:
            k = bisect.bisect_left(starts, (finish, -1))
            if k < len(starts) and starts[k][1] == number - 1:
                k += 1
            limit = starts[k][0] if k < len(starts) else len(text)
            stop = text.find(header, finish, limit) if header else -1
            marker = text.find(end_marker, finish, limit if stop < 0 else stop)
            if marker >= 0:
                finish = marker + len(end_marker)
        if finish > begin:
            spans.append((begin, finish))
        cursor = finish
    return sorted(spans)


def _located_spans(
    renderer: _Renderer,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    markers: TurnMarkers,
    input_chars: int,
) -> list[Span]:
    """Assistant spans of a template without generation tags, that no content can spoof.

    The dialogue is rendered a second time with each content replaced by a sentinel; where
    the sentinels land says where each content is in the real rendering, so turn markers are
    only looked for in template text. A template that branches on or rewrites contents breaks
    that correspondence; then the text search of ``locate_assistant_spans`` is the fallback,
    allowed only when no content holds a turn marker (which could move a turn into it).
    """
    mark = _sentinel_mark(text, messages)
    regions = None
    if mark is not None:
        sentinels = [
            {**m, "content": f"{mark}{i}{mark}"}
            if isinstance(m.get("content"), str) and m.get("content")
            else m
            for i, m in enumerate(messages)
        ]
        marked = renderer.marked(sentinels, input_chars)
        if marked is not None:
            regions = _content_regions(text, marked, mark, messages)
    if regions is not None:
        return _spans_from_regions(text, messages, regions, markers)
    for number, message in enumerate(messages, 1):
        content = message.get("content")
        for marker in (markers.header, markers.end):
            if marker and isinstance(content, str) and marker in content:
                raise ChatFormatError(
                    f"message {number} ({message.get('role')}) contains the template's turn "
                    f"marker {marker!r}, and the template rewrites message contents, so the "
                    "assistant turns cannot be told apart from it; use a chat template with "
                    "{% generation %} tags"
                )
    return locate_assistant_spans(text, messages, markers)


@dataclass(frozen=True)
class Rendered:
    text: str
    assistant_spans: list[Span]  # trained character span of each assistant turn, in order
    generation_spans: list[Span] | None  # the template's {% generation %} blocks, or None


_MAX_SHAPES = 1024  # sentinel renderings kept per batch


def _shape(messages: Sequence[Mapping[str, Any]]) -> tuple | None:
    """All the template sees of sentinel messages, as a key; None unless every message is
    a dict of strings (what other values do inside a template is not worth predicting)."""
    shape = []
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
        *,
        add_generation_prompt: bool,
        bos_token: str,
        eos_token: str,
        control_tokens: Collection[str],
        variables: Mapping[str, Any] | None,
        limits: RenderLimits,
        now: datetime | None,
    ) -> None:
        self.template = template
        self.compiled = _compile(template.text, template.source)
        context: dict[str, Any] = {"tools": None, "documents": None, **(variables or {})}
        context.update(
            add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
        )
        # jinja's generate(**context) merges the globals under the variables, per render.
        self.parent = dict(self.compiled.template.globals, **context)
        self.variable_chars = _input_chars((), variables or {})
        self.bos_token, self.eos_token = bos_token, eos_token
        self.control_tokens = control_tokens
        self.limits, self.now = limits, now
        self._markers: TurnMarkers | None = None
        # Sentinel renderings by dialogue shape (see ``marked``); none where the output could
        # change between two renders of the same variables (the clock, ``random``) or budgets
        # could shrink as dialogues grow.
        growing = min(limits.steps_per_char, limits.work_per_char, limits.output_per_char) >= 0
        shareable = now is not None and self.compiled.deterministic and growing
        self._marked: dict[tuple, tuple[int, str | None]] | None = {} if shareable else None

    def run(
        self, messages: Sequence[Mapping[str, Any]], input_chars: int, meter: _Meter | None = None
    ) -> tuple[str, list[Span]]:
        parent = self.parent.copy()
        parent["messages"] = messages
        if meter is None:
            meter = _Meter(self.limits, input_chars, self.now)
        return _run_compiled(self.compiled, self.template.source, parent, meter)

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
        if shape is not None:
            known = cache.get(shape)  # type: ignore[union-attr]
            if known is not None and known[0] <= input_chars:
                return known[1]
        meter = _Meter(self.limits, input_chars, self.now)
        try:
            marked: str | None = self.run(sentinels, input_chars, meter)[0]
        except ChatFormatError:  # the template refused the sentinels (it checks contents)
            marked = None
        if shape is not None and not meter.budget_dependent:
            known = cache.get(shape)  # type: ignore[union-attr]
            if (known is None and len(cache) < _MAX_SHAPES) or (  # type: ignore[arg-type]
                known is not None and input_chars < known[0]
            ):
                cache[shape] = (input_chars, marked)  # type: ignore[index]
        return marked

    def render(self, messages: Sequence[Mapping[str, Any]]) -> Rendered:
        input_chars = _input_chars(messages, {}) + self.variable_chars
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
        spans = _located_spans(self, messages, text, self._markers, input_chars)
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
        template,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        control_tokens=control_tokens,
        variables=variables,
        limits=limits,
        now=now,
    )
    return renderer.render(messages)


# ---------------------------------------------------------------------------------------------
# Tokens and the loss mask


@dataclass(frozen=True, eq=False)
class EncodedDialogue:
    ids: np.ndarray  # int32 token ids of the rendered dialogue (no special tokens added)
    mask: np.ndarray  # bool per token: True = trained (label kept), False = label -100
    turns: np.ndarray  # int64 (n, 2): token range [start, end) of each assistant turn
    train_on: str

    @property
    def n_assistant_turns(self) -> int:
        """Assistant turns that are trained (0: nothing to learn, the pipeline drops it)."""
        if self.train_on == "last":
            return min(1, len(self.turns))
        return len(self.turns)

    @property
    def n_trained(self) -> int:
        return int(self.mask.sum())

    def labels(self) -> np.ndarray:
        """Token ids where trained, -100 elsewhere (the causal shift is the trainer's)."""
        return np.where(self.mask, self.ids, -100).astype(np.int32)


def _mask(n_tokens: int, turns: np.ndarray, train_on: str) -> np.ndarray:
    if train_on == "all":
        return np.ones(n_tokens, dtype=bool)
    mask = np.zeros(n_tokens, dtype=bool)
    chosen = turns[-1:] if train_on == "last" else turns
    for start, end in chosen:
        mask[start:end] = True
    return mask


def _masks(lengths: list[int], turns: list[np.ndarray], train_on: str) -> list[np.ndarray]:
    """``_mask`` of each dialogue of a batch, as views of one array (a few numpy calls per
    batch instead of per dialogue)."""
    if not lengths:
        return []
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if train_on == "all":
        flat = np.ones(int(bounds[-1]), dtype=bool)
    else:
        chosen = [t[-1:] for t in turns] if train_on == "last" else turns
        counts = np.fromiter((len(t) for t in chosen), np.int64, count=len(chosen))
        ranges = np.concatenate(chosen) if counts.sum() else np.zeros((0, 2), np.int64)
        base = np.repeat(bounds[:-1], counts)
        delta = np.zeros(int(bounds[-1]) + 1, dtype=np.int64)
        np.add.at(delta, ranges[:, 0] + base, 1)
        np.add.at(delta, ranges[:, 1] + base, -1)
        flat = np.cumsum(delta[:-1]) > 0
    return np.split(flat, bounds[1:-1])


def _check_train_on(train_on: str) -> None:
    if train_on not in TRAIN_ON:
        raise ConfigError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")


def encode_rendered(
    tokenizer: Tokenizer,
    rendered: Sequence[Rendered],
    train_on: TrainOn = "assistant",
    *,
    tokens: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> list[EncodedDialogue]:
    """Tokenize rendered dialogues in one ``encode_batch`` (parallel, with offsets) and mask.

    ``tokens``: ids and HF's character offsets already known for some dialogues (None for
    the others; ``packcli.offsets.FastOffsets``); HF encodes only the rest."""
    _check_train_on(train_on)
    known = list(tokens) if tokens is not None else [None] * len(rendered)
    missing = [i for i, t in enumerate(known) if t is None]
    if missing:
        texts = [rendered[i].text for i in missing]
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
        for i, enc in zip(missing, encodings, strict=True):
            known[i] = (
                np.asarray(enc.ids, dtype=np.int32),
                np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2),
            )
    from packcli.chat.offsets import token_turns

    spans = token_turns([t[1] for t in known], [r.assistant_spans for r in rendered])  # type: ignore[index]
    masks = _masks([len(t[0]) for t in known], spans, train_on)  # type: ignore[index]
    return [
        EncodedDialogue(ids, mask, turns, train_on)
        for (ids, _), turns, mask in zip(known, spans, masks, strict=True)  # type: ignore[misc]
    ]


def control_tokens_of(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The tokenizer's added tokens: the candidates for the end-of-turn marker."""
    return tuple(sorted(t.content for t in tokenizer.get_added_tokens_decoder().values()))


def special_tokens_from_config(config: Mapping[str, Any]) -> dict[str, str]:
    """``*_token`` entries of a ``tokenizer_config.json`` (strings or AddedToken dicts), the
    template variables transformers passes (``bos_token``, ``eos_token``...)."""
    found = {}
    for key, value in config.items():
        if isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            found[key] = value
    return found


def encode_dialogues(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    dialogues: Sequence[Sequence[Mapping[str, Any]]],
    train_on: TrainOn = "assistant",
    special_tokens: Mapping[str, str] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
) -> list[EncodedDialogue]:
    """Render (Python) then tokenize (one Rust batch) validated dialogues.

    A dialogue the template rejects raises ``ChatFormatError`` with ``index`` set to its
    position; to skip such lines instead, ``render`` each one and call ``encode_rendered``.
    """
    _check_train_on(train_on)
    rendered = render_dialogues(
        tokenizer, template, dialogues, special_tokens, limits=limits, now=now
    )
    return encode_rendered(tokenizer, [r for _, r in rendered], train_on)


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
    worker process runs (packcli/render_pool.py), without a tokenizer."""
    variables = dict(special_tokens)
    bos, eos = variables.pop("bos_token", ""), variables.pop("eos_token", "")
    rendered: list[tuple[int, Rendered]] = []
    if not dialogues:
        return rendered
    renderer = _Renderer(  # once for the batch, not once per dialogue
        template,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
        control_tokens=controls,
        variables=variables,
        limits=limits,
        now=now,
    )
    for index, messages in enumerate(dialogues):
        try:
            rendered.append((index, renderer.render(messages)))
        except ChatFormatError as exc:
            exc.index = index
            if on_error is None:
                raise
            on_error(index, exc)
    return rendered


def encode_dialogue(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    train_on: TrainOn = "assistant",
    special_tokens: Mapping[str, str] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
) -> EncodedDialogue:
    """One dialogue: token ids, loss mask and assistant turns (see the module docstring)."""
    return encode_dialogues(
        tokenizer, template, [messages], train_on, special_tokens, limits=limits, now=now
    )[0]


def truncate_at_turns(encoded: EncodedDialogue, max_len: int) -> EncodedDialogue | None:
    """``--overlong truncate`` for dialogues: keep the tokens up to the end of the last
    assistant turn that fits in ``max_len`` (its end-of-turn marker included), so no turn is
    cut in the middle; ``None`` when not even the first assistant turn fits.

    For the templates in use (prefix-stable ones), the kept tokens are what rendering the
    dialogue up to that turn would give, minus what the template writes after the marker
    (ChatML's newline). With ``train_on="last"`` the kept final turn becomes the trained one.
    """
    if len(encoded.ids) <= max_len:
        return encoded
    fits = int(np.searchsorted(encoded.turns[:, 1], max_len, side="right"))
    if fits == 0:
        return None
    cut = int(encoded.turns[fits - 1, 1])
    turns = encoded.turns[:fits]
    return EncodedDialogue(
        encoded.ids[:cut].copy(), _mask(cut, turns, encoded.train_on), turns, encoded.train_on
    )
