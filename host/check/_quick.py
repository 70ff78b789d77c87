"""Quick checks of agent code: the mistakes models make most, in microseconds, no pyright.

The full check (``_checker``) costs a language server round trip, tens of milliseconds,
twenty times a warm run. These checks read the source's syntax tree against the tools'
signatures and catch, before the code runs:

* ``not_awaited``: a tool call that is a statement of its own (``add(1, 2)``), or whose
  result is bound to a name that is then used as a value and never awaited (``x = add(1,
  2)`` then ``x + 1``: pyright's rule misses this one);
* ``unknown_name``: a name bound nowhere (not in the run, not by an earlier run, not a
  builtin, a tool or a name of the declarations), read where a tool would be called;
* ``call``: a tool called with too many positional arguments, a keyword it does not
  take, or without one it needs.

They never report valid code: what they cannot be sure of (a name rebound in the run, a
splat ``*args``, a star import, ``globals()``, a coroutine handed to anything) they let
pass, for pyright or the run itself to judge. Pure: the standard library's ``ast`` only.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from host.capsules import CodeDiagnostic
from host.declare import ToolSpec

__all__ = ["Signature", "parse", "quick_check", "signatures", "stub_names"]

_DYNAMIC: Final = frozenset({"globals", "locals", "vars", "exec", "eval", "__import__"})
"""Calls that can bind names the syntax tree does not show."""
_BUILTINS: Final = frozenset(dir(builtins))
_TYPE_PARAMS: Final = frozenset({"TypeVar", "ParamSpec", "TypeVarTuple"})


@dataclass(frozen=True, slots=True)
class Signature:
    """What a call of one tool may pass: parameter names by kind."""

    positional: tuple[str, ...]
    """Positional-only and positional-or-keyword parameters, in order."""
    keyword: frozenset[str]
    """Parameters a keyword may name (positional-or-keyword and keyword-only)."""
    required: frozenset[str]
    """Parameters without a default (not ``*args``/``**kwargs``)."""
    star_args: bool
    star_kwargs: bool


def signatures(tools: Iterable[ToolSpec]) -> dict[str, Signature]:
    """Signatures by the names agent code calls tools by (``add`` for installed tools,
    and ``tools.FILE.EXPORT[.MEMBER]``), from the discovery's ``ToolSpec``s."""
    found: dict[str, Signature] = {}
    for decl in tools:
        params = decl.params
        positional = tuple(p.name for p in params if p.kind in (0, 1))
        keyword = frozenset(p.name for p in params if p.kind in (1, 3))
        required = frozenset(p.name for p in params if p.kind not in (2, 4) and p.default is None)
        signature = Signature(
            positional,
            keyword,
            required,
            any(p.kind == 2 for p in params),
            any(p.kind == 4 for p in params),
        )
        found[decl.qualified] = signature
        if decl.installed and decl.member is None:
            found[decl.export] = signature
    return found


def stub_names(pyi: str) -> set[str]:
    """The top-level names of the declarations' stub (tools, ``tools``, error classes):
    what agent code may use as builtins."""
    names: set[str] = set()
    try:
        tree = ast.parse(pyi)
    except SyntaxError:
        return names
    for node in tree.body:
        names.update(_defined(node))
    return names


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            found.add(sub.id)
    return found


