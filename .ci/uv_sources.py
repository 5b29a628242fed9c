"""uv's arguments for the package sources pip is configured with, one per line (`.ci/run` installs its venvs
with uv; `benchmarks/bench_ci_install.py` compares the two).

uv does not read pip's configuration, so pip's index, extra indexes, wheel folders and constraints
(`pip config list`, files and PIP_* variables) are passed on. pip weighs every file of every source; uv
takes a version from the first index that has it (`unsafe-best-match` still looks at every index for the
best version). So the main index comes first: it holds every wheel of a release, where a local mirror may
hold only some (this machine's holds the pure-Python soundfile wheel, without its libsndfile).

    python .ci/uv_sources.py [PYTHON]    # PYTHON: an interpreter with pip (default: this one)
"""

from __future__ import annotations

import ast
import subprocess
import sys

PYPI = "https://pypi.org/simple"


# pip's own precedence for `pip install`: PIP_* variables over the [install] section over [global]
SCOPES = {":env:": 3, "install": 2, "global": 1}


def pip_config(python: str) -> dict[str, list[str]]:
    """What `pip install` takes from pip's configuration, by option name, values split on white space (pip
    lists each value as a Python literal)."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    )
    ranked: dict[str, tuple[int, list[str]]] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        rank = SCOPES.get(scope, 0)
        if rank and rank > ranked.get(option, (0, []))[0]:
            ranked[option] = (rank, str(ast.literal_eval(value)).split())
    return {option: values for option, (_, values) in ranked.items()}


def uv_sources(python: str) -> list[str]:
    options = pip_config(python)
    passed = [("find-links", "--find-links"), ("constraint", "--constraint")]
    if options.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        args = ["--no-index"]  # wheel folders only, as pip is told
    else:
        args = ["--index-strategy", "unsafe-best-match", "--index", (options.get("index-url") or [PYPI])[0]]
        passed.insert(0, ("extra-index-url", "--index"))
    for option, flag in passed:
        args += [arg for value in options.get(option, []) for arg in (flag, value)]
    return args


if __name__ == "__main__":
    print("\n".join(uv_sources(sys.argv[1] if len(sys.argv) > 1 else sys.executable)))
