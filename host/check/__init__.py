"""Check: agent code type-checked against the declarations before it runs.

Owns the long-lived pyright language server of a host (``_langserver.py``: the process,
its JSON-RPC over stdio, the one brittle edge of the check) and the checker that feeds it
a run's source with every tool as a builtin (``__builtins__.pyi`` from the scope's
``.pyi``) and reads back diagnostics a model can act on (``_checker.py``), and the quick
checks every run gets from its syntax tree (``_quick.py``).

May import ``capsules`` (the result models), ``declare`` (the scope), ``settings`` and
``errors``. Imported by the orchestrator, ``serve`` and ``cli`` (to render a check).
"""

from ._checker import CodeChecker as CodeChecker
from ._checker import bound_names as bound_names
from ._checker import check_lines as check_lines
from ._checker import merged as merged
from ._checker import refusal as refusal
from ._quick import parse as parse

__all__ = ["CodeChecker", "bound_names", "check_lines", "merged", "parse", "refusal"]
