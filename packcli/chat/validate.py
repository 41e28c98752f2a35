"""One parsed jsonl line in, a dialogue (or a preference pair) ready for the template out.

Why apart from rendering: a malformed line is the input's fault and goes to the bad-line
policy (``ChatFormatError`` names what is wrong; the reader prefixes ``file:line``), before
any template runs on it.

Preference pairs come in TRL's DPOTrainer forms:

* explicit prompt, strings: ``{"prompt": str, "chosen": str, "rejected": str}``;
* explicit prompt, messages: ``prompt`` a message list ending with a non-assistant message,
  ``chosen``/``rejected`` message lists starting with the assistant's answer;
* implicit prompt: only ``chosen`` and ``rejected``, whole dialogues (or strings) sharing a
  prefix. The prompt is what they share, found as TRL's ``extract_prompt`` does (the first
  message, or character, where they differ; the messages before it are the prompt).

``validate_pair`` turns all three into an explicit prompt; ``packcli.chat.preference``
renders and tokenizes them.
"""

from __future__ import annotations

from typing import Any

from packcli.chat.errors import ChatFormatError

ROLES = ("system", "user", "assistant", "tool")


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
        # The usual message (a dict, a known role, string content, no nulls) passes every
        # check below unchanged, so it is kept as it is: half the cost of a dialogue here.
        if (
            type(message) is dict
            and type(message.get("content")) is str
            and message.get("role") in ROLES
            and None not in message.values()
        ):
            messages.append(message)
            continue
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


SIDES = ("chosen", "rejected")


def _messages(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    try:
        return validate_messages(obj, field=key)
    except ChatFormatError as exc:
        reason = str(exc)
        raise ChatFormatError(
            reason if reason.startswith("field") else f"field {key!r}: {reason}"
        ) from exc


def _extract_text_prompt(chosen: str, rejected: str) -> int:
    """Where the shared prompt of two strings ends, as TRL's ``extract_prompt``: the first
    differing character, one back when a space precedes it (the space starts the answer);
    when neither differs within the shorter, its last character starts the answers."""
    n = min(len(chosen), len(rejected))
    idx = n - 1
    for i in range(n):
        if chosen[i] != rejected[i]:
            idx = i - 1 if i > 0 and chosen[i - 1] == " " else i
            break
    return max(idx, 0)


def _extract_message_prompt(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]) -> int:
    """Number of shared leading messages (the implicit prompt), as TRL's ``extract_prompt``:
    the first message where they differ, else all but the shorter one's last."""
    n = min(len(chosen), len(rejected))
    for i in range(n):
        if chosen[i] != rejected[i]:
            return i
    return n - 1


def validate_pair(obj: object) -> dict[str, Any]:
    """Check one parsed jsonl line and return the pair, prompt explicit: ``{"prompt",
    "chosen", "rejected", "implicit"}``, all strings or all message lists.

    Raises ``ChatFormatError`` (a ``ValueError``: the reader names ``file:line`` and applies
    ``--on-bad-line``) for a missing field, mixed kinds, an empty response, a malformed
    message, a response that does not start with the assistant, or an implicit prompt that
    is not a shared prefix ending before the assistant's answer. ``chosen == rejected`` is
    allowed (the report counts it as ``identical``).
    """
    if not isinstance(obj, dict):
        raise ChatFormatError(f"line is not a JSON object (got {_kind(obj)})")
    for key in SIDES:
        if key not in obj:
            raise ChatFormatError(f"field {key!r} is missing")
    implicit = "prompt" not in obj
    keys = SIDES if implicit else ("prompt", *SIDES)
    kinds = {key: _kind(obj[key]) for key in keys}
    if set(kinds.values()) == {"string"}:
        return _string_pair(obj, implicit)
    if set(kinds.values()) != {"list"}:
        got = ", ".join(f"{key} {kind}" for key, kind in kinds.items())
        raise ChatFormatError(
            f"fields {', '.join(keys)} must be all strings or all message lists (got {got})"
        )
    return _message_pair({key: _messages(obj, key) for key in keys}, implicit)


def _string_pair(obj: dict[str, Any], implicit: bool) -> dict[str, Any]:
    """``validate_pair`` of strings: an implicit prompt is their shared start."""
    for key in SIDES:
        if not obj[key]:
            raise ChatFormatError(f"field {key!r} is empty")
    chosen, rejected = obj["chosen"], obj["rejected"]
    if not implicit:
        return {"prompt": obj["prompt"], "chosen": chosen, "rejected": rejected, "implicit": False}
    cut = _extract_text_prompt(chosen, rejected)
    return {
        "prompt": chosen[:cut],
        "chosen": chosen[cut:],
        "rejected": rejected[cut:],
        "implicit": True,
    }


def _message_pair(lists: dict[str, list[dict[str, Any]]], implicit: bool) -> dict[str, Any]:
    """``validate_pair`` of validated message lists: an implicit prompt is the messages both
    share, and each response starts with the assistant's answer."""
    if implicit:
        chosen, rejected = lists["chosen"], lists["rejected"]
        cut = _extract_message_prompt(chosen, rejected)
        if cut == 0:
            raise ChatFormatError(
                "chosen and rejected share no prompt (they differ at message 1): give "
                "'prompt' explicitly or start both with the same messages"
            )
        for key, messages in (("chosen", chosen), ("rejected", rejected)):
            role = messages[cut].get("role")
            if role != "assistant":
                raise ChatFormatError(
                    f"chosen and rejected differ at message {cut + 1}, which in {key} is a "
                    f"{role} message: an implicit prompt is the messages both share, followed "
                    "by the assistant's answers"
                )
        prompt, lists = chosen[:cut], {"chosen": chosen[cut:], "rejected": rejected[cut:]}
    else:
        prompt = lists["prompt"]
        if prompt[-1].get("role") == "assistant":
            raise ChatFormatError(
                "prompt ends with an assistant message: the responses answer it, so it must "
                "end with a user, system or tool message"
            )
    for key in SIDES:
        role = lists[key][0].get("role")
        if role != "assistant":
            raise ChatFormatError(
                f"field {key!r} starts with a {role} message: a response starts with the "
                "assistant's answer (put earlier messages in 'prompt')"
            )
    return {
        "prompt": prompt,
        "chosen": lists["chosen"],
        "rejected": lists["rejected"],
        "implicit": implicit,
    }
