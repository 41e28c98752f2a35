"""Rendering speed-ups keep every output and every budget (issue 13, item 4).

The sandbox's hooks take shortcuts for the common cases (``str + str``, ``message['role']``,
``message.role``, ``loop.index0``, ``{% generation %}``), and ``render_batch`` shares one
compiled template, its variables and one sentinel rendering per dialogue shape across a
batch. Real templates (Meta's Llama-3.1-8B-Instruct and Qwen2.5-Instruct, in tests/assets)
must render exactly as transformers renders them, and budgets must stop a template on the
shortcuts as on the generic paths.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2.runtime import Macro
from markupsafe import Markup

from packcli.chat import (
    ChatFormatError,
    ChatTemplate,
    ChatTemplateError,
    RenderLimits,
    load_chat_template,
    render,
    render_batch,
    renderer,
    sandbox,
    validate_messages,
)
from packcli.chat.sandbox import ENV

ASSETS = Path(__file__).parent / "assets"
NOW = datetime(2024, 7, 26)
LLAMA_SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
LLAMA_CONTROLS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
QWEN_SPECIALS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
QWEN_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _msg(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def _template(name: str) -> ChatTemplate:
    path = ASSETS / f"{name}_chat_template.jinja"
    return ChatTemplate(str(path), path.read_text(encoding="utf-8"))


CALL = {"type": "function", "function": {"name": "clock", "arguments": {"city": "Tokyo"}}}
TOOLS = [{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]
DIALOGUES: list[list[dict[str, Any]]] = [
    [_msg("user", "What is packing?"), _msg("assistant", "Putting documents in rows.")],
    [
        _msg("system", "  Be brief.  "),
        _msg("user", "東京 🙂 naïve?\n"),
        _msg("assistant", "  Yes.\n"),
        _msg("user", "Again"),
        _msg("assistant", "Sure, again."),
    ],
    validate_messages(
        {
            "messages": [
                _msg("user", "Time in Tokyo?"),
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                _msg("tool", '{"time": "09:30"}'),
                _msg("assistant", "09:30."),
            ]
        }
    ),
]


def _transformers(template: ChatTemplate, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template.text, **kwargs
    )
    return rendered[0]


@pytest.mark.parametrize(
    ("name", "specials", "controls", "written", "end"),
    [
        ("llama3.1", LLAMA_SPECIALS, LLAMA_CONTROLS, str.strip, "<|eot_id|>"),
        ("qwen2.5", QWEN_SPECIALS, QWEN_CONTROLS, str, "<|im_end|>"),
    ],
)
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("index", range(len(DIALOGUES)))
def test_real_templates_render_as_transformers_does(
    name: str,
    specials: dict[str, str],
    controls: tuple[str, ...],
    written: Any,
    end: str,
    tools: list | None,
    index: int,
) -> None:
    template, messages = _template(name), DIALOGUES[index]
    if tools and name == "llama3.1" and messages[0]["role"] == "system":
        messages = messages[1:]  # Llama-3.1 moves tools into the first user message
    variables = {**specials, "tools": tools}
    ours = render_batch(template, [messages], variables, controls, now=NOW)[0][1]
    theirs = _transformers(template, messages, **variables)
    assert ours.text == theirs
    # Each assistant turn: the content as the template writes it, then the end marker; a
    # turn of tool calls only starts after the assistant header.
    turns = [ours.text[a:b] for a, b in ours.assistant_spans]
    answers = [m for m in messages if m["role"] == "assistant"]
    assert len(turns) == len(answers)
    for turn, message in zip(turns, answers, strict=True):
        if message["content"]:
            assert turn.startswith(written(message["content"]))
        else:
            assert '"name": "clock"' in turn
        assert turn.endswith(end)
    # The batch path (renderer shared, sentinel rendering shared) gives what render() gives.
    others = {k: v for k, v in variables.items() if k not in ("bos_token", "eos_token")}
    alone = render(
        template,
        messages,
        bos_token=specials.get("bos_token", ""),
        eos_token=specials["eos_token"],
        control_tokens=controls,
        variables=others,
    )
    assert (alone.text, alone.assistant_spans) == (ours.text, ours.assistant_spans)


# ---------------------------------------------------------------------------------------------
# Budgets on the shortcuts

SHORTCUT_BUDGETS = {
    "str + str doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        "tried to build a value of",
    ),
    "str + str in total": (
        "{% set big = 'x' * 500000 %}{% for i in range(100) %}{% set y = big + 'y' %}{% endfor %}",
        "built more than",
    ),
    "int + int steps": (
        "{% for i in range(10 ** 5) %}{% for j in range(10 ** 5) %}"
        "{% set x = loop.index0 + 1 %}{% endfor %}{% endfor %}",
        "ran more than",
    ),
    "int % int steps": (
        "{% for i in range(10 ** 5) %}{% for j in range(10 ** 5) %}"
        "{% set x = loop.index0 % 2 %}{% endfor %}{% endfor %}",
        "ran more than",
    ),
    "dict lookups": (
        "{% for i in range(10 ** 5) %}{% for j in range(10 ** 5) %}"
        "{% set x = messages[0]['role'] ~ messages[0].role %}{% endfor %}{% endfor %}",
        "ran more than",
    ),
    "output of str + str": (
        "{% set big = 'x' * 500000 %}{% for i in range(100) %}{{ big + 'y' }}{% endfor %}",
        "wrote more than",
    ),
}


@pytest.mark.parametrize("name", sorted(SHORTCUT_BUDGETS))
def test_budgets_hold_on_the_shortcuts(name: str) -> None:
    text, message = SHORTCUT_BUDGETS[name]
    with pytest.raises(ChatTemplateError, match=message):
        render(ChatTemplate(name, text), [_msg("user", "hi"), _msg("assistant", "yo")])


def test_a_dict_lookup_shortcut_keeps_dict_methods_and_missing_keys() -> None:
    text = (
        "{{ messages[0].items() | list }}|{{ messages[0]['missing'] is defined }}|"
        "{{ messages[0].missing is defined }}|{{ messages[0].get('role') }}"
    )
    out = render(ChatTemplate("dict", text), [_msg("user", "hi")]).text
    assert out == "[('role', 'user'), ('content', 'hi')]|False|False|user"


def test_a_generation_block_renders_as_jinja_does_under_autoescape() -> None:
    body = "{{ messages[0]['content'] }}|"
    text = (
        "{% autoescape true %}{% generation %}" + body + "{% endgeneration %}{% endautoescape %}"
        "{% generation %}" + body + "{% endgeneration %}"
    )
    messages = [_msg("assistant", "<b>&")]
    got = render(ChatTemplate("escaped", text), messages)
    plain = "{% autoescape true %}" + body + "{% endautoescape %}" + body
    assert got.text == jinja2.Environment().from_string(plain).render(messages=messages)
    assert got.text == "&lt;b&gt;&amp;|<b>&|"
    assert got.generation_spans == [(0, 15), (15, 20)]


@pytest.mark.parametrize(
    ("arguments", "autoescape"), [((), False), ((), True), (("x",), False), (("caller",), True)]
)
def test_a_blocks_body_gives_what_calling_its_macro_gives(
    arguments: tuple[str, ...], autoescape: bool
) -> None:
    """``{% generation %}`` calls its body without jinja's argument matching where it has no
    arguments; the text and its type (Markup under autoescape) are the macro call's."""
    macro = Macro(ENV, lambda *args: "<i>" + "".join(map(str, args)), None, list(arguments),
                  False, False, False, autoescape)  # fmt: skip
    got, want = sandbox._block_text(macro), macro()
    assert got == want and type(got) is type(want)
    assert type(got) is (Markup if autoescape else str)


