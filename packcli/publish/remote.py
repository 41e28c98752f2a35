"""An output on object storage as a local folder, for the commands that read a finished
output (``push``, ``stats``, ``inspect``; ``verify`` through ``verify.verify_remote``): what
the command needs is downloaded to a temp folder, and its messages name the URL, never the
temp copy."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from packcli.errors import PackcliError


@contextlib.contextmanager
def local_output(
    out: str,
    *,
    card: bool = True,
    plots: bool = True,
    data: Callable[[str], bool] | None = None,
) -> Iterator[Path]:
    """``out`` as a local folder: itself, or an output on object storage (``s3://...``)
    downloaded to a temp folder (its packcli.json; with ``card`` and ``plots`` its card and
    plots; the Parquet files it lists that ``data`` keeps, all when None). A ``PackcliError``
    raised inside names the URL instead of the copy."""
    from packcli.fs import download_output, is_url, local_path, reword

    if not is_url(out):
        yield Path(local_path(out))
        return
    with tempfile.TemporaryDirectory(prefix="packcli-copy-") as tmp:
        local = Path(tmp)
        try:
            download_output(out, local, card=card, plots=plots, data=data)
            yield local
        except PackcliError as exc:
            raise type(exc)(reword(str(exc), local, out)) from None
