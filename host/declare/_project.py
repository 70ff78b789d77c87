"""Where a project is: its root, its tools folder, its policy files.

A project is a folder with ``tools/`` or ``src/tools/``, optional ``hooks/``, and
``policy.toml`` plus optional ``policies/*.toml``. The command line picks the project the
user did not name: ``./src`` if ``./src/tools`` exists, else ``.`` if ``./tools`` exists,
else the bundled example ``agent_src``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from host.errors import DeclarationError

__all__ = ["Project", "resolve_project", "default_project", "BUNDLED"]

BUNDLED = Path(__file__).resolve().parents[2] / "agent_src"
"""The bundled example project (present in a source checkout or editable install)."""


@dataclass(frozen=True, slots=True)
class Project:
    """A resolved project folder."""

    root: Path
    """The project folder: holds ``policy.toml``, ``policies/``, ``hooks/``, ``.agent/``."""
    tools_dir: Path
    """The folder of tool files, loaded as the package ``tools``."""

    @property
    def policy_files(self) -> list[Path]:
        """``policy.toml`` (if present) then ``policies/*.toml`` in name order."""
        files: list[Path] = []
        main = self.root / "policy.toml"
        if main.is_file():
            files.append(main)
        extra = self.root / "policies"
        if extra.is_dir():
            files.extend(sorted(p for p in extra.glob("*.toml") if p.is_file()))
        return files

    @property
    def state_dir(self) -> Path:
        """``.agent/``: generated files and the state database."""
        return self.root / ".agent"


def resolve_project(path: str | Path) -> Project:
    """Resolve a project folder given by the user. Raises :class:`DeclarationError`."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise DeclarationError(f"project folder {root} does not exist")
    for candidate in (root / "tools", root / "src" / "tools"):
        if candidate.is_dir():
            return Project(root=root, tools_dir=candidate)
    raise DeclarationError(
        f"{root} has no tools/ or src/tools/ folder: put your tool files there",
        file=str(root),
    )


def default_project(cwd: Path | None = None) -> tuple[Path, bool]:
    """The project the command line uses when none is named; True if it is the bundled one."""
    here = (cwd or Path.cwd()).resolve()
    if (here / "src" / "tools").is_dir():
        return here / "src", False
    if (here / "tools").is_dir():
        return here, False
    return BUNDLED, True
