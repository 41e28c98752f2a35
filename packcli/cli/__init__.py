"""The ``packcli`` command line (``packcli.cli:console`` is the console entry point;
``main`` the same command line as a function that gives control back).

- ``app.py``: the typer app, the command table, the one error -> exit-code map, ``main``;
- ``options.py``: the options several commands share, declared once;
- ``pack.py``: ``pack`` and its stages ``tokenize``, ``plan``, ``write``, ``finalize``;
- ``examine.py``: ``verify``, ``stats``, ``inspect`` (read a finished output);
- ``publish.py``: ``push``;
- ``export.py``: ``export`` (other training stacks' formats).
"""

from packcli.cli.app import app, console, main

__all__ = ["app", "console", "main"]
