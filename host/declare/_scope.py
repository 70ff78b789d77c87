"""The scope: the declarations of every tool, as one model with its renderings.

:class:`Scope` is the model of ``_model`` plus the views the rest of the host asks it
for: the model block, the ``.pyi`` stub, the manifest and the JSON Schemas. The renderers
import the model, never this module, so there is no circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._catalog import Catalog
from ._model import ScopeModel
from ._render import manifest, render_model, render_pyi
from ._schema import tool_schemas

__all__ = ["Scope"]


@dataclass(frozen=True, slots=True, repr=False)
class Scope(ScopeModel):
    """The declarations of all tools: tools in discovery order, types in dependency order."""

    _catalog: Catalog | None = field(init=False, default=None, repr=False, compare=False)

    # -- renderings (one model, many views) --------------------------------------------

    def render_model(self, max_chars: int | None = None) -> str:
        """The model block: what the LLM is told it can call. With ``max_chars``, a block
        longer than that is replaced by :meth:`render_index`, which tells the model how
        to search the declarations and read them on demand (code mode's ``toolhost``)."""
        block = render_model(self)
        if max_chars is not None and len(block) > max_chars:
            return self.render_index()
        return block

    def render_pyi(self) -> str:
        """``.agent/tool_globals.pyi``: every tool as a global, for editors."""
        return render_pyi(self)

    def manifest(self) -> dict[str, Any]:
        """``.agent/manifest.json``: the whole model as JSON, with schemas."""
        return manifest(self)

    def schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> ``{"input": schema, "output": schema or None}``."""
        return {t.name: tool_schemas(self, t) for t in self.tools}

    # -- declarations on demand ----------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The search index and stub renderer over these declarations (built on first use)."""
        if self._catalog is None:
            object.__setattr__(self, "_catalog", Catalog(self))
        assert self._catalog is not None
        return self._catalog

    def search(self, query: str, limit: int = 5) -> list[dict[str, str]]:
        """The tools best matching a plain-language ``query``, best first (``Catalog.search``)."""
        return self.catalog.search(query, limit)

    def declaration(self, name: str) -> str:
        """The declarations of one tool or one tool file (``Catalog.declaration``)."""
        return self.catalog.declaration(name)

    def render_index(self) -> str:
        """The short stand-in for the model block: how to search, and the files."""
        return self.catalog.index()
