"""Fault injection for the crash tests.

``crash_point(name)`` SIGKILLs the process when the environment variable ``PACKCLI_CRASH_AT``
equals ``name``, so tests can kill a real ``packcli pack`` at an exact stage (after the N-th
tokenized shard, after planning, after the N-th Parquet file, before the completion marker)
and check that a rerun resumes to byte-identical output. Costs one dict lookup otherwise.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    if os.environ.get("PACKCLI_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
