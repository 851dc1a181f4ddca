"""The layout's rules, checked on the source (docs/architecture.md explains them):

- `sim` never imports torch, `calibration` or `capsim`; `calibration` reaches the simulator only
  through `sim.api`; no import cycles among the project's modules (imports inside functions count).
- No module over 600 lines and no function over 80 lines in sim/, calibration/ and capsim/.
- Every public module-level function and class, and every public method of a public class, has a
  docstring saying what it is for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "calibration", "capsim")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str) -> list[tuple[str, int]]:
    """Absolute names of every module `path` imports (at any depth of the file), with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((mod, node.lineno))
            for a in node.names:   # `from sim.core import engine` imports the module sim.core.engine
                if f"{mod}.{a.name}" in MODULES:
                    found.append((f"{mod}.{a.name}", node.lineno))
    return found


def _is_under(mod: str, top: str) -> bool:
    return mod == top or mod.startswith(top + ".")


def test_sim_never_imports_torch_calibration_or_capsim():
    bad = [f"{MODULES[m].relative_to(REPO)}:{line} imports {imp}"
           for m in MODULES if _is_under(m, "sim")
           for imp, line in _imports(MODULES[m], m)
           if any(_is_under(imp, top) for top in ("torch", "calibration", "capsim"))]
    assert not bad, "\n".join(bad)


def test_calibration_uses_only_the_public_api_of_sim():
    bad = [f"{MODULES[m].relative_to(REPO)}:{line} imports {imp} (use sim.api)"
           for m in MODULES if _is_under(m, "calibration")
           for imp, line in _imports(MODULES[m], m)
           if _is_under(imp, "sim") and imp != "sim.api"]
    assert not bad, "\n".join(bad)


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for m, path in MODULES.items():
        deps = set()
        for imp, _ in _imports(path, m):
            # the longest project module the import names (a `from a.b import c` of a function names a.b)
            while imp and imp not in MODULES:
                imp = imp.rpartition(".")[0]
            if imp and imp != m:
                deps.add(imp)
        graph[m] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for dep in sorted(graph[node]):
            # a package's __init__ importing its own submodules is how packages re-export: not a cycle
            if _is_under(dep, node):
                continue
            if colour[dep] == GREY:
                return stack[stack.index(dep):] + [dep]
            if colour[dep] == WHITE:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = _import_graph()
    # importing a.b.c runs a/__init__ and a/b/__init__ first: parent packages are implicit dependencies
    for m in list(graph):
        parts = m.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in graph:
                graph[m].add(parent)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name):
    path = MODULES[name]
    text = path.read_text()
    lines = text.count("\n") + (not text.endswith("\n"))
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)} has {lines} lines (at most {MAX_MODULE_LINES})"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(REPO)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def _public_without_docstring(tree: ast.Module) -> list[str]:
    missing = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(f"{node.name} (line {node.lineno})")
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_")
                            and ast.get_docstring(item) is None
                            and not any(isinstance(d, ast.Name) and d.id in ("property", "model_validator",
                                                                             "field_validator")
                                        or isinstance(d, ast.Attribute) and d.attr == "setter"
                                        for d in item.decorator_list)):
                        missing.append(f"{node.name}.{item.name} (line {item.lineno})")
    return missing


@pytest.mark.parametrize("name", sorted(MODULES))
def test_public_names_have_docstrings(name):
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree) is not None, f"{path.relative_to(REPO)} has no module docstring"
    missing = _public_without_docstring(tree)
    assert not missing, f"{path.relative_to(REPO)}: no docstring: {', '.join(missing)}"
