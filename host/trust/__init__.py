"""Trust: what the host may believe about what it reads back from disk.

Owns the host's secret key (kept outside every project and cache, in a private file of
the host's user) and the keyed MACs made with it, which the audit (grants, journal
records) and the caches (scopes, the compiled Wasm runtime, the guest library) use to
tell their own writing from anybody else's; and the ownership checks on folders and
files (every component owned by the host's user or root, nobody else may write), with
the quarantine of what fails them. ``docs/security/trust.md`` says what this protects
against and what it cannot.

Imports only the standard library: the lowest wing but ``errors``, next to ``settings``.
"""

from ._keys import KEY_ENV as KEY_ENV
from ._keys import HostKey as HostKey
from ._keys import host_key as host_key
from ._keys import key_path as key_path
from ._paths import PrivateFolder as PrivateFolder
from ._paths import path_problem as path_problem
from ._paths import private_folder as private_folder
from ._paths import quarantine as quarantine

__all__ = [
    "KEY_ENV",
    "HostKey",
    "PrivateFolder",
    "host_key",
    "key_path",
    "path_problem",
    "private_folder",
    "quarantine",
]
