"""Benchmarks run as `python -m bench.<name>`, one module of bench/ each, and share only bench/helpers: a benchmark
that other benchmarks imported became their helper library by accident. A module imports what needs Django's app
registry (models, and the services and selectors built on them) only after Django is set up: by the import of
bench.helpers.running_instance or bench.helpers.private_instance, or its own django.setup(). An import sorter once
moved such imports above that line, and the benchmarks failed at import; this keeps the order. bench/README.md's
table names every benchmark."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SETS_DJANGO_UP = {"bench.helpers.running_instance", "bench.helpers.private_instance"}
NEEDS_REGISTRY = re.compile(r"^django\.contrib\.auth|^(?!django\.)\S*\."
                            r"(models|services|selectors|demo|probes|runner|memory|graphs)(\.|$)")
SETUP_CALL = "django.setup"
# Benchmarks run through another's option, not by themselves: `python -m bench.ingest --workers`.
MODES = {"ingest_workers": "ingest"}


def _benchmarks() -> list[Path]:
    return sorted(path for path in BENCH.glob("*.py") if path.stem != "__init__")


def _module_imports(tree: ast.Module) -> list[str]:
    """The module-level imports in order, each as module.name; SETUP_CALL where django.setup() is called."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            names.extend([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.Expr) and ast.unparse(node.value) == "django.setup()":
            names.append(SETUP_CALL)
    return names


def _bench_modules_imported(tree: ast.Module) -> set[str]:
    """Every bench.* module imported anywhere in the file, a function's lazy imports included."""
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            modules |= {f"bench.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    return {module for module in modules if module.startswith("bench.")}


def test_no_benchmark_imports_the_project_before_django_is_set_up():
    early = []
    for source in sorted(BENCH.rglob("*.py")):
        module = ".".join(source.relative_to(ROOT).with_suffix("").parts)
        if source.stem == "__init__" or module in SETS_DJANGO_UP:
            continue
        imports = _module_imports(ast.parse(source.read_text()))
        setup_at = next((i for i, name in enumerate(imports) if name in SETS_DJANGO_UP | {SETUP_CALL}),
                        len(imports))
        early += [f"{source.relative_to(BENCH)}: {name}" for name in imports[:setup_at] if NEEDS_REGISTRY.search(name)]
    assert not early, "imported before the helpers set Django up:\n" + "\n".join(early)


def test_a_benchmark_runs_by_itself_and_imports_no_other_benchmark():
    for source in _benchmarks():
        tree = ast.parse(source.read_text())
        allowed = {f"bench.{mode}" for mode, parent in MODES.items() if parent == source.stem}
        others = {module for module in _bench_modules_imported(tree)
                  if not module.startswith("bench.helpers") and module not in allowed}
        assert not others, f"{source.name} imports {sorted(others)}: shared code belongs in bench/helpers"
        runs = any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
                   for node in tree.body)
        assert runs or source.stem in MODES, f"{source.name} does not run as python -m bench.{source.stem}"


def test_the_readme_table_names_every_benchmark():
    rows = [line for line in (BENCH / "README.md").read_text().splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)(?:\.py)?[` ]", row.split("|")[1])}
    assert named == {source.stem for source in _benchmarks()}
