"""Settings that several wings read: the ``[limits]``, ``[env]``, ``[capsules]``,
``[audit]`` and ``[store]`` sections of the policy file, and the units they are written in.

The lowest wing but ``errors``: it imports nothing else of the host. ``policy`` parses
these sections with the rest of the file; ``capsules`` and ``audit`` only read them, so
neither needs the policy to know its limits.
"""

from ._sections import CODE_MEMORY_DEFAULTS as CODE_MEMORY_DEFAULTS
from ._sections import DATA_INSTALL as DATA_INSTALL
from ._sections import DEFAULT_DATA_QUOTA as DEFAULT_DATA_QUOTA
from ._sections import STORE_ENV as STORE_ENV
from ._sections import AuditConfig as AuditConfig
from ._sections import Caller as Caller
from ._sections import CapsulesConfig as CapsulesConfig
from ._sections import CodeRuntime as CodeRuntime
from ._sections import DataFolder as DataFolder
from ._sections import EnvConfig as EnvConfig
from ._sections import EnvRef as EnvRef
from ._sections import Limits as Limits
from ._sections import StoreConfig as StoreConfig
from ._units import Duration as Duration
from ._units import Size as Size
from ._units import parse_duration as parse_duration
from ._units import parse_size as parse_size
