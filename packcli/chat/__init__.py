"""The chat stage: dialogues (``--format chat``) and preference pairs (``--format
preference``) in, token ids with loss masks out.

Why this stage exists: an SFT row must train on what the assistant says and on nothing
else, and the only faithful source for "what the assistant says" is the chat template's
rendered text, not a guess about role headers. So a dialogue (one jsonl line, ``{"messages":
[...]}``) is rendered once with the model's own Jinja chat template, the character spans of
the assistant turns are taken from that rendering, and the spans are mapped onto tokens
through the tokenizer's character offsets.

The data flow, one file per step:

- ``validate.py``: a parsed jsonl line -> messages (or a preference pair), or
  ``ChatFormatError``;
- ``templates.py``: finding the chat template (``--chat-template``, beside the tokenizer,
  the Hub, built-ins) and the special tokens it is given;
- ``budget.py``, ``size_checks.py``, ``sandbox.py``, ``execute.py``: the jinja2 sandbox a
  template runs in (budgets and their meter, size checks before one-call operations, the
  metered environment, compiling and running with errors turned into messages);
- ``markers.py``, ``spans.py``: the template's turn markers, and where each assistant turn
  lies in the rendered text;
- ``renderer.py``: rendering a batch of dialogues (text and assistant spans);
  ``render_pool.py``: the same on worker processes for large inputs;
- ``offsets.py``: tokens' character offsets derived from a fast backend's ids, and
  character spans mapped to token ranges;
- ``mask.py``: rendered text -> token ids, loss masks, and ``--overlong truncate`` at turns;
- ``encoder.py``: the chat stage as the pipeline runs it: batches of dialogues -> Arrow
  record batches of ids and labels, with the length policy and ``--bos``/``--eos``;
- ``preference.py``: the same for preference pairs, one document per pair.

Names are loaded on first use (PEP 562): importing ``packcli.chat.offsets`` from the
pipeline, which every run does, must not import jinja2 and build the sandbox for text runs.
Each public name is listed once, in ``_HOMES``; code that wants its static type imports it
from its module.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_HOMES = {
    "RenderLimits": "budget",
    "ChatFormatError": "errors",
    "ChatTemplateError": "errors",
    "TurnMarkers": "markers",
    "turn_markers": "markers",
    "EncodedDialogue": "mask",
    "encode_dialogue": "mask",
    "encode_dialogues": "mask",
    "encode_rendered": "mask",
    "truncate_at_turns": "mask",
    "Rendered": "renderer",
    "control_tokens_of": "renderer",
    "render": "renderer",
    "render_batch": "renderer",
    "render_dialogues": "renderer",
    "locate_assistant_spans": "spans",
    "ChatTemplate": "templates",
    "builtin_templates": "templates",
    "load_chat_template": "templates",
    "special_tokens_from_config": "templates",
    "validate_messages": "validate",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:  # a submodule (``from packcli.chat import render_pool``) is imported then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
