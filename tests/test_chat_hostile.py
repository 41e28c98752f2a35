"""Hostile templates.

Sandbox: every way a template can allocate in one call is refused before it allocates
(item 11); ``tracemalloc`` shows that nothing large was built on the way to the error.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from packcli.chat import ChatTemplate, ChatTemplateError, render


def _msg(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


# ---------------------------------------------------------------------------------------------
# The sandbox: allocations refused before they happen

# Each builds 4-20 MB in one call on a dialogue whose budgets allow ~1 MB per value; the
# pieces a template may legally build on the way are at most ~1 MB.
ALLOCATIONS = {
    "bytes repetition": ("{{ 'a'.encode() * 8000000 }}", "str.encode is not allowed"),
    "bytes concatenation": (
        "{% set ns = namespace(b='a'.encode()) %}{% for i in range(24) %}"
        "{% set ns.b = ns.b + ns.b %}{% endfor %}",
        "str.encode is not allowed",
    ),
    "bytes method": ("{{ 'a'.encode().center(8000000) }}", "str.encode is not allowed"),
    "bytes decode": ("{{ ('ab'.encode() * 4000000).decode() }}", "str.encode is not allowed"),
    "int.to_bytes": ("{{ (1).to_bytes(8000000, 'big') }}", "int.to_bytes is not allowed"),
    "int.from_bytes": ("{{ (1).from_bytes([255] * 100000, 'big') }}", "from_bytes"),
    "str.translate": (
        "{{ ('a' * 1000).translate({97: 'x' * 8000}) }}",
        "build a value of 8,000,000 characters",
    ),
    "str.maketrans": (
        "{{ ('a' * 1000).translate(''.maketrans({'a': 'x' * 8000})) }}",
        "build a value of 8,000,000",
    ),
    "escape filter": ("{{ ('\"' * 1000000) | e }}", "build a value of 5,000,000"),
    "urlencode filter": ("{{ ('é' * 1000000) | urlencode }}", "build a value of 12,000,000"),
    "upper filter": ("{{ ('ΐ' * 500000) | upper }}", "build a value of 1,500,000"),
    "upper method": ("{{ ('ΐ' * 500000).upper() }}", "build a value of 1,500,000"),
    "urlize target": (
        "{{ ('http://example.com ' * 2000) | urlize(target='x' * 5000) }}",
        "build a value",
    ),
    "list repetition": ("{{ [0] * 8000000 }}", "build a value of 8,000,000"),
    "percent width": ("{{ '%8000000d' % 1 }}", "build a value of 8,000,000"),
    "format width": ("{{ '{:>8000000}'.format(1) }}", "build a value of 8,000,000"),
    "pprint": ("{{ [[1, [2]]] | pprint }}", "No filter named 'pprint'"),
}
SMALL_DIALOGUE = [_msg("user", "What is packing?"), _msg("assistant", "Putting rows.")]


@pytest.mark.parametrize("name", sorted(ALLOCATIONS))
def test_allocation_is_refused_before_it_happens(name: str) -> None:
    text, message = ALLOCATIONS[name]
    started = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=message):
            render(ChatTemplate(name, text), SMALL_DIALOGUE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3_000_000, f"{name}: {peak:,} bytes allocated before the refusal"
    assert time.monotonic() - started < 2.0


def test_the_new_checks_keep_real_uses() -> None:
    text = (
        "{{ 'a <b> & \"c\"' | e }}|{{ 'ä b/c' | urlencode }}|{{ 'straße' | upper }}|"
        "{{ 'Straße'.lower() }}|{{ 'abc'.translate({97: 'xy', 98: none}) }}|"
        "{{ 'go to http://example.com now' | urlize(target='_blank') }}"
    )
    import jinja2.sandbox

    plain = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(text).render()
    assert render(ChatTemplate("uses", text), SMALL_DIALOGUE[:1]).text == plain
    assert "STRASSE" in plain and "xyc" in plain and "%C3%A4" in plain
