"""The gate every call passes: bind -> decide -> dispatch (DESIGN.md section 3).

The mediator resolves the tool name exactly (never fuzzily), binds and checks the
arguments against the signature, freezes them as canonical bytes, asks the policy for a
decision, and only then dispatches those same bytes to the session's capsule. A denied
call never reaches a capsule.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._binding import BoundCall, bind
from ._config import PolicyConfig
from ._discovery import Discovery, ToolSpec
from .errors import InvalidArguments, NotApproved, PolicyDenied, UnknownTool

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["Caller", "Decision", "Mediator"]

Caller = Literal["agent", "script", "app", "tool"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What policy decided about one call, and which rule decided it."""

    decision: Literal["allow", "deny", "escalate"]
    rule: str
    reason: str | None = None


_ALLOW_ALL = Decision("allow", "builtin:allow-all", "rule evaluation is not enabled yet")


class Mediator:
    """Resolves, binds, decides and dispatches calls for every session of a host."""

    def __init__(self, discovery: Discovery, config: PolicyConfig) -> None:
        self._discovery = discovery
        self._config = config
        self._ids = itertools.count(1)
        names: dict[str, ToolSpec] = {}
        for spec in discovery.tools.values():
            names[spec.name] = spec
            names[spec.qualified] = spec
        self._names = names

    @property
    def config(self) -> PolicyConfig:
        return self._config

    def lookup(self, name: str) -> ToolSpec:
        """The tool with exactly this name (or ``tools.FILE.EXPORT`` path)."""
        spec = self._names.get(name) if type(name) is str else None
        if spec is None:
            raise UnknownTool(name if isinstance(name, str) else repr(name))  # pyright: ignore[reportUnnecessaryIsInstance]
        return spec

    def bind(self, spec: ToolSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BoundCall:
        bound = bind(spec, args, kwargs)
        limit = self._config.limits.max_argument_size
        if len(bound.encoded) > limit:
            raise InvalidArguments(
                spec.name,
                f"the arguments take {len(bound.encoded)} bytes encoded, over the limit of "
                f"{limit} ([limits] max_argument_size); pass a reference instead of the data",
            )
        return bound

    def decide(self, spec: ToolSpec, bound: BoundCall, caller: Caller, session: str) -> Decision:
        """The policy decision for one bound call (every call is allowed for now)."""
        del spec, bound, caller, session
        return _ALLOW_ALL

    async def call(
        self,
        supervisor: Supervisor,
        session: str,
        name: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        caller: Caller,
    ) -> Any:
        """One mediated call, from name to value."""
        spec = self.lookup(name)
        bound = self.bind(spec, args, kwargs)
        decision = self.decide(spec, bound, caller, session)
        if decision.decision == "deny":
            raise PolicyDenied(spec.name, rule=decision.rule, reason=decision.reason)
        if decision.decision == "escalate":
            raise NotApproved(spec.name, reason="no approver is configured", rule=decision.rule)
        call_id = next(self._ids)
        return await supervisor.call(call_id, spec, bound, self._config.limits.call_timeout)
