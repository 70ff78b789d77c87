"""Where a project is: its root, its tools folder, its policy files.

A project is the folder that holds ``tools/`` or ``src/tools/`` (one of them), the policy
files (``policy.toml`` plus optional ``policies/*.toml``), optional ``hooks/`` and the
state folder ``.agent/``. ``src/`` is only where the tools may live: naming it
(``--project src``, ``Host.open("src")``) names the project above it, and a policy file
inside ``src/`` is refused rather than silently ignored. The command line picks the
project the user did not name: ``.`` if ``./tools`` or ``./src/tools`` exists, else the
bundled example ``agent_src``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from host.errors import DeclarationError

__all__ = ["Project", "resolve_project", "default_project", "policy_files", "BUNDLED"]

BUNDLED = Path(__file__).resolve().parents[2] / "agent_src"
"""The bundled example project (present in a source checkout or editable install)."""


def policy_files(root: Path) -> list[Path]:
    """``root/policy.toml`` (if present) then ``root/policies/*.toml`` in name order."""
    files: list[Path] = []
    main = root / "policy.toml"
    if main.is_file():
        files.append(main)
    extra = root / "policies"
    if extra.is_dir():
        files.extend(sorted(p for p in extra.glob("*.toml") if p.is_file()))
    return files


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
        return policy_files(self.root)

    @property
    def state_dir(self) -> Path:
        """``.agent/``: generated files and the state database."""
        return self.root / ".agent"


def resolve_project(path: str | Path) -> Project:
    """Resolve a project folder given by the user. Raises :class:`DeclarationError`.

    ``path`` is the project folder, or the ``src/`` folder of a ``src/tools`` layout
    (the project is then the folder above, where the policy files and ``.agent/`` live).
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise DeclarationError(f"project folder {root} does not exist")
    if root.name == "src" and (root / "tools").is_dir():
        # The src/ folder of a src/tools layout: the project is the folder above it.
        above = root.parent
        stray = [p.relative_to(root).as_posix() for p in policy_files(root)]
        if stray:
            raise DeclarationError(
                f"{root} is the src/ folder of the project {above} (its tools are in "
                f"src/tools/), but it holds {', '.join(stray)}, which would be ignored: "
                f"move {'it' if len(stray) == 1 else 'them'} to {above}, where the "
                "project's policy files and .agent/ live",
                file=str(root),
            )
        root = above
    tools, src_tools = root / "tools", root / "src" / "tools"
    if tools.is_dir() and src_tools.is_dir():
        raise DeclarationError(
            f"{root} has both tools/ and src/tools/: a project's tool files live in one of "
            "them; move or rename the other",
            file=str(root),
        )
    for candidate in (tools, src_tools):
        if candidate.is_dir():
            return Project(root=root, tools_dir=candidate)
    hint = "put your tool files there"
    if root.name == "tools":
        above = root.parent.parent if root.parent.name == "src" else root.parent
        hint = f"it looks like a tools folder itself: name its project, {above}"
    raise DeclarationError(f"{root} has no tools/ or src/tools/ folder: {hint}", file=str(root))


def default_project(cwd: Path | None = None) -> tuple[Path, bool]:
    """The project the command line uses when none is named; True if it is the bundled one.

    ``.`` when it holds ``tools/`` or ``src/tools/`` (the same folder ``Host.open(".")``
    takes), else the bundled example.
    """
    here = (cwd or Path.cwd()).resolve()
    if (here / "tools").is_dir() or (here / "src" / "tools").is_dir():
        return here, False
    return BUNDLED, True
