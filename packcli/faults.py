"""Fault injection for the crash tests.

``crash_point(name)`` SIGKILLs the process when the environment variable ``PACKCLI_CRASH_AT``
equals ``name``, so tests can kill a real ``packcli pack`` at an exact stage (after the N-th
tokenized shard, after planning, after the N-th Parquet file, before the completion marker)
and check that a rerun resumes to byte-identical output. With ``PACKCLI_CRASH_ONCE`` set to a
path, only the first process to reach the point dies (it creates the file first), so a task
that an engine retries (Ray, after its worker was killed) gets past it. Costs one dict lookup
otherwise.
"""

from __future__ import annotations

import os
import signal

# The variables a Ray task is given from the driver's environment (tests set them there).
FAULT_VARIABLES = ("PACKCLI_CRASH_AT", "PACKCLI_CRASH_ONCE")


def crash_point(name: str) -> None:
    if os.environ.get("PACKCLI_CRASH_AT") != name:
        return
    once = os.environ.get("PACKCLI_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
