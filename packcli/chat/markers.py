"""How a template opens and closes an assistant turn, found by rendering probe dialogues.

Why: a template without ``{% generation %}`` tags says nothing about where a turn starts
and ends, so the assistant header and the end-of-turn marker are read off the template's own
rendering of a tiny probe dialogue (once per template, cached); ``packcli.chat.spans`` then
looks for them only in the template's text.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packcli.chat.budget import Meter, RenderLimits
from packcli.chat.errors import ChatFormatError, ChatTemplateError
from packcli.chat.execute import compile_template, run_compiled
from packcli.chat.templates import ChatTemplate


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
    compiled = compile_template(template.text, template.source)
    # What jinja's generate() passes: the template's globals under the variables.
    parent = dict(compiled.template.globals, **context, add_generation_prompt=prompt)
    return run_compiled(compiled, template.source, parent, Meter(_PROBE_LIMITS, 0, None))[0]


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
