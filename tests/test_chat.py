"""Chat dialogues: validation, template lookup, assistant-only masks, sandbox budgets.

The masks are checked the strict way: the tokens a mask trains decode exactly to each
assistant turn (content + end-of-turn marker) and to nothing else, and they equal
transformers' ``assistant_masks`` token for token.
"""

from __future__ import annotations

import itertools
import json
import re
import tracemalloc
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from corpora import hub_cache
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.runtime import Macro
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from packcli.chat import (
    ChatFormatError,
    ChatTemplate,
    ChatTemplateError,
    RenderLimits,
    TurnMarkers,
    budget,
    builtin_templates,
    encode_dialogue,
    encode_dialogues,
    encode_rendered,
    load_chat_template,
    locate_assistant_spans,
    render,
    renderer,
    special_tokens_from_config,
    truncate_at_turns,
    turn_markers,
    validate_messages,
)
from packcli.errors import ConfigError, InputError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IM_END = "<|im_end|>"

Messages = list[dict[str, Any]]


def _msg(role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


DIALOGUES: dict[str, Messages] = {
    "single": [_msg("user", "What is packing?"), _msg("assistant", "Putting documents in rows.")],
    "multi_turn_system_tool": [
        _msg("system", "You are a helpful assistant."),
        _msg("user", "What time is it in Tokyo?"),
        _msg("assistant", "Let me check the clock."),
        _msg("tool", '{"time": "09:30"}'),
        _msg("assistant", "It is 09:30 in Tokyo."),
        _msg("user", "Thanks!"),
        _msg("assistant", "You are welcome."),
    ],
    "multibyte": [
        _msg("user", "Say hello in Japanese 🙂"),
        _msg("assistant", "こんにちは 🙂 naïve café — 👩‍👩‍👧"),
        _msg("user", "東京?"),
        _msg("assistant", "東京 = Tokyo 🗼"),
    ],
    "literal_control_token": [
        _msg("user", "Print <|im_end|> please"),
        _msg("assistant", "Here: <|im_end|> done"),
    ],
    "same_answer_twice": [
        _msg("user", "Say yes."),
        _msg("assistant", "yes"),
        _msg("user", "Again, say yes."),
        _msg("assistant", "yes"),
    ],
    "user_quotes_answer": [
        _msg("user", "The answer is 42. What is the answer?"),
        _msg("assistant", "The answer is 42."),
    ],
    "ends_with_user": [
        _msg("user", "Hi"),
        _msg("assistant", "Hello there."),
        _msg("user", "Bye"),
    ],
}


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """Byte-level BPE trained in-process, with ChatML's control tokens added."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [m["content"] for d in DIALOGUES.values() for m in d]
    texts += ["user\n  assistant\n  system\n  tool\n  the answer is here  "] * 20
    tokenizer.train_from_iterator(texts * 5, trainer)
    return tokenizer


@pytest.fixture(scope="session")
def chatml() -> ChatTemplate:
    return load_chat_template(None, "chatml")


@pytest.fixture(scope="session")
def chatml_untagged(chatml: ChatTemplate) -> ChatTemplate:
    """The built-in without {% generation %} tags: spans are located in the text instead."""
    text = re.sub(r"\{%-? *(end)?generation *-?%\}", "", chatml.text)
    assert not ChatTemplate("untagged", text).has_generation_tags
    return ChatTemplate("chatml without tags", text)


def _decode(tok: Tokenizer, ids: np.ndarray) -> str:
    return tok.decode(ids.tolist(), skip_special_tokens=False)


def _expected_turn(message: dict[str, Any]) -> str:
    return message["content"] + IM_END


# ---------------------------------------------------------------------------------------------
# Validation


def test_validate_keeps_extra_keys_and_drops_nulls() -> None:
    line = {
        "id": 7,
        "messages": [
            {"role": "user", "content": "hi", "name": "ann", "weight": None},
            {"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": {}}]},
        ],
    }
    messages = validate_messages(line)
    assert messages[0] == {"role": "user", "content": "hi", "name": "ann"}
    assert messages[1]["content"] == "" and messages[1]["tool_calls"][0]["name"] == "f"
    assert validate_messages({"conv": [_msg("user", "x")]}, field="conv") == [_msg("user", "x")]


_VALUES = st.one_of(
    st.none(), st.text(max_size=3), st.integers(), st.lists(st.integers(), max_size=1)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.one_of(st.sampled_from(["user", "assistant", "tool", "bot"]), _VALUES),
                "content": st.one_of(st.text(max_size=3), _VALUES),
            },
            optional={"name": _VALUES, "tool_calls": _VALUES, "weight": _VALUES},
        ),
        min_size=1,
        max_size=3,
    )
)
def test_validate_keeps_messages_as_the_docstring_says(raw: list[dict[str, Any]]) -> None:
    """Kept messages are the line's, nulls dropped (key order kept), an assistant's null
    content with tool calls made ""; anything else is refused with a reason."""
    try:
        got = validate_messages({"messages": raw})
    except ChatFormatError:
        assert not all(
            isinstance(m.get("role"), str)
            and m["role"] in ("system", "user", "assistant", "tool")
            and (
                isinstance(m.get("content"), str)
                or (
                    "content" in m
                    and m["content"] is None
                    and m["role"] == "assistant"
                    and bool(m.get("tool_calls"))
                )
            )
            for m in raw
        )
        return
    want = []
    for m in raw:
        kept = [(k, v) for k, v in m.items() if v is not None]
        if m["content"] is None:
            kept.append(("content", ""))  # set again after the nulls went: last
        want.append(kept)
    assert [list(m.items()) for m in got] == want


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({}, "field 'messages' is missing"),
        ({"messages": "hi"}, "field 'messages' is not a list (got string)"),
        ({"messages": []}, "field 'messages' is empty"),
        ({"messages": [_msg("user", "a"), "b"]}, "message 2 is not an object (got string)"),
        ({"messages": [_msg("user", "a"), _msg("bot", "b")]}, "message 2 has unknown role 'bot'"),
        ({"messages": [_msg("user", "a"), _msg("assistant", "b"), _msg("user", 3)]},
         "message 3 content is not a string (got int)"),
        ({"messages": [{"content": "a"}]}, "message 1 has no role"),
        ({"messages": [{"role": 1, "content": "a"}]}, "message 1 role is not a string (got int)"),
        ({"messages": [{"role": "user"}]}, "message 1 has no content"),
        ({"messages": [_msg("assistant", None)]}, "message 1 content is not a string (got null)"),
        ([1, 2], "line is not a JSON object (got list)"),
    ],
)  # fmt: skip
def test_validate_errors(line: object, reason: str) -> None:
    with pytest.raises(ChatFormatError, match=re.escape(reason)) as info:
        validate_messages(line)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InputError)


# ---------------------------------------------------------------------------------------------
# Masks


@pytest.mark.parametrize("which", ["chatml", "chatml_untagged"])
@pytest.mark.parametrize("name", sorted(DIALOGUES))
def test_mask_trains_exactly_the_assistant_turns(
    tok: Tokenizer, which: str, name: str, request: pytest.FixtureRequest
) -> None:
    template = request.getfixturevalue(which)
    messages = DIALOGUES[name]
    enc = encode_dialogue(tok, template, messages)
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert enc.n_assistant_turns == len(assistant) == len(enc.turns)
    for (start, end), message in zip(enc.turns, assistant, strict=True):
        assert _decode(tok, enc.ids[start:end]) == _expected_turn(message)
    # The mask is exactly the union of the turns, and what it leaves out holds every header,
    # system, user and tool text.
    expected = np.zeros(len(enc.ids), dtype=bool)
    for start, end in enc.turns:
        expected[start:end] = True
    assert np.array_equal(enc.mask, expected)
    text = _decode(tok, enc.ids)
    untrained = "".join(
        _decode(tok, enc.ids[~enc.mask][i : i + 1]) for i in range((~enc.mask).sum())
    )
    for message in messages:
        if message["role"] != "assistant":
            assert message["content"] in untrained
    assert untrained.count("<|im_start|>") == text.count("<|im_start|>")
    assert enc.labels()[~enc.mask].tolist() == [-100] * int((~enc.mask).sum())
    assert np.array_equal(enc.labels()[enc.mask], enc.ids[enc.mask])


@pytest.mark.parametrize("name", sorted(DIALOGUES))
def test_generation_tags_and_located_spans_agree(
    chatml: ChatTemplate, chatml_untagged: ChatTemplate, name: str
) -> None:
    tagged = render(chatml, DIALOGUES[name])
    located = render(chatml_untagged, DIALOGUES[name], control_tokens=SPECIALS)
    assert tagged.text == located.text
    assert tagged.generation_spans is not None and located.generation_spans is None
    assert tagged.assistant_spans == located.assistant_spans
    contents = [m for m in DIALOGUES[name] if m["role"] == "assistant"]
    assert [tagged.text[a:b] for a, b in tagged.assistant_spans] == [
        _expected_turn(m) for m in contents
    ]


def test_spans_are_exact_with_multibyte_text(chatml: ChatTemplate) -> None:
    messages = DIALOGUES["multibyte"]
    rendered = render(chatml, messages)
    (a1, b1), (a2, b2) = rendered.assistant_spans
    assert rendered.text[a1:b1] == "こんにちは 🙂 naïve café — 👩‍👩‍👧" + IM_END
    assert rendered.text[a2:b2] == "東京 = Tokyo 🗼" + IM_END
    assert rendered.text[:a1].endswith("<|im_start|>assistant\n")


def test_train_on_last_and_all(tok: Tokenizer, chatml: ChatTemplate) -> None:
    messages = DIALOGUES["multi_turn_system_tool"]
    every = encode_dialogue(tok, chatml, messages, "assistant")
    last = encode_dialogue(tok, chatml, messages, "last")
    everything = encode_dialogue(tok, chatml, messages, "all")
    assert np.array_equal(every.ids, last.ids) and np.array_equal(every.ids, everything.ids)
    start, end = last.turns[-1]
    assert last.n_assistant_turns == 1 and last.n_trained == end - start
    assert _decode(tok, last.ids[last.mask]) == "You are welcome." + IM_END
    assert everything.mask.all() and everything.n_assistant_turns == 3
    with pytest.raises(ConfigError, match="train_on"):
        encode_dialogue(tok, chatml, messages, "bogus")  # type: ignore[arg-type]


def test_dialogue_without_assistant_has_nothing_to_train(
    tok: Tokenizer, chatml: ChatTemplate
) -> None:
    enc = encode_dialogue(tok, chatml, [_msg("system", "s"), _msg("user", "only a question")])
    assert enc.n_assistant_turns == 0 and enc.n_trained == 0 and len(enc.ids) > 0


def test_straddling_token_is_trained(tok: Tokenizer, chatml: ChatTemplate) -> None:
    """Leading spaces merge with the header's newline into one byte-level token ("\\n ");
    it shares a character with the turn, so it is trained (transformers' rule)."""
    messages = [_msg("user", "hi"), _msg("assistant", "  the answer is here")]
    rendered = render(chatml, messages)
    enc = encode_rendered(tok, [rendered])[0]
    offsets = tok.encode(rendered.text, add_special_tokens=False).offsets
    (span_start, _), = rendered.assistant_spans  # fmt: skip
    straddling = [i for i, (a, b) in enumerate(offsets) if a < span_start < b]
    assert straddling, "the toy tokenizer should merge '\\n ' across the boundary"
    assert all(enc.mask[i] for i in straddling)
    assert _decode(tok, enc.ids[enc.mask]) == "\n  the answer is here" + IM_END


def test_masks_match_transformers(tok: Tokenizer, chatml: ChatTemplate) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    dialogues = [*DIALOGUES.values(), [_msg("user", "hi"), _msg("assistant", "  spaced out")]]
    ours = encode_dialogues(tok, chatml, dialogues, special_tokens={"eos_token": "<|endoftext|>"})
    for messages, enc in zip(dialogues, ours, strict=True):
        theirs = fast.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=chatml.text,
        )
        assert enc.ids.tolist() == theirs["input_ids"]
        assert enc.mask.astype(int).tolist() == theirs["assistant_masks"]


def test_tool_call_turn_is_trained(
    tok: Tokenizer, chatml: ChatTemplate, chatml_untagged: ChatTemplate
) -> None:
    call = {"type": "function", "function": {"name": "clock", "arguments": {"city": "Tokyo"}}}
    messages = [
        _msg("user", "Time in Tokyo?"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        _msg("tool", "09:30"),
        _msg("assistant", "09:30."),
    ]
    messages = validate_messages({"messages": messages})
    expected = '<tool_call>\n{"name": "clock", "arguments": {"city": "Tokyo"}}\n</tool_call>'
    for template in (chatml, chatml_untagged):
        enc = encode_dialogue(tok, template, messages)
        turns = [_decode(tok, enc.ids[a:b]) for a, b in enc.turns]
        assert turns == [expected + IM_END, "09:30." + IM_END]


def test_eos_ends_turns_of_a_template_without_control_tokens(tok: Tokenizer) -> None:
    template = ChatTemplate(
        "plain",
        "{% for m in messages %}{{ m.role | upper }}: {{ m.content }}"
        "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}",
    )
    messages = DIALOGUES["same_answer_twice"]
    markers = turn_markers(template, eos_token="<|endoftext|>")
    assert markers == TurnMarkers(header=None, end="<|endoftext|>")
    enc = encode_dialogue(tok, template, messages, special_tokens={"eos_token": "<|endoftext|>"})
    # "ASSISTANT: yes": byte-level BPE makes " yes" one token, which shares characters with
    # the turn, so it is trained whole (the token rule), space included.
    assert [_decode(tok, enc.ids[a:b]) for a, b in enc.turns] == [" yes<|endoftext|>"] * 2
    rendered = render(template, messages, eos_token="<|endoftext|>")
    assert [rendered.text[a:b] for a, b in rendered.assistant_spans] == ["yes<|endoftext|>"] * 2


def test_turn_markers_of_chatml(chatml_untagged: ChatTemplate) -> None:
    markers = turn_markers(chatml_untagged, control_tokens=SPECIALS)
    assert markers == TurnMarkers(header="<|im_start|>assistant\n", end=IM_END)


def test_a_turn_opener_is_not_an_end_marker(tok: Tokenizer) -> None:
    template = ChatTemplate(
        "no end marker",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    assert turn_markers(template, control_tokens=SPECIALS) == TurnMarkers(
        header="<|im_start|>assistant\n", end=None
    )
    enc = encode_dialogue(tok, template, DIALOGUES["same_answer_twice"])
    assert [_decode(tok, enc.ids[a:b]) for a, b in enc.turns] == ["yes", "yes"]


QWEN_LIKE = """\
{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{%- set call = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n' + {'name': call.name, 'arguments': call.arguments} | tojson }}
{{- '\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def test_located_turns_with_tool_calls_and_tool_responses(tok: Tokenizer) -> None:
    """A Qwen-style template without tags: default system prompt, tool responses inside a
    user turn, an assistant turn of tool calls only (no content: the header anchors it)."""
    call = {"function": {"name": "clock", "arguments": {"city": "Tokyo"}}}
    messages = [
        _msg("user", "Time in Tokyo?"),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        _msg("tool", "09:30"),
        _msg("tool", "JST"),
        _msg("assistant", "09:30 JST."),
    ]
    enc = encode_dialogue(tok, ChatTemplate("qwen-like", QWEN_LIKE), messages)
    assert [_decode(tok, enc.ids[a:b]) for a, b in enc.turns] == [
        # The header (generation prompt) ends with the newline the template writes first.
        '<tool_call>\n{"name": "clock", "arguments": {"city": "Tokyo"}}\n</tool_call>' + IM_END,
        "09:30 JST." + IM_END,
    ]


def test_template_rewriting_assistant_content_needs_generation_tags(tok: Tokenizer) -> None:
    template = ChatTemplate("upper", "{% for m in messages %}{{ m.content | upper }}{% endfor %}")
    with pytest.raises(ChatFormatError, match=r"message 2 .*generation"):
        encode_dialogue(tok, template, DIALOGUES["single"])


def test_a_hidden_turn_is_not_matched_in_a_later_one(tok: Tokenizer) -> None:
    """The first "yes" is not written; its search stops at the next assistant header
    instead of matching the second turn's "yes"."""
    template = ChatTemplate(
        "hides earlier answers",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}(hidden){% else %}{{ m.content }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    with pytest.raises(ChatFormatError, match="message 2 "):
        encode_dialogue(tok, template, DIALOGUES["same_answer_twice"])


def test_locate_without_markers_matches_contents_in_order() -> None:
    text = "U: yes\nA: yes\nU: yes again\nA: yes"
    messages = [_msg("user", "yes"), _msg("assistant", "yes"), _msg("user", "yes again")]
    messages.append(_msg("assistant", "yes"))
    spans = locate_assistant_spans(text, messages, TurnMarkers(None, None))
    assert spans == [(10, 13), (30, 33)]


def test_batch_equals_single_and_reports_the_failing_index(
    tok: Tokenizer, chatml: ChatTemplate
) -> None:
    dialogues = list(DIALOGUES.values())
    batch = encode_dialogues(tok, chatml, dialogues)
    for messages, enc in zip(dialogues, batch, strict=True):
        single = encode_dialogue(tok, chatml, messages)
        assert np.array_equal(enc.ids, single.ids) and np.array_equal(enc.mask, single.mask)
    strict = ChatTemplate(
        "strict",
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message first') }}"
        "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    ok = [_msg("system", "s"), _msg("user", "u")]
    with pytest.raises(ChatFormatError, match="rejected the dialogue: a system message first") as e:
        encode_dialogues(tok, strict, [ok, ok, [_msg("user", "u")]])
    assert e.value.index == 2


# ---------------------------------------------------------------------------------------------
# Truncation at turn boundaries


def test_truncate_at_turns(tok: Tokenizer, chatml: ChatTemplate) -> None:
    messages = DIALOGUES["multi_turn_system_tool"]
    full = encode_dialogue(tok, chatml, messages)
    ends = full.turns[:, 1].tolist()
    assert truncate_at_turns(full, len(full.ids)) is full
    cut = truncate_at_turns(full, ends[1] + 3)  # room for two turns and a bit
    assert cut is not None and len(cut.ids) == ends[1]
    assert np.array_equal(cut.ids, full.ids[: ends[1]])
    assert np.array_equal(cut.mask, full.mask[: ends[1]]) and cut.n_assistant_turns == 2
    assert _decode(tok, cut.ids).endswith("It is 09:30 in Tokyo." + IM_END)
    # Prefix-stable template: the cut equals rendering the dialogue up to that turn.
    prefix = encode_dialogue(tok, chatml, messages[:5])
    assert np.array_equal(cut.ids, prefix.ids[: len(cut.ids)])
    assert truncate_at_turns(full, ends[0] - 1) is None
    last = truncate_at_turns(encode_dialogue(tok, chatml, messages, "last"), ends[1])
    assert (
        last is not None and _decode(tok, last.ids[last.mask]) == "It is 09:30 in Tokyo." + IM_END
    )


# ---------------------------------------------------------------------------------------------
# Finding the template


def _tokenizer_folder(tmp_path: Path, tok: Tokenizer, config: dict | None = None) -> Path:
    tok.save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_builtin_and_override_forms(tmp_path: Path, chatml: ChatTemplate) -> None:
    assert "chatml" in builtin_templates()
    assert chatml.source == "built-in chatml" and chatml.has_generation_tags
    file = tmp_path / "mine.jinja"
    file.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(None, str(file)).text == file.read_text()
    inline = load_chat_template(None, "{{ messages[0].content }}")
    assert inline.source == "inline template"
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"chat_template": "{{ 'x' }}"}))
    assert load_chat_template(None, str(config)).text == "{{ 'x' }}"


def test_lookup_beside_the_tokenizer(tmp_path: Path, tok: Tokenizer) -> None:
    folder = _tokenizer_folder(tmp_path, tok, {"chat_template": "{{ 'from config' }}"})
    assert load_chat_template(str(folder), None).text == "{{ 'from config' }}"
    assert load_chat_template(str(folder / "tokenizer.json"), None).text == "{{ 'from config' }}"
    (folder / "chat_template.jinja").write_text("{{ 'from jinja file' }}")
    assert load_chat_template(str(folder), None).text == "{{ 'from jinja file' }}"
    # --chat-template still wins over the tokenizer's own.
    assert load_chat_template(str(folder), "chatml").source == "built-in chatml"


def test_lookup_in_a_hub_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer given as a Hub repo id: its chat template and config come through
    huggingface_hub (its cache here; conftest keeps every test offline), the .jinja file
    winning over the config's string as beside a local tokenizer."""
    import huggingface_hub.constants

    from packcli.tokenize.tokenizer import _hub_config, hub_file

    config = {"chat_template": "{{ 'from config' }}", "eos_token": "</s>"}
    cache = tmp_path / "hub"
    config_file = {"tokenizer_config.json": json.dumps(config).encode()}
    jinja_file = {"chat_template.jinja": b"{{ 'from jinja file' }}"}
    hub_cache(cache, "models", "packcli/cfg-only", config_file)
    hub_cache(cache, "models", "packcli/with-jinja", {**config_file, **jinja_file})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert load_chat_template("packcli/cfg-only", None).text == "{{ 'from config' }}"
    assert load_chat_template("packcli/with-jinja", None).text == "{{ 'from jinja file' }}"
    assert _hub_config("packcli/cfg-only") == config
    assert hub_file("packcli/cfg-only", "chat_template.jinja") is None
    assert _hub_config("packcli/absent") == {}
    with pytest.raises(
        ChatTemplateError, match=r"tokenizer_config\.json of Hub repo packcli/absent"
    ):
        load_chat_template("packcli/absent", None)


def test_named_templates_and_stem_config(tmp_path: Path, tok: Tokenizer) -> None:
    named = [
        {"name": "default", "template": "{{ 'main' }}"},
        {"name": "tool_use", "template": "{{ 'tools' }}"},
    ]
    folder = _tokenizer_folder(tmp_path, tok, {"chat_template": named})
    assert load_chat_template(str(folder), None).text == "{{ 'main' }}"
    assert load_chat_template(str(folder), "tool_use").text == "{{ 'tools' }}"
    other = tmp_path / "other"
    other.mkdir()
    tok.save(str(other / "mytok.json"))
    (other / "mytok_config.json").write_text(json.dumps({"chat_template": "{{ 'stem' }}"}))
    assert load_chat_template(str(other / "mytok.json"), None).text == "{{ 'stem' }}"
    (other / "mytok_config.json").write_text(json.dumps({"chat_template": named[1:]}))
    with pytest.raises(ChatTemplateError, match="none named 'default'"):
        load_chat_template(str(other / "mytok.json"), None)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (None, r"no chat template found \(looked for .*chat_template\.jinja"),
        ("nope", "unknown chat template 'nope'.*chatml"),
        ("missing/t.jinja", "chat template file not found"),
        ("{% for %}", "syntax error on line 1"),
        ("{% include 'x' %}", r"uses \{% include %\}"),
        ("{% extends 'base' %}", r"uses \{% extends %\}"),
        ("{% from 'x' import y %}", "uses"),
        ("{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}", "top level"),
    ],
)
def test_template_errors(
    tmp_path: Path, tok: Tokenizer, override: str | None, message: str
) -> None:
    folder = _tokenizer_folder(tmp_path, tok)
    with pytest.raises(ChatTemplateError, match=message):
        load_chat_template(str(folder), override)


