"""The mutation list stays in step with the code (cheap; the job itself runs in CI).

Every mutation's text must occur exactly once in its file (else the code moved and the
break would not be made), its tests must exist, and its names must be unique.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .run import ROOT, Mutation, load

MUTATIONS = load()


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutation_still_applies(mutation: Mutation) -> None:
    text = (ROOT / mutation.file).read_text(encoding="utf-8")
    assert text.count(mutation.find) == 1, f"{mutation.name}: its text moved in {mutation.file}"
    assert mutation.replace != mutation.find and mutation.why
    for test in mutation.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        name = name.partition("[")[0]  # a parametrized case: "test_x[asyncio-subprocess]"
        if name:
            assert f"def {name}(" in Path(ROOT / path).read_text(encoding="utf-8"), test


def test_the_list_covers_the_security_critical_modules() -> None:
    files = {m.file for m in MUTATIONS}
    for module in (
        "host/serve/_inbox_guard.py",  # the inbox guard
        "host/policy/_approval.py",  # approval channels
        "host/audit/_pg.py",  # stores' integrity checks
        "host/_mediator.py",  # the mediator's gates, redaction of errors
        "capsule/_zygote.py",  # zygote hardening
        "host/capsules/_wasm_cache.py",  # caches' MACs
    ):
        assert module in files, module
