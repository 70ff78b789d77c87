"""The child process that runs one Wasm guest: ``python -I -S host/_wasm_child.py run SPEC PID
WASMTIME_ROOT``.

It is started by path (not ``-m host...``), so it imports neither the ``host`` package nor
its dependencies: only the standard library, ``wasmtime`` and ``host/_wasm.py``. Its
stdin and stdout are the protocol pipes, which the guest inherits; its stderr is drained
by the host. The guest runs on a thread with a large known stack (wasm stack overflow
traps long before it); a lifeline thread ends the process if the host goes away. A stuck
guest (even one blocked in a WASI call, which epochs cannot interrupt) is ended by the
host killing this process.

``prepare ROOT`` compiles the runtime into the private cache under ROOT and prints the
:class:`Prepared` paths as JSON (run once per cache, by the host, off its event loop).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import ModuleType


def _wasm() -> ModuleType:
    """``host/_wasm.py`` as a standalone module (its top level is standard library only)."""
    path = Path(__file__).resolve().with_name("_wasm.py")
    spec = importlib.util.spec_from_file_location("_toolhost_wasm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _lifeline(parent: int) -> None:
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            os._exit(1)


def main(argv: list[str]) -> int:
    wasm = _wasm()
    if argv[:1] == ["prepare"] and len(argv) == 2:
        prepared = wasm.prepare_blocking(root=Path(argv[1]))
        print(json.dumps(asdict(prepared)))
        return 0
    if argv[:1] != ["run"] or len(argv) not in (3, 4):
        print(
            "usage: _wasm_child.py run SPEC PARENT_PID [WASMTIME_ROOT] | prepare ROOT",
            file=sys.stderr,
        )
        return 2
    if len(argv) == 4:  # started without ``site``: where wasmtime is
        sys.path.append(argv[3])
    spec = wasm.GuestSpec.from_json(argv[1])
    # The parent's pid comes from the parent: one read here could already see a reaper's.
    threading.Thread(target=_lifeline, args=(int(argv[2]),), daemon=True).start()
    status: list[int] = []

    def guest() -> None:
        try:
            status.append(wasm.run_guest(spec))
        except BaseException as exc:  # reported on stderr; the host reads the tail
            print(f"toolhost-wasm: {type(exc).__name__}: {exc}", file=sys.stderr)
            status.append(1)

    threading.stack_size(wasm.GUEST_STACK)
    thread = threading.Thread(target=guest, name="guest")
    thread.start()
    thread.join()
    return status[0] if status else 1


if __name__ == "__main__":
    sys.stderr.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
