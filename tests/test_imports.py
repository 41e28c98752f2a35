"""No import circles on the publish side, in the CLI and in the read stage (imports inside
functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import packcli

ROOT = Path(packcli.__file__).parent
# card -> write -> config -> fs -> card remains (fs.py and write.py are outside this check's
# modules); everything else that reads a finished output or makes the CLI must stay out.
CHECKED = (
    "packcli.cli",
    "packcli.publish",
    "packcli.stats",
    "packcli.rowview",
    "packcli.report",
    "packcli.read",
)
CHECKED_EXACT = ("packcli.verify", "packcli.recheck", "packcli.expected")


def _imports() -> dict[str, set[str]]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m}
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return False


def test_no_import_circles_through_the_cli_and_publish_modules() -> None:
    graph = _imports()
    checked = [m for m in graph if m in CHECKED_EXACT or m.startswith(CHECKED)]
    assert "packcli.stats" in checked and "packcli.cli.app" in checked
    assert "packcli.read.jsonl" in checked and "packcli.read.columnar" in checked
    circles = [(m, n) for m in checked for n in graph[m] if _reaches(graph, n, m)]
    assert circles == []
