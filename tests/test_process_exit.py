"""Objects parked for the end of the process only when that end skips teardown."""

from __future__ import annotations

import gc
import weakref

import pytest

from packcli import process_exit


class _Big:
    pass


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_exit, "_parked", [])
    monkeypatch.setattr(process_exit, "_ends_with_os_exit", False)


def test_not_parked_when_the_process_tears_down(fresh: None) -> None:
    obj = _Big()
    ref = weakref.ref(obj)
    assert process_exit.park(obj) is False
    del obj
    gc.collect()
    assert ref() is None  # freed with the caller's last reference, as before


def test_parked_when_the_process_ends_with_os_exit(fresh: None) -> None:
    process_exit.ends_with_os_exit()
    obj = _Big()
    ref = weakref.ref(obj)
    assert process_exit.park(obj) is True
    del obj
    gc.collect()
    assert ref() is not None  # kept to the end: freeing it would be work for nothing
