"""The chat package's public names load on first use, so text runs pay nothing for it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import packcli.chat


def test_the_pipeline_imports_chat_offsets_without_jinja2() -> None:
    """Every run imports ``packcli.chat.offsets`` through the pipeline; the package's
    ``__init__`` must not build the template sandbox for it."""
    code = (
        "import sys, packcli.stages.run; "
        "print(sorted(m for m in ('jinja2', 'packcli.chat.sandbox') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_public_name_resolves_to_its_module() -> None:
    for name in packcli.chat.__all__:
        value = getattr(packcli.chat, name)
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value
        assert name in dir(packcli.chat)
    with pytest.raises(ImportError):
        exec("from packcli.chat import no_such_name", {})
