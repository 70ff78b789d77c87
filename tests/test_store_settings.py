"""Which store a host opens: ``Host.open(store=...)``, ``TOOLHOST_STORE``, ``[store]``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from host import Host
from host.errors import HostError, PolicyFileError
from host.policy import load_policy
from host.settings import StoreConfig
from host.testing import in_process

pytestmark = pytest.mark.anyio


def test_the_url_comes_from_the_environment_first() -> None:
    config = StoreConfig.model_validate({"url": {"env": "MY_PG"}})
    with pytest.raises(ValueError, match="MY_PG, which is not set"):
        config.resolve({})
    assert config.resolve({"MY_PG": "postgresql://u:pw@db/x"}) == "postgresql://u:pw@db/x"
    chosen = config.resolve({"MY_PG": "postgresql://a/x", "TOOLHOST_STORE": "postgresql://b/y"})
    assert chosen == "postgresql://b/y"
    assert StoreConfig().resolve({}) is None  # SQLite
    with pytest.raises(ValueError, match="must be a postgresql:// URL"):
        StoreConfig().resolve({"TOOLHOST_STORE": "mysql://x"})


def test_a_policy_may_not_hold_a_password(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('version = 1\n[store]\nurl = "postgresql://u:hunter2@db/x"\n')
    with pytest.raises(PolicyFileError) as caught:
        load_policy([policy], root=tmp_path)
    assert 'url = { env = "NAME" }' in str(caught.value)
    assert "hunter2" not in str(caught.value)
    policy.write_text('version = 1\n[store]\nurl = "postgresql://u@db/x"\nstale_after = "5s"\n')
    config = load_policy([policy], root=tmp_path)
    assert (config.store.url, config.store.stale_after) == ("postgresql://u@db/x", 5.0)


async def test_a_host_refuses_a_store_it_cannot_use(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_project(
        {"desk": "def add(a: int) -> int:\n    return a\n"},
        '[store]\nurl = { env = "NOT_SET_ANYWHERE" }\n',
    )
    monkeypatch.delenv("TOOLHOST_STORE", raising=False)
    with pytest.raises(HostError, match="NOT_SET_ANYWHERE, which is not set"):
        async with Host.open(project, capsule=in_process()):
            pass
    with pytest.raises(HostError, match="must start with postgresql://"):
        async with Host.open(project, capsule=in_process(), store="sqlite:///x.db"):
            pass
