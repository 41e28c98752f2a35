"""Progress bars on stderr: tqdm's when one is shown, a stand-in that does nothing when not.

Off with ``--quiet``, and by itself when stderr is not a terminal (batch jobs' logs stay free
of carriage-return noise). A hidden tqdm bar still costs its import and a multiprocessing
lock (~35 ms of a 1 s ``packcli pack`` of 100 documents, measured), so a bar that would not be
shown is the stand-in and tqdm is imported only for one that is.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol


class Bar(Protocol):
    """What the stages use of a tqdm bar."""

    @property
    def format_dict(self) -> Mapping[str, Any]: ...

    def update(self, n: float = 1) -> bool | None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def __enter__(self) -> Bar: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class HiddenBar:
    """A bar nobody sees: counts nothing, shows nothing; ``format_dict`` has the elapsed
    seconds, as a hidden tqdm bar's has (the tokenize stage's tokens/s postfix reads them)."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    @property
    def format_dict(self) -> dict[str, Any]:
        return {"elapsed": time.monotonic() - self._start}

    def update(self, n: float = 1) -> bool | None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def __enter__(self) -> HiddenBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


def shown(quiet: bool) -> bool:
    """Whether a bar would be drawn: tqdm's own rule for ``disable=None`` (hidden when the
    stream says it is not a terminal), unless ``--quiet``."""
    if quiet:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return isatty is None or bool(isatty())


def progress_bar(quiet: bool, **kwargs: Any) -> Bar:
    """A tqdm bar on stderr when it would be shown, else a ``HiddenBar``."""
    if not shown(quiet):
        return HiddenBar()
    from tqdm import tqdm

    bar: Bar = tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)
    return bar
