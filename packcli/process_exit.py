"""Objects left for the end of a process that ends without the interpreter's teardown.

The console script ends with ``os._exit`` (``packcli.cli.app``): nothing is freed one by one
after the command. Freeing a large object earlier is then work for nothing unless the memory
is needed again: dropping a 128k-vocabulary HF tokenizer takes ~0.05 s (measured, Llama-3),
5% of a ``packcli pack`` of 100 documents. ``park`` keeps such an object to the end in that
case only; a caller that gets control back (a test, a script calling ``run_pack``) frees it
as before, so nothing outlives its use there.
"""

from __future__ import annotations

_parked: list[object] = []
_ends_with_os_exit = False


def ends_with_os_exit() -> None:
    """Say that this process ends with ``os._exit`` once the command is done (the console
    script, and only it, calls this)."""
    global _ends_with_os_exit
    _ends_with_os_exit = True


def park(obj: object) -> bool:
    """Keep ``obj`` to the end of the process when that end skips teardown; True when kept
    (the caller's own reference can go without freeing it), False when the caller frees it."""
    if _ends_with_os_exit:
        _parked.append(obj)
    return _ends_with_os_exit