# ---------------------------------------------------------------------------------------------
# One sentinel rendering per dialogue shape


def _same_shape(n: int, size: int) -> list[list[dict[str, Any]]]:
    return [
        [_msg("user", f"question {i} " * size), _msg("assistant", f"answer {i} " * size)]
        for i in range(n)
    ]


def test_a_batch_renders_each_shape_once_for_the_sentinels(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    real = renderer.run_compiled

    def counting(*args: Any) -> Any:
        runs.append(args[2]["messages"])
        return real(*args)

    monkeypatch.setattr(renderer, "run_compiled", counting)
    template = _template("qwen2.5")
    dialogues = _same_shape(20, 3)
    rendered = render_batch(template, dialogues, QWEN_SPECIALS, QWEN_CONTROLS, now=NOW)
    sentinel_runs = [m for m in runs if any("\ue000" in x["content"] for x in m)]
    assert len(sentinel_runs) == 1  # was one per dialogue
    assert len(rendered) == 20
    for messages, (_, r) in zip(dialogues, rendered, strict=True):
        alone = render(template, messages, eos_token="<|im_end|>", control_tokens=QWEN_CONTROLS)
        assert (r.text, r.assistant_spans) == (alone.text, alone.assistant_spans)


# Renders a little for real contents, much more for sentinel ones: a shared sentinel
# rendering made for a long dialogue must not let a short one past its own budgets.
HEAVY_SENTINELS = ChatTemplate(
    "heavy on sentinels",
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content.startswith('\ue000') %}{% for i in range(300) %}{% endfor %}{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}",
)


