"""No import circles on the publish side, in the CLI and in the read stage (imports inside
functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import packcli

ROOT = Path(packcli.__file__).parent
# Everything that reads a finished output or makes the CLI must stay out of circles.
CHECKED = (
    "packcli.cli",
    "packcli.publish.push",
    "packcli.publish.stats",
    "packcli.publish.rowview",
    "packcli.publish.report",
    "packcli.read",
)
CHECKED_EXACT = ("packcli.publish.verify", "packcli.publish.recheck", "packcli.publish.expected")


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
    assert "packcli.publish.stats" in checked and "packcli.cli.app" in checked
    assert "packcli.read.jsonl" in checked and "packcli.read.columnar" in checked
    circles = [(m, n) for m in checked for n in graph[m] if _reaches(graph, n, m)]
    assert circles == []


EXEMPT: tuple[str, ...] = ()  # no module may sit on an import circle


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_anywhere_but_in_the_modules_being_split() -> None:
    circles = _circles(_imports())
    assert circles == [c for c in circles if all(m.startswith(EXEMPT) for m in c)]
    # The check sees circles: the graph has the ones of the parts being split.
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_the_planner_reads_no_config_files() -> None:
    """plan.py is pure: it must not import config.py (which reads YAML), directly or not."""
    graph = _imports()
    assert not _reaches(graph, "packcli.pack.plan", "packcli.config")
