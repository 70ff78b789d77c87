"""The layout of ``host/`` holds: the wings' direction, their privacy, and no import circles.

Three checks, each also shown failing once on a tree that breaks it:

* the wings import only the wings below them, and ``capsule/`` nothing of ``host/``
  (import-linter's contracts in ``pyproject.toml``);
* a wing's private modules (``host.WING._name``) are imported only from inside that wing:
  other wings use what the wing's ``__init__`` lists;
* no module imports itself back through a chain of imports (a circle), inside a wing too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(root: Path, path: Path, modules: set[str]) -> Iterator[tuple[str, int]]:
    """Every module of the tree that ``path`` imports (absolute names), with its line.

    ``from X import y`` imports the module ``X.y`` when there is one (``X`` itself is
    already loaded by then), else ``X``.
    """
    name = _module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                child = f"{target}.{alias.name}"
                yield (child if child in modules else target), node.lineno


def _graph(root: Path, packages: tuple[str, ...]) -> dict[str, dict[str, int]]:
    files = [p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))]
    modules = {_module_name(root, p): p for p in files}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in _imports(root, path, set(modules)):
            if target in modules and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def private_imports(root: Path) -> list[str]:
    """Imports of a wing's private module from outside that wing."""
    found: list[str] = []
    for source, edges in _graph(root, ("host",)).items():
        for target, line in edges.items():
            parts = target.split(".")
            if len(parts) < 3 or not parts[2].startswith("_") or parts[2].startswith("__"):
                continue
            wing = ".".join(parts[:2])
            if source != wing and not source.startswith(wing + "."):
                found.append(f"{source}:{line} imports {target}, private to {wing}")
    return found


def circles(root: Path) -> list[list[str]]:
    """Import circles among the modules of ``host`` and ``capsule`` (each found once).

    A package's ``__init__`` importing its own modules is not a circle by itself: only a
    module that imports its way back to where it started is.
    """
    graph = _graph(root, ("host", "capsule"))
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :]
                if not all(
                    _is_parent(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)
                ):
                    found.append([*cycle, nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)
    return found


def _is_parent(a: str, b: str) -> bool:
    """``a`` is a package and ``b`` lies inside it, or the other way round: importing a
    submodule always runs its package's ``__init__`` first, which is not a circle."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    for name in ("host", "capsule"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _add_line(path: Path, line: str) -> None:
    text = path.read_text(encoding="utf-8")
    anchor = "from __future__ import annotations\n"
    assert anchor in text, path
    path.write_text(text.replace(anchor, anchor + line + "\n", 1), encoding="utf-8")


# -- the checks, on the real tree ------------------------------------------------------------


def test_the_wings_keep_their_direction() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_no_wing_imports_another_wings_private_module() -> None:
    assert private_imports(ROOT) == []


def test_no_import_circles() -> None:
    assert circles(ROOT) == []


# -- each check fails on a tree that breaks it -----------------------------------------------


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # declare must never reach a capsule
        ("host/declare/_discovery.py", "from host.capsules import Supervisor", "pipeline"),
        # policy must never reach the command line
        ("host/policy/_decide.py", "import host.cli", "pipeline"),
        # the capsule runtime must never import the host
        ("capsule/_registry.py", "import host.errors", "capsule/ runs inside a capsule"),
    ],
)
def test_the_direction_check_fails_on_a_forbidden_import(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = _copy_tree(tmp_path)
    _add_line(tree / module, line)
    done = _lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 broken" in done.stdout
    broken = [row for row in done.stdout.splitlines() if row.endswith("BROKEN")]
    assert len(broken) == 1 and contract in broken[0], done.stdout


def test_the_privacy_check_fails_on_a_private_import(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    _add_line(tree / "host/_mediator.py", "from host.policy._decide import tool_glob")
    [found] = private_imports(tree)
    assert found.startswith("host._mediator:")
    assert found.endswith("imports host.policy._decide, private to host.policy")


def test_the_circle_check_fails_on_a_circle(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    # the circle this layout removed: the scope model importing its renderers
    _add_line(tree / "host/declare/_model.py", "from . import _render")
    found = circles(tree)
    assert found, "a circle went unnoticed"
    assert any("host.declare._model" in c and "host.declare._render" in c for c in found)
