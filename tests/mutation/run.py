"""The mutation job: named single-point breaks of security-critical code, each of which
some test must catch.

    python -m tests.mutation.run [--only NAME ...] [--list]

Each mutation in ``mutations.toml`` names a file, an exact piece of its text (found
exactly once) and what replaces it, and the tests that guard it. For each, the checkout's
packages and tests are copied to a fresh folder, the break is made there, and the tests
run (one process, ``-x``). The break is *killed* when they fail, *survives* when they
pass: a survivor is a bug in the tests. First, as a control, the same tests run on an
unmutated copy and must pass. The kill rate is printed, and written as JSON to
``--report`` if given; the exit status is 1 when anything survived, 2 when the control
failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutations.toml")
COPIED = ("host", "capsule", "tests", "agent_src", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", ".agent")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    find: str
    replace: str
    tests: list[str]
    why: str


def load() -> list[Mutation]:
    with LIST.open("rb") as f:
        data = tomllib.load(f)
    found = [Mutation(**m) for m in data["mutation"]]
    names = [m.name for m in found]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"mutations.toml: names used twice: {sorted(dup)}")
    return found


def apply(mutation: Mutation, tree: Path) -> None:
    path = tree / mutation.file
    text = path.read_text(encoding="utf-8")
    count = text.count(mutation.find)
    if count != 1:
        raise SystemExit(
            f"{mutation.name}: its text occurs {count} times in {mutation.file} (must be 1): "
            "the code moved; update mutations.toml"
        )
    path.write_text(text.replace(mutation.find, mutation.replace), encoding="utf-8")


def run(mutation: Mutation | None, tests: list[str], timeout: float) -> tuple[str, float, str]:
    """Run ``tests`` on a copy of the checkout with ``mutation`` made (None: as it is)."""
    label = mutation.name if mutation is not None else "baseline"
    with tempfile.TemporaryDirectory(prefix=f"mutation-{label}-") as tmp:
        tree = Path(tmp) / "tree"
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=IGNORED)
            else:
                tree.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, tree / name)
        if mutation is not None:
            apply(mutation, tree)
        start = time.monotonic()
        try:
            done = subprocess.run(
                [
                    *(sys.executable, "-m", "pytest", "-q", "-x", "-n", "0"),
                    *("-p", "no:cacheprovider", *tests),
                ],
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.monotonic() - start, ""
        spent = time.monotonic() - start
        tail = (done.stdout + done.stderr)[-1500:]
        if done.returncode == 0:
            return "SURVIVED", spent, tail
        if done.returncode in (2, 3, 4):  # interrupted, internal error, usage, no tests
            return f"error (pytest exit {done.returncode})", spent, tail
        return "killed", spent, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", metavar="NAME", help="run these mutations only")
    parser.add_argument("--list", action="store_true", help="list the mutations and stop")
    parser.add_argument("--report", metavar="FILE", help="write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation")
    args = parser.parse_args()
    mutations = load()
    if args.list:
        for m in mutations:
            print(f"{m.name:45} {m.file}")
        return 0
    if args.only:
        unknown = set(args.only) - {m.name for m in mutations}
        if unknown:
            raise SystemExit(f"no such mutation: {sorted(unknown)}")
        mutations = [m for m in mutations if m.name in args.only]
    # The control: unmutated, the tests pass (else every mutation would look killed).
    tests = sorted({t for m in mutations for t in m.tests})
    outcome, spent, tail = run(None, tests, args.timeout)
    if outcome != "SURVIVED":
        print(f"the tests fail with no mutation made ({outcome}, {spent:.1f} s):\n{tail}")
        return 2
    print(f"{'baseline passes':24} {spent:6.1f} s  ({len(tests)} test files or ids)")
    results: list[dict[str, object]] = []
    for m in mutations:
        outcome, spent, tail = run(m, m.tests, args.timeout)
        print(f"{outcome:24} {spent:6.1f} s  {m.name}", flush=True)
        if outcome != "killed":
            print("  " + tail.replace("\n", "\n  "), flush=True)
        results.append({"name": m.name, "file": m.file, "outcome": outcome, "seconds": spent})
    killed = sum(1 for r in results if str(r["outcome"]).startswith("killed"))
    rate = killed / len(results) if results else 1.0
    print(f"\nkilled {killed} of {len(results)}: kill rate {rate:.0%}")
    if args.report:
        Path(args.report).write_text(
            json.dumps({"kill_rate": rate, "results": results}, indent=2) + "\n"
        )
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
