"""Progress bars: tqdm's where one is drawn, a stand-in (and no tqdm import) where not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from packcli.stages import progress


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.written: list[str] = []

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.written.append(s)
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    ("quiet", "tty", "drawn"),
    [(False, True, True), (False, False, False), (True, True, False), (True, False, False)],
)
def test_bar_drawn_only_on_a_terminal_without_quiet(
    monkeypatch: pytest.MonkeyPatch, quiet: bool, tty: bool, drawn: bool
) -> None:
    stream = _Stream(tty)
    monkeypatch.setattr(sys, "stderr", stream)
    with progress.progress_bar(quiet, total=4, desc="step") as bar:
        bar.update(3)
        bar.set_postfix_str("3 tokens", refresh=False)
        assert bar.format_dict["elapsed"] >= 0
    assert isinstance(bar, progress.HiddenBar) is not drawn
    assert any("step" in s for s in stream.written) is drawn


def test_hidden_bar_elapsed_grows() -> None:
    bar = progress.HiddenBar()
    first = bar.format_dict["elapsed"]
    time.sleep(0.01)
    assert bar.format_dict["elapsed"] > first


def test_hidden_bar_does_not_import_tqdm() -> None:
    code = (
        "import sys\n"
        "from packcli.stages.progress import progress_bar\n"
        "with progress_bar(False, total=3) as bar:\n"
        "    bar.update(1)\n"
        "assert 'tqdm' not in sys.modules, 'tqdm imported'\n"
    )
    # stderr is a pipe here: not a terminal, so the bar is not drawn.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
