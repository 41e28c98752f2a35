"""Kernels that run as plain Python on small inputs and compiled by numba on large ones.

Why: importing numba and loading even *cached* compiled kernels costs ~1.5 s of CPU on the
2-core dev machine (import ~0.3-0.6 s; the first cache load pays for numba's target set-up,
~1 s; each further kernel ~0.05-0.2 s), which was a third of a 100-document ``packcli pack``.
The same kernels run as plain Python over numpy arrays in milliseconds on such inputs.

How: a kernel is written once, as a plain Python function over numpy arrays in the subset
numba compiles (``@kernel``). The module keeps the plain function; ``pick(f, work)``
returns it when ``work`` (the call's cost in best-fit items, see ``SMALL_WORK``) is below
``SMALL_WORK``, else its compiled twin. Twins are made lazily, on the first large call, all
kernels of a module at once: each is a copy of the function bound to a copy of its module's
globals in which every kernel (and ``trailing_zeros``) is replaced by its compiled
version, so kernels that call each other call compiled code. numba is imported only then,
and ``cache=True`` keeps the compiled code on disk as before.

One source of truth per algorithm is the point: the Python and the compiled run execute
the same statements, and the tests check on random inputs, on both sides of the threshold,
that both give the same arrays. (A separate numpy implementation per kernel would be
faster in Python, but would be a second algorithm to keep identical.) Integer arithmetic
stays far from int64 overflow in these kernels (sizes, counts and indices), where numba's
machine integers and Python's agree.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast, overload

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# Below this much work a call runs as plain Python. Work is counted in best-fit items (~15-25
# us each as Python on the 2-core dev machine under load; call sites scale kernels that cost
# more or less per item: a slice copy or a counting-sort step is ~1/8 of one). There,
# ``python scripts/bench_fixed_cost.py --jit`` gives, in CPU seconds of a whole plan,
# Python vs compiled (numba's import and cache loads included): 0.06 vs 0.82 at 1,000
# documents, 0.36 vs 1.00 at 10,000, 1.00 vs 0.93 at 30,000. 10,000 keeps a plan below
# the threshold at a third of numba's cost, and any one Python call under ~0.25 s.
SMALL_WORK = 10_000

_options: dict[Callable[..., Any], dict[str, Any]] = {}  # kernel -> numba.njit options
_compiled: dict[Callable[..., Any], Callable[..., Any]] = {}  # kernel -> compiled twin
_lock = threading.RLock()  # write threads may ask at once; compiling may recurse
_forced: str | None = None  # "python" / "numba" (tests, benchmarks): ignore the threshold


@overload
def kernel(func: F, *, nogil: bool = False) -> F: ...
@overload
def kernel(func: None = None, *, nogil: bool = False) -> Callable[[F], F]: ...
def kernel(func: F | None = None, *, nogil: bool = False) -> F | Callable[[F], F]:
    """Mark ``func`` as a kernel (compiled with ``nogil`` when large); returns it unchanged."""

    def mark(f: F) -> F:
        _options[f] = {"nogil": nogil}
        return f

    return mark(func) if func is not None else mark


def trailing_zeros(x: Any) -> int:
    """Number of trailing zero bits of a non-zero integer (numba's intrinsic when compiled)."""
    v = int(x)
    return (v & -v).bit_length() - 1


def pick(func: F, work: int) -> F:
    """``func`` itself for small ``work``, else its compiled twin (same results)."""
    if _forced == "python" or (_forced is None and work < SMALL_WORK):
        return func
    return compiled(func)


def compiled(func: F) -> F:
    """The compiled twin of kernel ``func`` (compiles, or loads from numba's cache, the
    kernels of its module on first use)."""
    twin = _compiled.get(func)
    if twin is None:
        with _lock:
            if func not in _compiled:
                _compile_module(sys.modules[func.__module__])
            twin = _compiled[func]
    return cast(F, twin)  # numba's dispatcher, called as ``func`` is


def warm(modules: Sequence[str]) -> threading.Thread:
    """Compile (or load from numba's cache) the kernels of ``modules`` in a background thread,
    started now; a later first call of a kernel waits for it under the same lock.

    Why: numba's import and cache loads (~0.8 s and ~0.1-0.8 s per specialization of CPU,
    measured, mostly holding the GIL) otherwise sit on the critical path of the first large
    plan and write; the caller starts this where the process has a core idle (``pack``
    waiting for the fast tokenizer's tables, then for the tokenizer). Not a daemon thread:
    one killed at exit inside llvmlite could abort the process; join it.
    """

    def run() -> None:
        try:
            for name in modules:
                module = importlib.import_module(name)
                kernels = [f for f in _options if f.__module__ == name]
                with _lock:
                    if any(f not in _compiled for f in kernels):
                        _compile_module(module)
                for f in kernels:
                    _load_cached(_compiled[f])
        except Exception:  # only a head start: the kernel's first call compiles and raises
            log.debug("warming %s failed", modules, exc_info=True)

    thread = threading.Thread(target=run, name="packcli-jit-warm")
    thread.start()
    return thread


def _load_cached(twin: Any) -> None:
    """Load every specialization numba's cache holds for ``twin``, as its first call with
    those argument types would (numba loads them lazily, each ~0.1-0.8 s of CPU, the first
    paying for its code generator's set-up). Reads the cache's index through numba's private
    ``_cache``: another numba version only loses the head start (``warm`` logs it)."""
    for key in twin._cache._cache_file._load_index():
        twin.compile(key[0])  # the cached code when it is for this CPU, else compiled


def _compile_module(module: types.ModuleType) -> None:
    import numba
    from numba.cpython.unsafe.numbers import trailing_zeros as numba_trailing_zeros

    namespace = dict(vars(module))
    kernels = [f for f in _options if f.__module__ == module.__name__]
    for name, value in namespace.items():
        if value is trailing_zeros:
            namespace[name] = numba_trailing_zeros
        elif isinstance(value, types.FunctionType) and value in _options and value not in kernels:
            namespace[name] = compiled(value)  # a kernel imported from another module
    # numba's cache files are named by the qualified name; numba tells a stale file by its
    # own module's source only, while a kernel's compiled code holds the kernels it calls
    # from other modules too (numba#1833): a digest of those modules' sources in the name
    # makes an edit there compile anew instead of loading the old code.
    suffix = _imported_sources_digest(module)
    twins = {}
    for f in kernels:
        copy = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__)
        copy.__qualname__ = f.__qualname__ + suffix
        twins[f] = numba.njit(cache=True, **_options[f])(copy)
        namespace[f.__name__] = twins[f]
    _compiled.update(twins)