def parse(source: str) -> ast.Module | None:
    """``source``'s syntax tree, or ``None`` where it is not Python (a syntax error, a
    null character): parsed once per run, read by the quick checks and ``bound_names``
    (which never change it)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def quick_check(
    source: str | ast.Module | None,
    tools: Mapping[str, Signature],
    known: Iterable[str] = (),
    stub: Iterable[str] = (),
) -> list[CodeDiagnostic]:
    """What the quick checks find in ``source``, the code or its tree (:func:`parse`;
    none if it does not parse: the full check or the run says so). ``tools``: signatures
    by call name (``signatures``); ``known``: names earlier runs bound and the run's
    globals; ``stub``: the names of the declarations' stub (``stub_names``)."""
    tree = parse(source) if isinstance(source, str) else source
    if tree is None:
        return []
    nodes, parents = _walk(tree)
    bound = _bound(nodes)
    found: list[CodeDiagnostic] = []
    tool_names = _ToolNames(tools, bound)
    calls = _tool_calls(nodes, tools, tool_names)
    _unawaited(tree, nodes, parents, calls, found)
    _calls(calls, found)
    if not _dynamic(nodes):
        names = stub if isinstance(stub, set | frozenset) else set(stub)
        allowed = (bound, _BUILTINS, set(known), names, tool_names, {"tools"})
        _unknown(nodes, allowed, found)
    found.sort(key=lambda d: (d.line, d.column))
    return found


def _walk(tree: ast.Module) -> tuple[list[ast.AST], dict[ast.AST, ast.AST]]:
    """Every node (in ``ast.walk``'s order) and each one's parent, in one pass: the
    checks below read these lists rather than walking the tree again each."""
    nodes: list[ast.AST] = [tree]
    parents: dict[ast.AST, ast.AST] = {}
    i = 0
    while i < len(nodes):
        node = nodes[i]
        i += 1
        for child in ast.iter_child_nodes(node):
            parents[child] = node
            nodes.append(child)
    return nodes, parents


class _ToolNames:
    """The bare names that call a tool in this run (a tool's, not rebound by the run):
    asked per name, never built as a set (a project may have thousands of tools)."""

    __slots__ = ("_bound", "_tools")

    def __init__(self, tools: Mapping[str, Signature], bound: set[str]) -> None:
        self._tools = tools
        self._bound = bound

    def __contains__(self, name: object) -> bool:
        return (
            isinstance(name, str)
            and name in self._tools
            and "." not in name
            and name not in self._bound
        )


def _bound(nodes: list[ast.AST]) -> set[str]:
    """Every name the run binds anywhere, in any scope (a name bound anywhere is never
    reported: the checks do not follow scopes)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar):
            if node.name:
                names.add(node.name)
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                names.add(node.rest)
        else:
            type_param = getattr(node, "name", None)  # TypeVar & co. (Python 3.12)
            if type(node).__name__ in _TYPE_PARAMS and isinstance(type_param, str):
                names.add(type_param)
    return names


def _dynamic(nodes: list[ast.AST]) -> bool:
    """Whether the run may bind names the tree does not show (``globals()``, a star
    import): then unknown names are left to the run."""
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _DYNAMIC
        ):
            return True
    return False


def _call_name(node: ast.expr, tool_names: _ToolNames) -> str | None:
    """The tool a call's function names: a tool's bare name (not rebound in the run), or
    ``tools.FILE.EXPORT[.MEMBER]``."""
    if isinstance(node, ast.Name):
        return node.id if node.id in tool_names else None
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "tools" and parts:
        return ".".join(["tools", *reversed(parts)])
    return None


def _tool_calls(
    nodes: list[ast.AST], tools: Mapping[str, Signature], tool_names: _ToolNames
) -> list[tuple[ast.Call, str, Signature]]:
    """Every call of a tool in the run: the call, the name it is called by, its signature."""
    calls: list[tuple[ast.Call, str, Signature]] = []
    for node in nodes:
        if isinstance(node, ast.Call):
            name = _call_name(node.func, tool_names)
            signature = tools.get(name) if name is not None else None
            if name is not None and signature is not None:
                calls.append((node, name, signature))
    return calls


def _unawaited(
    tree: ast.Module,
    nodes: list[ast.AST],
    parents: Mapping[ast.AST, ast.AST],
    calls: list[tuple[ast.Call, str, Signature]],
    found: list[CodeDiagnostic],
) -> None:
    pending: dict[str, tuple[ast.Call, str]] = {}
    """A name bound to a tool call's coroutine, at module level -> that call and tool."""
    for node, name, _ in calls:
        parent = parents.get(node)
        if isinstance(parent, ast.Expr):
            found.append(_not_awaited(node, name))
        elif (
            isinstance(parent, ast.Assign)
            and parent in tree.body
            and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name)
        ):
            pending[parent.targets[0].id] = (node, name)
    for variable, (call, name) in pending.items():
        if _misused(nodes, parents, variable, call):
            found.append(
                CodeDiagnostic(
                    line=call.lineno,
                    column=call.col_offset + 1,
                    kind="not_awaited",
                    message=(
                        f'"{variable}" holds the coroutine of a call to "{name}", which is '
                        f'never awaited: write "{variable} = await {name}(...)"'
                    ),
                    rule="quick",
                )
            )