def test_empty_template_is_refused(tmp_path: Path, tok: Tokenizer) -> None:
    folder = _tokenizer_folder(tmp_path, tok, {"chat_template": "  "})
    with pytest.raises(ChatTemplateError, match="is empty"):
        load_chat_template(str(folder), None)


def test_special_tokens_from_config() -> None:
    config = {
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "</s>",
        "pad_token": None,
        "model_max_length": 10,
    }
    assert special_tokens_from_config(config) == {"bos_token": "<s>", "eos_token": "</s>"}


def test_strftime_now_is_pinnable() -> None:
    template = ChatTemplate("date", "{{ strftime_now('%d %b %Y') }}")
    rendered = render(template, [_msg("user", "hi")], now=datetime(2024, 7, 26))
    assert rendered.text == "26 Jul 2024"


def test_generation_prompt(chatml: ChatTemplate) -> None:
    rendered = render(chatml, [_msg("user", "hi")], add_generation_prompt=True)
    assert rendered.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# Jinja features real templates use (macros with caller, loop helpers and controls, recursive
# loops, namespaces, filters, % and str.format, set blocks...): the guards must not change
# a single character of the output.
FEATURES = """\
{%- set ns = namespace(count=0, last='') -%}
{%- macro show(m, prefix='') -%}{{ prefix }}[{{ m.role }}]
{{ caller() if caller is defined else '' }}{{ m.content | trim }}{%- endmacro -%}
{%- for m in messages if m.role != 'tool' -%}
{%- set ns.count = ns.count + 1 -%}
{%- if m.role == 'assistant' and loop.last %}LAST {% endif -%}
{{ loop.index }}/{{ loop.length }} {{ loop.cycle('odd', 'even') }} {{ show(m, prefix='>') }}
{%- if m.content.startswith('Wh') %} (question: {{ m.content.split('?')[0][:10] }}){% endif %}
{%- if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}
{%- if m.role == 'system' %}{% continue %}{% endif %}
{{ '%s-%d' % (m.role, loop.index0) }} {{ '{}:{}'.format(m.role, m.content|length) }}
{% endfor -%}
{%- call(x) show(messages[0]) %}called{% endcall %}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' | ') }}
{{ messages[::-1] | map(attribute='role') | list | tojson }}
{{ {'a': 1, 'b': [1, 2]} | tojson(indent=2) }}
{{ dict(x=1, y='two') | dictsort | list }}
{%- filter upper %} filtered {{ ns.count }}{% endfilter %}
{% for k, v in {'k1': 'v1'} | items %}{{ k }}={{ v }}{% endfor %}
{% for item in [[1, [2]], [3]] recursive %}{% if item is iterable %}({{ loop(item) }})
{%- else %}{{ item }}{% endif %}{% endfor %}
{{ range(5) | list | sum }} {{ [3, 1, 2] | sort | first }} {{ 'abc' | upper | reverse }}
{{ 7 // 2 }} {{ 2 ** 10 }} {{ 'ab' * 3 }}
{% for i in range(10) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}{% endfor %}
{{ messages | length is divisibleby(2) }} {{ (messages | last).content is string }}
{{ none is none }}
{{ "x" ~ 1 ~ none }} {{ [1, 2] + [3] }} {{ 'a,b' | replace(',', ';') }} {{ 'word ' | center(9) }}|
{%- set block %}inner {{ messages | length }}{% endset %}
{{ block | indent(2, true) }} {{ 3.14159 | round(2) }} {{ '%.1f' | format(2.25) }}
"""


