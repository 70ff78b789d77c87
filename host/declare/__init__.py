"""Declare: what tools exist and what the model is told about them.

Owns discovery (``ast``: no tool code runs in the host), the project folder, the pyright
probe, the type index and canonical type text, data shapes, the scope model and its
renderings (model block, ``.pyi``, manifest, JSON Schemas), docstrings, the scope cache and
the builder that ties them together.

Imports only ``host.errors`` (and the standard library, pydantic-free). Never imports
``policy``, ``audit``, ``capsules``, ``cli`` or the orchestrator: the other wings read
the scope, the scope reads nobody. What other wings may use is listed below.
"""

from ._cache import cache_root as cache_root
from ._cache import load_or_build_scope as load_or_build_scope
from ._catalog import HELPERS as HELPERS
from ._catalog import HELPERS_PYI as HELPERS_PYI
from ._catalog import MAX_QUERY as MAX_QUERY
from ._catalog import MAX_RESULTS as MAX_RESULTS
from ._catalog import Catalog as Catalog
from ._catalog import helper_call as helper_call
from ._discovery import discover as discover
from ._docstrings import prose as prose
from ._project import Project as Project
from ._project import default_project as default_project
from ._project import resolve_project as resolve_project
from ._schema import ArgumentValidator as ArgumentValidator
from ._scope import Scope as Scope
from ._specs import NO_DEFAULT as NO_DEFAULT
from ._specs import POSITIONAL_ONLY as POSITIONAL_ONLY
from ._specs import POSITIONAL_OR_KEYWORD as POSITIONAL_OR_KEYWORD
from ._specs import VAR_KEYWORD as VAR_KEYWORD
from ._specs import VAR_POSITIONAL as VAR_POSITIONAL
from ._specs import Discovery as Discovery
from ._specs import Param as Param
from ._specs import ToolSpec as ToolSpec

__all__ = [
    "cache_root",
    "HELPERS",
    "HELPERS_PYI",
    "MAX_QUERY",
    "MAX_RESULTS",
    "Catalog",
    "helper_call",
    "load_or_build_scope",
    "NO_DEFAULT",
    "POSITIONAL_ONLY",
    "POSITIONAL_OR_KEYWORD",
    "VAR_KEYWORD",
    "VAR_POSITIONAL",
    "Discovery",
    "Param",
    "ToolSpec",
    "discover",
    "prose",
    "Project",
    "default_project",
    "resolve_project",
    "ArgumentValidator",
    "Scope",
]