def _misused(
    nodes: list[ast.AST], parents: Mapping[ast.AST, ast.AST], variable: str, call: ast.Call
) -> bool:
    """Whether ``variable`` (bound to a tool call's coroutine) is used as a value and
    never awaited or handed on: only a read as an operand counts against it; any
    ``await variable``, any other use (an argument, an element, a return, a rebinding)
    lets it pass."""
    misused = False
    for node in nodes:
        if not (isinstance(node, ast.Name) and node.id == variable):
            continue
        if isinstance(node.ctx, ast.Store | ast.Del):
            if node.lineno != call.lineno or node.col_offset > call.col_offset:
                return False  # rebound: what it holds later is another matter
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Await):
            return False
        if isinstance(
            parent, ast.BinOp | ast.Compare | ast.UnaryOp | ast.Subscript | ast.FormattedValue
        ) or (isinstance(parent, ast.Attribute) and parent.attr not in ("send", "close")):
            misused = True
            continue
        return False  # handed on (gather, a list, a return...): not ours to judge
    return misused


def _not_awaited(call: ast.Call, name: str) -> CodeDiagnostic:
    return CodeDiagnostic(
        line=call.lineno,
        column=call.col_offset + 1,
        kind="not_awaited",
        message=(
            f'the call to "{name}" is never awaited: tools are async, write "await {name}(...)"'
        ),
        rule="quick",
    )


def _calls(calls: list[tuple[ast.Call, str, Signature]], found: list[CodeDiagnostic]) -> None:
    for node, name, signature in calls:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            continue  # splats: the counts are not known here
        problem = _argument_problem(node, signature)
        if problem is not None:
            found.append(
                CodeDiagnostic(
                    line=node.lineno,
                    column=node.col_offset + 1,
                    kind="call",
                    message=f"{name}: {problem}",
                    rule="quick",
                )
            )


def _argument_problem(node: ast.Call, signature: Signature) -> str | None:
    given = len(node.args)
    if given > len(signature.positional) and not signature.star_args:
        return (
            f"expected at most {len(signature.positional)} positional argument"
            f"{'s' if len(signature.positional) != 1 else ''}, got {given}"
        )
    named = [k.arg for k in node.keywords if k.arg is not None]
    for keyword in named:
        if keyword not in signature.keyword and not signature.star_kwargs:
            return f'no parameter named "{keyword}"'
    covered = set(signature.positional[:given]) | set(named)
    missing = sorted(signature.required - covered, key=_order(signature))
    if missing:
        return f'argument missing for parameter "{missing[0]}"'
    return None


def _order(signature: Signature) -> Callable[[str], tuple[int, str]]:
    index = {name: i for i, name in enumerate(signature.positional)}
    return lambda name: (index.get(name, len(index)), name)


def _unknown(
    nodes: list[ast.AST], allowed: tuple[Container[str], ...], found: list[CodeDiagnostic]
) -> None:
    seen: set[str] = set()
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name = node.func.id
        if name in seen or any(name in names for names in allowed):
            continue
        seen.add(name)
        found.append(
            CodeDiagnostic(
                line=node.func.lineno,
                column=node.func.col_offset + 1,
                kind="unknown_name",
                message=f'"{name}" is not defined: no tool, variable or builtin has that name',
                rule="quick",
            )
        )
