"""False positives of the code checks on a corpus of valid agent code (issue 25).

    .venv/bin/python -m benchmarks.check_corpus

Every snippet of ``tests/quick_check_corpus.py`` is valid in the REPL (with the names
earlier runs bound); a diagnostic on one is a false positive. Both depths are counted:
the quick checks (``host/check/_quick.py``) and pyright's full check, through a real host
over the corpus's tools (``add``, ``search``, ``log``, ``close``). Prints each flagged
snippet with what was said.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))


async def _measure(root: Path) -> None:
    from host import Host
    from tests.quick_check_corpus import CORPUS, KNOWN
    from tests.test_quick_check import TOOLS

    (root / "tools").mkdir(parents=True)
    (root / "tools" / "desk.py").write_text(TOOLS, encoding="utf-8")
    (root / "policy.toml").write_text('version = 1\n[defaults]\nagent = "allow"\n')
    flagged: dict[str, dict[str, list[str]]] = {"quick": {}, "full": {}}
    kinds: dict[str, Counter[str]] = {"quick": Counter(), "full": Counter()}
    spent = {"quick": 0.0, "full": 0.0}
    async with Host.open(root) as host:
        checker = host.checker
        await checker.check("x = 1\n", mode="warn")  # the server's start, not counted
        for name, source in CORPUS.items():
            start = time.perf_counter()
            quick = checker.quick(source, known=KNOWN)
            spent["quick"] += time.perf_counter() - start
            start = time.perf_counter()
            full = await checker.check(source, mode="warn", known=KNOWN)
            spent["full"] += time.perf_counter() - start
            if quick:
                flagged["quick"][name] = [str(d) for d in quick]
                kinds["quick"].update(d.kind for d in quick)
            if full.status != "clean":
                flagged["full"][name] = [str(d) for d in full.diagnostics] or [str(full.note)]
                kinds["full"].update(d.kind for d in full.diagnostics or ())
    total = len(CORPUS)
    for depth in ("quick", "full"):
        count = len(flagged[depth])
        mean = spent[depth] / total * 1000
        print(f"{depth}: {count} of {total} valid snippets flagged ({mean:.2f} ms a check)")
        by_kind = ", ".join(f"{kind} {n}" for kind, n in kinds[depth].most_common()) or "none"
        print(f"  false positives by kind: {by_kind}")
        for name, said in flagged[depth].items():
            print(f"  {name}: {'; '.join(said)}")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(_measure, Path(folder) / "project")


if __name__ == "__main__":
    main()