def test_guards_do_not_change_the_output_of_real_features() -> None:
    import jinja2.sandbox

    from packcli.chat.sandbox import tojson

    messages = [
        _msg("system", "sys "),
        _msg("user", "What is it? really"),
        _msg("assistant", "It."),
        _msg("tool", "t"),
        _msg("user", "ok"),
        _msg("assistant", "fine"),
    ]
    plain_env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    plain_env.filters["tojson"] = tojson
    expected = plain_env.from_string(FEATURES).render(messages=messages, tools=None)
    rendered = render(ChatTemplate("features", FEATURES), messages)
    assert rendered.text == expected
    assert "(1(2))(3)" in expected and "LAST 5/5" in expected  # the features did run


# ---------------------------------------------------------------------------------------------
# Hostile templates: each stops quickly with a clear error

HOSTILE = {
    "attribute escape": (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "broke the sandbox: access to attribute '__class__'",
    ),
    "cycler globals": ("{{ cycler.__init__.__globals__ }}", "broke the sandbox"),
    "namespace underscore": ("{% set ns = namespace(_x=1) %}", "underscore"),
    "nested loop": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "ran more than .* operations",
    ),
    "exponential macro": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}",
        "ran more than .* operations",
    ),
    "deep recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
    "huge output": (
        "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
        "wrote more than .* characters",
    ),
    "string multiply": ("{{ 'x' * 10 ** 9 }}", "build a value of 1,000,000,000 characters"),
    "doubling concat": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "build a value",
    ),
    "center": ("{{ 'x' | center(10 ** 9) }}", "build a value"),
    "str method": ("{{ 'x'.ljust(10 ** 9) }}", "build a value"),
    "percent width": ("{{ '%0999999999d' % 1 }}", "build a value"),
    "format width": ("{{ '{:>999999999}'.format(1) }}", "build a value"),
    "power": ("{{ 7 ** 1000000 }}", "integer of over"),
    "aliased list": ("{% set a = ['x' * 100000] * 1000 %}{{ [a] * 1000 }}", "build a value"),
    "join separator": ("{{ range(100000) | join('x' * 100000) }}", "build a value"),
    "self-referencing namespace": (
        "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
        "build a value",
    ),
    "fromkeys aliasing": ("{{ dict.fromkeys(range(100000), 'x' * 100000) }}", "build a value"),
}


