"""The house's two wings: the plugin (every module of trims_hf outside trims_hf/studies/) never imports the studies'
wing, and no two plugin or study modules import each other in a loop. Read from the source, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trims_hf"
STUDIES = "trims_hf.studies"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every trims_hf module ``path`` imports, anywhere in the file (top level, TYPE_CHECKING, inside functions)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import schema` names a module
    return {name for name in found if name == "trims_hf" or name.startswith("trims_hf.")}


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_the_plugin_never_imports_the_studies_wing() -> None:
    """``trims_hf/__init__.py`` names ``ArithTask``'s module as a string for its lazy map; nothing imports it."""
    found = {name: sorted(m for m in imported_modules(path) if m == STUDIES or m.startswith(f"{STUDIES}."))
             for name, path in modules().items() if name != STUDIES and not name.startswith(f"{STUDIES}.")}
    assert {name: taken for name, taken in found.items() if taken} == {}


def test_no_module_imports_itself_through_others() -> None:
    known = modules()

    def resolved(name: str) -> str | None:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name if name in known else None

    edges = {name: {target for m in imported_modules(path) if (target := resolved(m)) not in (None, name)}
             for name, path in known.items()}
    # a package's __init__ is entered by importing any module under it: only its own imports count, as drawn above
    loops = []
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                loops.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for name in known:
        if name not in state:
            visit(name, [name])
    assert loops == []
