"""Benchmarks run as `python -m bench.<name>` against an instance: a module imports what needs Django's app registry
(models, and the services and selectors built on them) only after Django is set up: by the import of bench._serving
(or bench.ingest, with its private environment) or its own django.setup(). An import sorter once moved such imports
above that line, and the benchmarks failed at import; this keeps the order."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETS_DJANGO_UP = {"bench._serving", "bench.ingest"}
NEEDS_REGISTRY = re.compile(r"^django\.contrib\.auth|^(?!django\.)\S*\."
                            r"(models|services|selectors|demo|probes|runner|memory|graphs)(\.|$)")
SETUP_CALL = "django.setup"


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


def test_no_benchmark_imports_the_project_before_django_is_set_up():
    early = []
    for source in sorted((ROOT / "bench").glob("*.py")):
        if source.stem in ("__init__", "_serving", "ingest"):
            continue
        imports = _module_imports(ast.parse(source.read_text()))
        setup_at = next((i for i, name in enumerate(imports) if name in SETS_DJANGO_UP | {SETUP_CALL}),
                        len(imports))
        early += [f"{source.name}: {name}" for name in imports[:setup_at] if NEEDS_REGISTRY.search(name)]
    assert not early, "imported before bench._serving / bench.ingest set Django up:\n" + "\n".join(early)
