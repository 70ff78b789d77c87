"""The scope: the declarations of every tool, as one model with its renderings.

:class:`Scope` is the model of ``_model`` plus the views the rest of the host asks it
for: the model block, the ``.pyi`` stub, the manifest and the JSON Schemas. The renderers
import the model, never this module, so there is no circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._model import ScopeModel
from ._render import manifest, render_model, render_pyi
from ._schema import tool_schemas

__all__ = ["Scope"]


@dataclass(frozen=True, slots=True, repr=False)
class Scope(ScopeModel):
    """The declarations of all tools: tools in discovery order, types in dependency order."""

    # -- renderings (one model, many views) --------------------------------------------

    def render_model(self) -> str:
        """The model block: what the LLM is told it can call."""
        return render_model(self)

    def render_pyi(self) -> str:
        """``.agent/tool_globals.pyi``: every tool as a global, for editors."""
        return render_pyi(self)

    def manifest(self) -> dict[str, Any]:
        """``.agent/manifest.json``: the whole model as JSON, with schemas."""
        return manifest(self)

    def schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> ``{"input": schema, "output": schema or None}``."""
        return {t.name: tool_schemas(self, t) for t in self.tools}
