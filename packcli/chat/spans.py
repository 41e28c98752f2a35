"""Where the assistant turns lie in a rendered dialogue, as character spans.

Spans, in order of preference:

1. ``{% generation %}...{% endgeneration %}`` blocks in the template (transformers'
   ``AssistantTracker`` convention): exactly those characters are trained (the sandbox
   records them while rendering, ``packcli.chat.sandbox``).
2. Otherwise each assistant turn is located in the rendered text. A turn starts after the
   assistant header (the template's generation prompt, e.g. ``<|im_start|>assistant\\n``,
   found by rendering a probe dialogue once per template), or at its content when the
   template has no header, and ends after the template's end-of-turn marker (see
   ``packcli.chat.markers``). Reasoning, the content and tool calls that the template writes
   inside the turn are all trained. Where each message's content lies is not searched for (a
   user message holding ``<|im_start|>assistant\\n`` and a fake answer would then move the
   trained span into the user's text): the dialogue is rendered a second time with every
   content replaced by a sentinel (a Private Use Area character absent from the data, around
   the message's index), so the sentinels' places give each content's exact place, and turn
   markers are looked for only in the template's own text (``located_spans``). Rendering
   every prefix of the dialogue and diffing (transformers/TRL's way for multi-turn masks)
   would be immune too, but costs O(n^2) renders and needs a template whose output for a
   prefix is a prefix of its output for the dialogue, which templates that drop earlier
   reasoning are not; the sentinel rendering costs one more render and needs only that the
   template write contents without looking inside them. Whitespace trimmed off (``| trim``)
   and JSON escaping (``| tojson``) are followed. A template that rewrites or branches on
   contents otherwise falls back to searching the text in order with a cursor
   (``locate_assistant_spans``), allowed only for a dialogue whose contents hold no turn
   marker; one that does is refused (``ChatFormatError``): only ``{% generation %}`` tags
   can place its turns safely.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from packcli.chat.budget import Span
from packcli.chat.errors import ChatFormatError
from packcli.chat.markers import TurnMarkers


def _find_before(text: str, needle: str, start: int, end: int, latest: int) -> int:
    """``needle`` within ``text[start:end]``, starting no later than ``latest``; else -1."""
    pos = text.find(needle, start, end)
    return pos if pos <= latest else -1


def locate_assistant_spans(
    text: str, messages: Sequence[Mapping[str, Any]], markers: TurnMarkers
) -> list[Span]:
    """Character span of each assistant turn in ``text``, in order, found by searching the
    text: the fallback for templates that rewrite contents (see ``located_spans``), since
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
    header, end_marker = markers.header or "", markers.end  # "" and None: no header
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
            begin = found + len(header) if found >= 0 else region[0]
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
            begin = finish = found + len(header)
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


# The sentinel rendering of a dialogue (its sentinel messages, its input size), or None
# when the template refused the sentinels: ``_Renderer.marked`` in packcli.chat.renderer.
MarkedRendering = Callable[[list[Mapping[str, Any]], int], "str | None"]


def located_spans(
    render_marked: MarkedRendering,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    markers: TurnMarkers,
    input_chars: int,
) -> list[Span]:
    """Assistant spans of a template without generation tags, that no content can spoof.

    The dialogue is rendered a second time (``render_marked``) with each content replaced by
    a sentinel; where the sentinels land says where each content is in the real rendering, so
    turn markers are only looked for in template text. A template that branches on or
    rewrites contents breaks that correspondence; then the text search of
    ``locate_assistant_spans`` is the fallback, allowed only when no content holds a turn
    marker (which could move a turn into it).
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
        marked = render_marked(sentinels, input_chars)
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
