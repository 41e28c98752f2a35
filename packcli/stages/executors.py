"""Run a stage's independent tasks: in this process (``local``) or as Ray tasks (``ray``).

The tasks are the same functions the cluster commands run (``tokenize_task``,
``write_task``), so the executor changes where work happens, never what is written: the
output is byte-identical whichever executor and task count is used. Ray is an optional extra
(``pip install 'packcli[ray]'``); it is imported only when asked for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from packcli.errors import ConfigError, require_one_of
from packcli.faults import FAULT_VARIABLES
from packcli.names import EXECUTORS

log = logging.getLogger(__name__)

TASK_RETRIES = 3  # Ray's default for a task whose worker died, stated


def _run_remote(
    fn: Callable[..., Any], args: tuple[Any, ...], task_index: int, num_tasks: int
) -> Any:
    return fn(*args, task_index=task_index, num_tasks=num_tasks, quiet=True)


class Executor:
    """``map(fn, args, num_tasks)`` runs ``fn(*args, task_index=i, num_tasks=n, quiet=...)``."""

    def __init__(self, kind: str = "local", ray_address: str | None = None) -> None:
        require_one_of("--executor", kind, EXECUTORS)
        self.kind = kind
        self.ray_address = ray_address
        self._ray: Any = None

    def default_tasks(self) -> int:
        if self.kind == "local":
            return 1
        return max(1, int(self._ensure_ray().cluster_resources().get("CPU", 1)))

    def _ensure_ray(self) -> Any:
        if self._ray is None:
            try:
                import ray
            except ImportError as exc:
                raise ConfigError("--executor ray needs Ray: pip install 'packcli[ray]'") from exc
            if not ray.is_initialized():
                if self.ray_address:
                    ray.init(address=self.ray_address, log_to_driver=False)
                else:  # a local cluster on loopback, sized to this machine
                    ray.init(
                        num_cpus=os.cpu_count(),
                        include_dashboard=False,
                        log_to_driver=False,
                        _node_ip_address="127.0.0.1",
                    )
            self._ray = ray
        return self._ray

    def map(
        self, fn: Callable[..., Any], args: tuple[Any, ...], num_tasks: int, *, quiet: bool = False
    ) -> list[Any]:
        if self.kind == "local":
            return [
                fn(*args, task_index=i, num_tasks=num_tasks, quiet=quiet) for i in range(num_tasks)
            ]
        ray = self._ensure_ray()
        # A task whose worker process dies (killed, out of memory, a node lost) is run again
        # by Ray; the stage's records make the retry skip what the first try finished.
        options: dict[str, Any] = {"num_cpus": 1, "max_retries": TASK_RETRIES}
        faults = {k: os.environ[k] for k in FAULT_VARIABLES if k in os.environ}
        if faults:  # crash tests: the tasks see the driver's fault settings
            options["runtime_env"] = {"env_vars": faults}
        remote = ray.remote(**options)(_run_remote)
        refs = [remote.remote(fn, args, i, num_tasks) for i in range(num_tasks)]
        log.info("running %d %s task(s) on Ray", num_tasks, getattr(fn, "__name__", "?"))
        try:
            results: list[Any] = ray.get(refs)
            return results
        except ray.exceptions.RayTaskError as exc:  # re-raise the task's own error type
            raise exc.as_instanceof_cause() from None
