"""The package's layers hold: common/ imports neither tasks/ nor workers/, tasks/ does not import
workers/, and no module imports itself back through others when it is loaded (imports inside
`if TYPE_CHECKING:` and inside functions aside)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"common": (), "tasks": ("common",), "workers": ("common", "tasks")}


def modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found["edgetrain." + dotted.removesuffix(".__init__")] = path
    return found


def imported_at_load(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports at module level (a `from x import y` counts y when y is a module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in known and m != name}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for name, path in modules().items():
        layer, depth = name.split(".")[1], len(name.split(".")) - 2
        for node in ast.walk(ast.parse(path.read_text())):  # anywhere: in functions too
            if isinstance(node, ast.ImportFrom):
                target = node.module or "" if not node.level else "edgetrain." + ".".join(name.split(".")[1 : depth + 2 - node.level])
            elif isinstance(node, ast.Import):
                target = " ".join(a.name for a in node.names)
            else:
                continue
            for other in LAYERS:
                if other != layer and other not in LAYERS[layer] and f"edgetrain.{other}" in target:
                    wrong.append(f"{path.relative_to(ROOT)} imports {other}/")
    assert wrong == []


def test_no_module_imports_itself_back_when_loaded() -> None:
    known = modules()
    graph = {name: imported_at_load(name, path, known) for name, path in known.items()}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append(trail[trail.index(name) :] + [name])
            return
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert cycles == []
