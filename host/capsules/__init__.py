"""Capsules: the processes tools and agent code run in, and the pipes to them.

Owns the transport interface and its framing client, the event-loop primitives of the
hot path, process ownership (start, harden, kill a whole tree), the subprocess and Wasm
tool capsules, the supervisor (timeouts, crashes, restarts), the Wasm runtime and its
child process and fork server, and the code sandbox (``run_code``).

Its connections also carry a tool context's frames, served only for calls in flight that
were sent with a context, through the ``ContextHandler`` the orchestrator gives them.

May import ``settings``, ``declare``, the root helpers ``_binding``, ``_events`` and
``_display`` (redacting console output), ``capsule.protocol`` (the wire) and
``capsule.context`` (its types). Never imports ``policy``, ``audit`` or ``cli``: a
capsule is told what to run, it never decides. ``_wasm_child.py`` runs by path in its own
process and imports nothing of the host. What other wings may use is listed below.
"""

from ._capsule_pool import CapsulePool as CapsulePool
from ._capsule_pool import wanted as capsule_pool_wanted
from ._code_results import LOST as LOST
from ._code_results import CodeCall as CodeCall
from ._code_results import CodeCheck as CodeCheck
from ._code_results import CodeDiagnostic as CodeDiagnostic
from ._code_results import CodeError as CodeError
from ._code_results import CodeResult as CodeResult
from ._egress import EgressProxy as EgressProxy
from ._egress import proxy_env as proxy_env
from ._guard import Containment as Containment
from ._guard import containment as containment
from ._process import minimal_env as minimal_env
from ._run_options import RunOptions as RunOptions
from ._run_options import read_options as read_options
from ._runtimes import RUNTIMES as RUNTIMES
from ._runtimes import Prepared as Prepared
from ._runtimes import WasmUnavailable as WasmUnavailable
from ._runtimes import prepare_runtime as prepare_runtime
from ._runtimes import wasm_cache as wasm_cache
from ._sandbox import CodeSandbox as CodeSandbox
from ._sandbox import SandboxPool as SandboxPool
from ._subprocess import check_interpreter as check_interpreter
from ._supervisor import Supervisor as Supervisor
from ._transport import ContextFailure as ContextFailure
from ._transport import ContextHandler as ContextHandler
from ._transport import FileReport as FileReport
from ._transport import LoadReport as LoadReport
from ._transport import LoadRequest as LoadRequest
from ._transport import TransportFactory as TransportFactory
from ._wasm_capsule import capsule_of as capsule_of
from ._wasm_capsule import tool_capsules as tool_capsules

__all__ = [
    "LOST",
    "minimal_env",
    "RUNTIMES",
    "WasmUnavailable",
    "Prepared",
    "wasm_cache",
    "prepare_runtime",
    "CodeCall",
    "CodeCheck",
    "CodeDiagnostic",
    "RunOptions",
    "read_options",
    "CodeError",
    "CodeResult",
    "Containment",
    "containment",
    "EgressProxy",
    "proxy_env",
    "CodeSandbox",
    "SandboxPool",
    "CapsulePool",
    "capsule_pool_wanted",
    "check_interpreter",
    "Supervisor",
    "ContextFailure",
    "ContextHandler",
    "FileReport",
    "LoadReport",
    "LoadRequest",
    "TransportFactory",
    "capsule_of",
    "tool_capsules",
]
