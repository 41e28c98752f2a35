"""Advisory locks on an output folder and a work folder, so two runs cannot interleave.

Without them the last writer won: two ``packcli pack`` runs on one ``--out`` (or one
``--work-dir``) overwrote each other's shards and Parquet files, and one run's ``verify`` then
failed. Commands that own the whole job (``pack``, and the single-task stages ``plan`` and
``finalize``) take an *exclusive* lock; the task commands ``tokenize`` and ``write``, whose
tasks run side by side by design (a Slurm array, a shell loop), take a *shared* lock plus an
exclusive lock of their own task index, so the same task cannot run twice at once either.
Ray tasks run inside ``pack``, under its lock, and take none.

``fcntl.flock`` locks belong to an open file: the kernel drops them when the process dies, so
a killed run (SIGKILL, OOM, preemption) never leaves a stale lock behind. Each holder appends
one line about itself (pid, host, command, start time) to the lock file, which the refusal
names. On file systems without ``flock`` the run goes on with a warning (NFS has it through
its lock manager on Linux).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from packcli.errors import PackcliError
from packcli.names import OUT_LOCK, TASK_LOCKS, WORK_LOCK
from packcli.records import Record, parse_record

log = logging.getLogger(__name__)

# flock is missing or refused on some file systems (FUSE mounts, old NFS setups).
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class LockedError(PackcliError):
    """Another packcli process holds the output or work folder."""


@dataclass(frozen=True)
class LockHolder(Record):
    """One line of a lock file: who holds it (for the refusal's message only; the lock is the
    kernel's). No version field: a line that does not read as one is a holder that did not
    say who it is."""

    VERSION: ClassVar[int | None] = None

    pid: int
    host: str
    command: str
    started: str
    mode: str  # "shared" or "exclusive"


def _holder_line(mode: str) -> bytes:
    holder = LockHolder(
        pid=os.getpid(),
        host=socket.gethostname(),
        command="packcli " + " ".join(sys.argv[1:]),
        started=time.strftime("%Y-%m-%d %H:%M:%S %z"),
        mode=mode,
    )
    return (json.dumps(holder.to_json()) + "\n").encode("utf-8")


def _alive(holder: LockHolder) -> bool:
    """Whether a recorded holder may still run (only a same-host pid can be checked)."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _holders(path: Path) -> str:
    holders = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        lines = []
    for line in lines:
        with contextlib.suppress(ValueError):
            holder = parse_record(LockHolder, json.loads(line), path)
            if holder is not None and _alive(holder):
                holders.append(holder)
    if not holders:
        return "a process that did not say who it is"
    h = holders[-1]
    more = f" (and {len(holders) - 1} more)" if len(holders) > 1 else ""
    return f"pid {h.pid} on {h.host} running `{h.command}` since {h.started}{more}"


@contextlib.contextmanager
def _flock(path: Path, shared: bool, what: str) -> Iterator[None]:
    if not path.parent.is_dir():  # nothing there to protect; the command fails on its own
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(
                f"{what} is in use by another packcli process: {_holders(path)}; wait for it "
                "to finish or stop it (a stopped process releases the lock by itself)"
            ) from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            log.warning("cannot lock %s (%s): not protected against a concurrent run", path, exc)
        if not shared:  # the only holder now: earlier holders' lines are history
            os.ftruncate(fd, 0)
        os.write(fd, _holder_line("shared" if shared else "exclusive"))
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def hold(
    out: Path, work: Path, *, shared: bool = False, task: tuple[str, int] | None = None
) -> Iterator[None]:
    """Lock the output folder and the work folder (shared or exclusive) for a command, and
    its own task index exclusively when ``task`` is ``(stage, index)``."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_flock(out / OUT_LOCK, shared, f"output folder {out}"))
        stack.enter_context(_flock(work / WORK_LOCK, shared, f"work folder {work}"))
        if task is not None and work.is_dir():
            stage, index = task
            name = f"{stage}-{index:05d}.lock"
            (work / TASK_LOCKS).mkdir(exist_ok=True)
            stack.enter_context(
                _flock(work / TASK_LOCKS / name, False, f"{stage} task {index} in {work}")
            )
        yield
