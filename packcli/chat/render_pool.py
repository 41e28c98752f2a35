"""Chat templates rendered on worker processes.

Why: rendering a dialogue in the sandbox is Python and holds the GIL; with a fast backend it
is most of the chat path's time, so one process renders at a fraction of what the tokenizer
takes. Workers render batches of
dialogues while this process tokenizes, masks and writes the batches before them.

The workers run the same ``render_batch`` as the in-process path with the same template,
variables, limits and date, so the rendered texts and spans are the same; results come back
in submission order. Workers are spawned (not forked: the parent runs Rust thread pools
that a fork would copy mid-flight) and only render: they never load a tokenizer.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from packcli.errors import ConfigError, InputError, PackcliError

if TYPE_CHECKING:  # the pool's module stays light: a worker imports the renderer itself
    from packcli.chat.renderer import Rendered

    # (rendered, failures, error): error is (kind, message) of a packcli error, else None
    _Result: TypeAlias = tuple[
        list[tuple[int, Rendered]], list[tuple[int, str]], tuple[str, str] | None
    ]

# Inputs below this size render in the task's own process: spawning workers costs ~0.5 s of
# imports each, which rendering a few MB on one core does not repay.
MIN_POOL_BYTES = 16 << 20

_state: dict[str, Any] = {}


def _init(template: Any, variables: dict[str, str], controls: tuple[str, ...], now: Any) -> None:
    _state.update(template=template, variables=variables, controls=controls, now=now)


def _render(dialogues: Sequence[Any]) -> _Result:
    """``(rendered, failures, error)``: a template failure of one dialogue is a failure (the
    caller's bad-line policy); any other packcli error travels back as (kind, message), since
    exceptions with their own constructors do not always survive pickling."""
    from packcli.chat.renderer import render_batch

    failures: list[tuple[int, str]] = []
    try:
        rendered = render_batch(
            _state["template"],
            dialogues,
            _state["variables"],
            _state["controls"],
            now=_state["now"],
            on_error=lambda index, exc: failures.append((index, str(exc))),
        )
    except PackcliError as exc:
        kind = "config" if isinstance(exc, ConfigError) else "input"
        return [], [], (kind, str(exc))
    return rendered, failures, None


class RenderPool:
    """``submit(dialogues)`` renders on a worker; ``result(future)`` gives ``(rendered,
    failures)`` as ``ChatEncoder.render`` does, or raises the worker's error."""

    def __init__(
        self,
        template: Any,
        variables: Mapping[str, str],
        controls: tuple[str, ...],
        now: datetime | None,
        workers: int,
    ) -> None:
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init,
            initargs=(template, dict(variables), controls, now),
        )

    def submit(self, dialogues: Sequence[Any]) -> Future[_Result]:
        return self._pool.submit(_render, list(dialogues))

    @staticmethod
    def result(future: Future[_Result]) -> tuple[list[tuple[int, Rendered]], list[tuple[int, str]]]:
        rendered, failures, error = future.result()
        if error is not None:
            kind, message = error
            raise (ConfigError if kind == "config" else InputError)(message)
        return rendered, failures

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
