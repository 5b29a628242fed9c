"""Where the test suite's time goes: wall and CPU seconds per test file, setup apart from the test itself.

A pytest plugin and a script. As a plugin (``-p benchmarks.suite_profile``, with the checkout on PYTHONPATH)
it writes one JSON line per test phase (setup, call, teardown) to ``$SUITE_PROFILE_OUT/<worker>-<pid>.jsonl``:
the phase's wall seconds, the CPU seconds of the test process (user + system) and of the child processes it
waited for in that phase (``RUSAGE_CHILDREN``: fresh interpreters, pool workers, Energon loader workers). Not
counted: processes the test process does not wait for itself (children forked from the warm prepare server
of ``tests/prepare_child.py``, a Ray cluster's processes). Works under ``pytest -n 2`` (each worker writes
its own file). As a script it prints the table of one such folder, slowest files first:

    PYTHONPATH=$PWD SUITE_PROFILE_OUT=/tmp/prof python -m pytest -q -n 2 -p benchmarks.suite_profile
    python benchmarks/suite_profile.py /tmp/prof [--tests 30] [--by wall|cpu]

With ``SUITE_PROFILE_GC=1`` the plugin also times a ``gc.collect()`` after every test (a "gc" phase) and the
script lists the tests whose collection took over ``--gc-over`` seconds: what such a test leaves in reference
cycles (a loader iterator whose workers then stop at PyTorch's 5 s join timeout) costs the next test. (The
tests' conftest freezes what is alive before each test's body, out of the collector's reach; not in this mode.)
Run it without ``PYTHONDONTWRITEBYTECODE``: every process the tests start would compile its imports again.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

OUT_ENV = "SUITE_PROFILE_OUT"
GC_ENV = "SUITE_PROFILE_GC"  # set: a timed gc.collect() after every test ("gc" phase)


def _cpu() -> tuple[float, float]:
    """(this process, its waited-for children): user + system CPU seconds so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@contextlib.contextmanager
def _record(item: pytest.Item, phase: str) -> Iterator[None]:
    start, (own0, children0) = time.perf_counter(), _cpu()
    yield
    own1, children1 = _cpu()
    out = Path(os.environ.get(OUT_ENV, "suite-profile"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"id": item.nodeid, "phase": phase, "wall": time.perf_counter() - start,
            "self": own1 - own0, "children": children1 - children0}  # fmt: skip
    with open(out / f"{worker}-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _record(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _record(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _record(item, "teardown"):
        yield
    if os.environ.get(GC_ENV):
        # A collection right after the test: what it left in reference cycles is finalized here, charged to it
        # (a PyTorch loader iterator collected this way stops each worker at a 5 s join timeout).
        with _record(item, "gc"):
            gc.collect()


def _sums(folder: Path) -> tuple[dict[str, collections.Counter], dict[str, collections.Counter]]:
    """Per file and per test: wall, self and children CPU seconds, in total and per phase; tests per file."""
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            for sums in (files[r["id"].split("::")[0]], tests[r["id"]]):
                for k in ("wall", "self", "children"):
                    sums[f"{r['phase']}_{k}"] += r[k]
                    if r["phase"] != "gc":  # the probe's collections are not the test's time
                        sums[k] += r[k]
                if r["phase"] != "gc":
                    sums["cpu"] += r["self"] + r["children"]
                sums["tests"] += r["phase"] == "call"
    return files, tests


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--tests", type=int, default=0, help="also list this many slowest tests")
    p.add_argument("--by", choices=["wall", "cpu"], default="cpu")
    p.add_argument("--gc-over", type=float, default=1.0, help=f"list the tests whose {GC_ENV} collection took longer")
    a = p.parse_args(argv)
    files, tests = _sums(a.folder)
    print("| file | tests | wall s | setup wall s | CPU s | CPU s of waited-for children |")
    print("|---|---:|---:|---:|---:|---:|")
    total: collections.Counter = collections.Counter()
    for name, s in sorted(files.items(), key=lambda kv: -kv[1][a.by]):
        total.update(s)
        print(f"| {name} | {s['tests']} | {s['wall']:.1f} | {s['setup_wall']:.1f} | {s['cpu']:.1f} | {s['children']:.1f} |")
    print(f"| all | {total['tests']} | {total['wall']:.1f} | {total['setup_wall']:.1f} | {total['cpu']:.1f} | {total['children']:.1f} |")
    if a.tests:
        print("\n| test | wall s | setup wall s | CPU s |\n|---|---:|---:|---:|")
        for name, s in sorted(tests.items(), key=lambda kv: -kv[1][a.by])[: a.tests]:
            print(f"| {name} | {s['wall']:.1f} | {s['setup_wall']:.1f} | {s['cpu']:.1f} |")
    if total["gc_wall"]:
        print(f"\n{GC_ENV}=1: {total['gc_wall']:.1f} s in the collections after the tests (not in the table)")
    slow_gc = sorted(((s["gc_wall"], name) for name, s in tests.items() if s["gc_wall"] > a.gc_over), reverse=True)
    if slow_gc:
        print(f"\nCollections over {a.gc_over:g} s after a test ({GC_ENV}=1): something the test left is stopped by the")
        print("garbage collector (the next test would pay it)\n\n| test | gc s |\n|---|---:|")
        for wall, name in slow_gc:
            print(f"| {name} | {wall:.1f} |")


if __name__ == "__main__":
    main()
