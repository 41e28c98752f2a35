"""``python -m packcli`` runs the CLI (same as the ``packcli`` console script)."""

from packcli.cli import console

console()
