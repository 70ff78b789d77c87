"""The command line, ``toolhost``: a thin shell over the public API.

One module per command group (``_call``, ``_exec``, ``_scope``, ``_policy``), each
importing the shared helpers of ``_common``; ``_main`` builds the parser from them. No
other wing imports this one.
"""

from ._main import main as main

__all__ = ["main"]
