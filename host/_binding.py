"""Bind a call's arguments to the tool's signature and freeze them as canonical bytes.

The signature comes from discovery (the host never imports tool modules). Binding maps
positional arguments to names and applies literal defaults, so policy and approvers see
every value the tool will receive by name. Each value must be plain data (DESIGN.md
section 6); the bound map is encoded once, and those bytes are what the capsule receives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from capsule.protocol import MAX_DEPTH, encode

from ._discovery import (
    NO_DEFAULT,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    ToolSpec,
)
from .errors import InvalidArguments

__all__ = ["BoundCall", "bind", "check_value"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_SCALARS: Final = (str, float, bool, bytes, type(None))


@dataclass(frozen=True, slots=True)
class BoundCall:
    """Arguments bound by parameter name, and their frozen canonical encoding."""

    arguments: Mapping[str, Any]
    """Parameter name -> value, in signature order (a private copy)."""
    encoded: bytes
    """The canonical msgpack bytes of ``arguments``: what the capsule executes."""


def _where(param: str, path: str) -> str:
    return param + path


def check_value(tool: str, param: str, value: Any) -> Any:
    """Return a private plain-data copy of ``value`` (tuples become lists), or raise."""
    return _copy(tool, param, value, "", 0)


def _copy(tool: str, param: str, value: Any, path: str, depth: int) -> Any:
    cls = cast("type[Any]", type(value))
    if cls in _SCALARS:
        return value
    if cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise InvalidArguments(
            tool, f"{_where(param, path)}: integer does not fit in 64 bits", parameter=param
        )
    if depth >= MAX_DEPTH:
        raise InvalidArguments(
            tool, f"{_where(param, path)}: nested deeper than {MAX_DEPTH}", parameter=param
        )
    if cls is list or cls is tuple:
        return [_copy(tool, param, v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if cls is dict:
        out: dict[str, Any] = {}
        for k, v in value.items():  # pyright: ignore[reportUnknownVariableType]
            if type(k) is not str:
                raise InvalidArguments(
                    tool,
                    f"{_where(param, path)}: dict keys must be str, not {type(k).__name__}",  # pyright: ignore[reportUnknownArgumentType]
                    parameter=param,
                )
            out[k] = _copy(tool, param, v, f"{path}[{k!r}]", depth + 1)
        return out
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _copy(tool, param, int(value), path, depth)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)  # pyright: ignore[reportUnknownArgumentType]
    raise InvalidArguments(
        tool,
        f"{_where(param, path)}: {cls.__name__} is not plain data "
        "(pass None, bool, int, float, str, bytes, list or dict with str keys)",
        parameter=param,
    )


def bind(spec: ToolSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BoundCall:
    """Bind ``args``/``kwargs`` to ``spec``'s signature. Raises :class:`InvalidArguments`."""
    tool = spec.name
    bound: dict[str, Any] = {}
    params = spec.params
    remaining = dict(kwargs)
    i = 0
    var_kw: str | None = None
    for param in params:
        kind = param.kind
        if kind == VAR_POSITIONAL:
            extra = list(args[i:])
            i = len(args)
            bound[param.name] = [check_value(tool, param.name, v) for v in extra]
            continue
        if kind == VAR_KEYWORD:
            var_kw = param.name
            continue
        if kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD) and i < len(args):
            if param.name in remaining and kind == POSITIONAL_OR_KEYWORD:
                raise InvalidArguments(
                    tool, f"got multiple values for {param.name!r}", parameter=param.name
                )
            bound[param.name] = check_value(tool, param.name, args[i])
            i += 1
            continue
        if kind != POSITIONAL_ONLY and param.name in remaining:
            bound[param.name] = check_value(tool, param.name, remaining.pop(param.name))
            continue
        if param.default is None:
            raise InvalidArguments(
                tool, f"missing required argument {param.name!r}", parameter=param.name
            )
        if param.value is not NO_DEFAULT:
            bound[param.name] = check_value(tool, param.name, param.value)
        # A non-literal default is applied by the tool itself, in the capsule.
    if i < len(args):
        takes = sum(p.kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD) for p in params)
        raise InvalidArguments(
            tool, f"takes {takes} positional arguments but {len(args)} were given"
        )
    if remaining:
        if var_kw is None:
            name = next(iter(remaining))
            positional_only = any(p.name == name and p.kind == POSITIONAL_ONLY for p in params)
            problem = (
                f"{name!r} is positional-only; pass it by position"
                if positional_only
                else f"unexpected keyword argument {name!r}"
            )
            raise InvalidArguments(tool, problem, parameter=name)
        extra_kw: dict[str, Any] = {}
        for key, value in remaining.items():
            if type(key) is not str:  # pyright: ignore[reportUnnecessaryComparison]
                raise InvalidArguments(tool, "keyword names must be str", parameter=var_kw)
            extra_kw[key] = check_value(tool, key, value)
        bound[var_kw] = extra_kw
    try:
        encoded = encode(bound)
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - check_value guards
        raise InvalidArguments(tool, f"cannot encode arguments: {exc}") from exc
    return BoundCall(bound, encoded)
