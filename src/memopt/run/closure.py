"""The code a workflow rule runs, computed: the import closure of its script within memopt.

A rule lists as inputs the memopt source files its script can execute, so editing one of them
reruns exactly the rules that can run it, and a new import is picked up without anyone updating a
list. The closure is read from the sources, not by importing anything (the Snakefile computes it
for every rule while it builds the DAG): every `import` statement, lazy ones inside functions
included; a module started by name (`python -m memopt.x` in an argument list,
`importlib.import_module("memopt.x")`); a package's `__init__` for each module under it, as
Python runs it first. tests/test_rebuild.py checks it against the modules real jobs load.
"""

from __future__ import annotations

import ast
import os
import sys
from functools import lru_cache
from pathlib import Path

PACKAGE = "memopt"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def module_file(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source of module `name` (memopt.a.b: a/b.py or a/b/__init__.py); None if none."""
    parts = name.split(".")
    if parts[0] != package_dir.name:
        return None
    base = package_dir.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(path: Path, package_dir: Path) -> str:
    rel = path.relative_to(package_dir.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _run_by_name(node: ast.AST) -> list[str]:
    """Modules named as text that the code runs: `[..., "-m", "memopt.x", ...]` (a process it
    starts) and `importlib.import_module("memopt.x")`."""
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        return [b for a, b in zip(items, items[1:]) if a == "-m" and isinstance(b, str)]
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


@lru_cache(maxsize=None)
def _imports_cached(path: Path, mtime_ns: int, package: str) -> frozenset[str]:
    """Every module name an import statement in `path` names (and `from X import y`'s X.y, which
    is a module when y is one); `package` resolves relative imports."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        names.update(_run_by_name(node))
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x, from ..a import b
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


def imports(path: Path, package_dir: Path = PACKAGE_DIR) -> set[str]:
    """The modules of the package that the source file at `path` imports (directly)."""
    path = Path(path).resolve()
    try:
        package = _module_name(path, package_dir)
        if path.name != "__init__.py":
            package = package.rpartition(".")[0]
    except ValueError:  # a file outside the package (a workflow script): no relative imports
        package = ""
    names = _imports_cached(path, path.stat().st_mtime_ns, package)
    return {n for n in names if module_file(n, package_dir) is not None}


def closure(paths: list[Path], package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The package's source files that the files at `paths` reach through imports, sorted."""
    seen: set[Path] = set()
    todo = [n for p in paths for n in imports(Path(p), package_dir)]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        for i in range(1, len(parts) + 1):
            path = module_file(".".join(parts[:i]), package_dir)
            if path is not None and path not in seen:
                seen.add(path)
                todo.extend(imports(path, package_dir))
    return sorted(seen)


def code_inputs(script: Path, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """A rule's code inputs: the memopt sources its script's import closure holds, relative to
    the working directory (the inputs Snakemake records do not change when a checkout moves)."""
    return [Path(os.path.relpath(p)) for p in closure([Path(script)], package_dir)]


def jobs_import_from(src: Path) -> None:
    """Jobs import memopt from `src` (the checkout whose sources the rules track), before any
    installed copy: first on this process's path and on PYTHONPATH, which every job inherits. A
    non-editable install elsewhere would otherwise run other code than the rules' inputs name."""
    src = str(Path(src).resolve())
    if src not in sys.path:
        sys.path.insert(0, src)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    os.environ["PYTHONPATH"] = os.pathsep.join([src, *rest])
