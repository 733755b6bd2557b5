"""The house's rules over its import graph (docs/DESIGN.md §2), every import counted, a function's own included: a
module imports only from its own floor or below, nothing imports the roof, and no module imports back into a module
that imports it (an import circle says shared code sits in the wrong module). Imports made only for type checkers
(`if TYPE_CHECKING:`) are not imports at run time and are left out."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from tests.conftest import ROOT

FLOORS = {"accounts": 1, "cluster": 2, "assets": 2, "serving": 3, "workbridge": 3, "rag_studio": 4,
          "enhancement": 4, "agent_studio": 5, "runtime": 6, "factory": 7}


def _modules() -> dict[str, Path]:
    found = {}
    for package in FLOORS:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(child for statement in node.body for child in ast.walk(statement))
    return skipped


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules that `module` imports (a name imported from a package counts as the package)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}".rstrip(".")
            names += [f"{base}.{alias.name}" for alias in node.names]
    return {target for name in names if (target := resolve(name)) not in (None, module)}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def test_every_import_goes_to_its_own_floor_or_below_and_nothing_imports_the_roof():
    climbing = [f"{module} imports {target}" for module, targets in _graph().items() for target in targets
                if FLOORS[target.split(".")[0]] > FLOORS[module.split(".")[0]]]
    assert climbing == []


def test_no_module_imports_back_into_a_module_that_imports_it():
    try:
        TopologicalSorter(_graph()).prepare()
    except CycleError as exc:
        raise AssertionError(f"An import circle: {' -> '.join(exc.args[1])}") from None
