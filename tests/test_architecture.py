"""The package's shape, checked from its source with ``ast`` (docs/architecture.md).

- no import cycle among jax_mok's modules, counting module-level and function-level imports;
- no function-level import of a jax_mok module (the layers import downwards, at the top);
- no library file over MAX_LINES lines;
- no environment read (``os.environ``, ``os.getenv``) outside jax_mok/tuning.py, the registry.

Nothing is imported: the checks read the files, so they hold for code paths no test runs.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jax_mok"
MAX_LINES = 450
ENV_MODULE = "jax_mok.tuning"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[pathlib.Path, ast.Module]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        out[_module_name(path)] = (path, ast.parse(path.read_text(), filename=str(path)))
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: pathlib.Path, tree: ast.Module, known: set[str]):
    """(imported jax_mok module, line, at function level) for every import in ``tree``.

    ``from jax_mok import x`` counts as an import of ``jax_mok.x`` where that is a module, else
    of ``jax_mok`` itself; ``import jax_mok.x`` counts as ``jax_mok.x``."""
    is_package = path.name == "__init__.py"
    function_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    function_lines.add(id(inner))
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                targets.append(candidate if candidate in known else base)
        for target in targets:
            if target == "jax_mok" or target.startswith("jax_mok."):
                yield target, node.lineno, id(node) in function_lines


def _graph(sources):
    known = set(sources)
    edges: dict[str, set[str]] = {m: set() for m in sources}
    function_level = []
    for module, (path, tree) in sources.items():
        for target, line, in_function in _imports(module, path, tree, known):
            while target not in known:  # an attribute of a module: the module itself
                target = target.rsplit(".", 1)[0]
            if target != module:
                edges[module].add(target)
            if in_function:
                function_level.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    return edges, function_level


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycle():
    """The package ``jax_mok`` itself (``__init__``) re-exports, so edges into it from a
    submodule would make every module a cycle with it: a submodule must import what it needs
    from the module that defines it, never from ``jax_mok``."""
    edges, _ = _graph(_sources())
    cycles = _cycles(edges)
    assert not cycles, "import cycles among jax_mok modules: " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_function_level_import_of_jax_mok():
    _, function_level = _graph(_sources())
    assert not function_level, "function-level imports of jax_mok modules:\n" + "\n".join(
        function_level)


def test_library_files_are_short():
    long = [f"{path.relative_to(PACKAGE.parent)}: {n} lines"
            for path, _ in _sources().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"library files over {MAX_LINES} lines: {long}"


def _env_reads(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb",
                                                             "putenv", "unsetenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                yield node.lineno
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv", "environb") for a in node.names):
                yield node.lineno


def test_environment_is_read_only_by_the_registry():
    reads = [f"{path.relative_to(PACKAGE.parent)}:{line}"
             for module, (path, tree) in _sources().items() if module != ENV_MODULE
             for line in _env_reads(tree)]
    assert not reads, f"environment reads outside {ENV_MODULE}: {reads}"


def test_the_checks_catch_what_they_claim():
    """The checkers themselves, on small synthetic graphs and sources."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("import os\ndef f():\n    return os.environ.get('X')\n")
    assert list(_env_reads(tree)) == [3]
    tree = ast.parse("from os import getenv\n")
    assert list(_env_reads(tree)) == [1]
    path = PACKAGE / "api.py"
    tree = ast.parse("from jax_mok import ep\ndef f():\n    from jax_mok.ep import plan\n")
    found = list(_imports("jax_mok.api", path, tree, {"jax_mok.ep", "jax_mok.ep.plan"}))
    assert found == [("jax_mok.ep", 1, False), ("jax_mok.ep.plan", 3, True)]