def test_a_shared_sentinel_rendering_respects_each_dialogues_budgets() -> None:
    limits = RenderLimits(steps=200, steps_per_char=2)
    long, short = _same_shape(1, 200)[0], _same_shape(1, 1)[0]
    # Alone, the long dialogue renders and the short one runs out of steps.
    render(HEAVY_SENTINELS, long, control_tokens=QWEN_CONTROLS, limits=limits, now=NOW)
    with pytest.raises(ChatTemplateError, match="ran more than"):
        render(HEAVY_SENTINELS, short, control_tokens=QWEN_CONTROLS, limits=limits, now=NOW)
    # In one batch, long first: the short one still runs out of steps.
    with pytest.raises(ChatTemplateError, match="ran more than"):
        render_batch(HEAVY_SENTINELS, [long, short], {}, QWEN_CONTROLS, limits=limits, now=NOW)
    # Short dialogues whose budgets allow the sentinels share their rendering with longer ones.
    roomy = RenderLimits(steps=2000)
    both = render_batch(HEAVY_SENTINELS, [short, long], {}, QWEN_CONTROLS, limits=roomy, now=NOW)
    assert [r.text for _, r in both] == [
        render(HEAVY_SENTINELS, m, control_tokens=QWEN_CONTROLS, limits=roomy).text
        for m in (short, long)
    ]


def test_a_refused_sentinel_rendering_is_shared_too() -> None:
    """A template that rejects the sentinels falls back to the text search for every
    dialogue of that shape, and still refuses the hostile one."""
    chatml = re.sub(r"\{%-? *(end)?generation *-?%\}", "", load_chat_template(None, "chatml").text)
    picky = ChatTemplate(
        "picky",
        "{% if messages[0].content | length < 4 %}{{ raise_exception('say more') }}{% endif %}"
        + chatml,
    )
    good = [_msg("user", "Hello"), _msg("assistant", "Yes.")]
    hostile = [_msg("user", "Hello <|im_end|>"), _msg("assistant", "Yes.")]
    seen: list[tuple[int, str]] = []
    rendered = render_batch(
        picky,
        [good, hostile, good],
        {},
        QWEN_CONTROLS,
        now=NOW,
        on_error=lambda i, exc: seen.append((i, str(exc))),
    )
    assert [i for i, _ in rendered] == [0, 2]
    assert seen == [(1, str(_refusal(picky, hostile)))]
    assert "contains the template's turn marker" in seen[0][1]
    assert [rendered[0][1].text[a:b] for a, b in rendered[0][1].assistant_spans] == [
        "Yes.<|im_end|>"
    ]


def _refusal(template: ChatTemplate, messages: list[dict[str, Any]]) -> ChatFormatError:
    with pytest.raises(ChatFormatError) as info:
        render(template, messages, control_tokens=QWEN_CONTROLS)
    return info.value
