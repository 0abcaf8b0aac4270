"""The layers go one way (DESIGN.md, "Architecture rules"): common imports no app;
deployments imports common; openai_api imports deployments; ondemand imports openai_api;
modelship_site sits on top. Modules stay under 500 lines and import no module that imports
them back. Read from the source (ast), imports inside functions included.

KNOWN lists what is still to be undone (issue 14); it may only shrink: a violation not in it
fails, and so does an entry that no longer happens (take it out)."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tests.conftest import REPO

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# modelship_cli (the operator's command line) is a client of the REST API: it imports no app.
PACKAGES = ("modelship_cli", "common", "deployments", "openai_api", "ondemand", "modelship_site")
RANK = {name: rank for rank, name in enumerate(PACKAGES)}
MAX_LINES = 500

# (importing module, imported module) pairs still running up the layers: none left.
KNOWN: set[tuple[str, str]] = set()
KNOWN_CYCLES: list[set[str]] = []  # the three cycles issue 14 found are gone
KNOWN_LONG: set[str] = set()  # modules over 500 lines: none left


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def imported(name: str, path: Path) -> set[str]:
    """The project modules a module imports, anywhere in it."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] in RANK}


def graph() -> dict[str, set[str]]:
    known = dict(modules())
    return {
        name: {m for m in imported(name, path) if m in known and m != name}
        for name, path in known.items()
    }


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    def rank(module: str) -> int:
        return RANK[module.split(".")[0]]

    return {
        (source, target)
        for source, targets in edges.items()
        for target in targets
        if rank(target) > rank(source)
    }


def test_it_keeps_the_layers_one_way() -> None:
    found = upward(graph())
    assert not found - KNOWN, f"imports up the layers: {sorted(found - KNOWN)}"
    assert not KNOWN - found, f"fixed, take them out of KNOWN: {sorted(KNOWN - found)}"


def test_it_keeps_common_free_of_the_apps() -> None:
    edges = graph()
    used = {t for s, ts in edges.items() if s.startswith("common") for t in ts}
    assert {t for t in used if not t.startswith("common.")} == set()


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_it_has_no_new_import_cycles() -> None:
    found = {frozenset(group) for group in cycles(graph())}
    known = {frozenset(group) for group in KNOWN_CYCLES}
    assert not found - known, f"import cycles: {[sorted(g) for g in found - known]}"
    assert not known - found, f"gone, take out: {[sorted(g) for g in known - found]}"


def test_it_keeps_modules_small() -> None:
    long = {name for name, path in modules() if len(path.read_text().splitlines()) > MAX_LINES}
    assert long <= KNOWN_LONG, f"over {MAX_LINES} lines: {sorted(long - KNOWN_LONG)}"
    assert long >= KNOWN_LONG, f"now short, take out: {sorted(KNOWN_LONG - long)}"


def test_it_finds_a_violation_when_one_is_added(tmp_path: Path) -> None:
    """The checker itself: an upward import planted in a copy of a module is found."""
    source = "from ondemand.controller import Controller\n"
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    edges = {"deployments.planted": imported("deployments.planted", planted)}
    assert ("deployments.planted", "ondemand.controller") in upward(
        {k: {m for m in v if m in dict(modules())} for k, v in edges.items()}
    )