def _kernel_modules(module: types.ModuleType) -> set[str]:
    """The other modules whose kernels ``module``'s kernels may call, and theirs in turn."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for value in list(vars(todo.pop()).values()):
            if isinstance(value, types.FunctionType) and value in _options:
                name = value.__module__
                if name != module.__name__ and name not in seen:
                    seen.add(name)
                    todo.append(sys.modules[name])
    return seen


def _imported_sources_digest(module: types.ModuleType) -> str:
    """``"__"`` and a digest of the sources of ``_kernel_modules(module)``; ``""`` when its
    kernels call no other module's."""
    names = sorted(_kernel_modules(module))
    if not names:
        return ""
    digest = hashlib.sha256()
    for name in names:
        source = sys.modules[name].__file__
        digest.update(name.encode() + b"\0")
        digest.update(Path(source).read_bytes() if source else b"")
    return "__" + digest.hexdigest()[:16]


@contextmanager
def forced(mode: str | None) -> Iterator[None]:
    """Run every kernel as ``"python"`` or ``"numba"`` regardless of size (``None``: by
    size) inside the block; for tests and benchmarks, not thread-safe."""
    global _forced
    if mode not in (None, "python", "numba"):
        raise ValueError(f"mode must be 'python', 'numba' or None, got {mode!r}")
    before, _forced = _forced, mode
    try:
        yield
    finally:
        _forced = before