# What a refusal may cost, in work rather than seconds. Memory: no value may exceed the value
# limit (characters or items); 16 bytes per item covers a container's own overhead. Calls: a
# macro call costs ~20x a loop step (``packcli.chat.sandbox``), so the step budget pays for
# at most budget / 16 of them before the render stops.
BYTES_PER_ITEM = 16
MACRO_CALL_STEPS = 16
# tracemalloc slows the render several times over; the default 5 s backstop could then stop
# a template the step budget would have, so it is moved out of the way (a budget that stopped
# working then fails the test after a minute instead of on a slow machine's luck).
SLOW_CLOCK = RenderLimits(seconds=60)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_fails_fast(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget stops it (the clock's message, "ran longer than", matches none of those
    expected), before the costly operation runs: its memory and macro calls stay within
    what the budgets allow."""
    text, message = HOSTILE[name]
    meters: list[renderer.Meter] = []

    class RecordedMeter(renderer.Meter):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            meters.append(self)

    macro_calls = 0
    invoke = Macro._invoke

    def counted_invoke(self: Macro, *args: Any) -> Any:
        nonlocal macro_calls
        macro_calls += 1
        return invoke(self, *args)

    monkeypatch.setattr(renderer, "Meter", RecordedMeter)
    monkeypatch.setattr(Macro, "_invoke", counted_invoke)
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=message):
            render(ChatTemplate(name, text), DIALOGUES["single"], limits=SLOW_CLOCK)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (meter,) = meters
    steps = meter.limits.steps + meter.limits.steps_per_char * meter.input_chars
    assert peak < BYTES_PER_ITEM * meter.value_limit, f"{peak:,} bytes allocated"
    assert macro_calls <= steps // MACRO_CALL_STEPS


def test_file_read_is_impossible() -> None:
    for text in ("{% include '/etc/passwd' %}", "{% import '/etc/passwd' as p %}"):
        with pytest.raises(ChatTemplateError, match="self-contained"):
            render(ChatTemplate("read", text), DIALOGUES["single"])


def test_wall_clock_backstop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock stops a render the other budgets allow; a clock that advances one second per
    look makes it independent of the machine's speed."""
    looks = itertools.count()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: float(next(looks))))
    loop = ChatTemplate("loop", "{% for i in range(100000) %}{% endfor %}")
    limits = RenderLimits(steps=10**9, seconds=5)
    with pytest.raises(ChatTemplateError, match=r"ran longer than 5 s"):
        render(loop, DIALOGUES["single"], limits=limits)
    # One look at the start, then one every 17 steps: past the deadline at the sixth.
    assert next(looks) == 7


def test_budgets_grow_with_the_dialogue(tok: Tokenizer, chatml: ChatTemplate) -> None:
    """A long, legitimate dialogue renders well inside its budgets."""
    messages = [_msg("user" if i % 2 == 0 else "assistant", "word " * 200) for i in range(400)]
    rendered = render(chatml, messages, limits=RenderLimits(steps=0, output=0, work=0))
    assert len(rendered.assistant_spans) == 200
