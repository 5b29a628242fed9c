"""uv's arguments for the package sources pip is configured with, one per line (`.ci/run` installs its venvs
with uv; `benchmarks/bench_ci_install.py` compares the two).

uv does not read pip's configuration, so what `pip install` takes from it (`pip config list`: its files and
PIP_* variables) is passed on: the index, extra indexes, wheel folders, constraints, `no-index`, `pre`,
`only-binary`/`no-binary` and trusted hosts. pip weighs every file of every source; uv takes a version from
the first index that has it (`unsafe-best-match` still looks at every index for the best version). So the
main index comes first: it holds every wheel of a release, where a local mirror may hold only some (this
machine's holds the pure-Python soundfile wheel, without its libsndfile). It is also uv's default index, so
that uv, like pip, never falls back to PyPI behind a configured one. uv's own configuration files are not
read (`--no-config`). A certificate bundle or proxy reaches uv through the environment (SSL_CERT_FILE,
HTTPS_PROXY), not through pip's `cert` and `proxy`.

    python .ci/uv_sources.py [PYTHON]    # PYTHON: an interpreter with pip (default: this one)
"""

from __future__ import annotations

import ast
import subprocess
import sys

PYPI = "https://pypi.org/simple"
# pip's own precedence for `pip install`: PIP_* variables over the [install] section over [global]
SCOPES = {":env:": 3, "install": 2, "global": 1}
TRUE = ("y", "yes", "t", "true", "on", "1")  # pip's strtobool
LISTS = (  # pip option: uv flag, once per value
    ("extra-index-url", "--index"),
    ("find-links", "--find-links"),
    ("constraint", "--constraint"),
    ("only-binary", "--only-binary"),
    ("no-binary", "--no-binary"),
    ("trusted-host", "--allow-insecure-host"),
)


def parse_pip_config(listed: str) -> dict[str, list[str]]:
    """What `pip install` takes from `pip config list`'s output (``scope.option='value'``, the value a Python
    literal), by option name, values split on white space. Empty values are skipped, as pip skips them."""
    ranked: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        values = str(ast.literal_eval(value)).split() if value else []
        rank = SCOPES.get(scope, 0)
        if values and rank > ranked.get(option, (0, []))[0]:
            ranked[option] = (rank, values)
    return {option: values for option, (_, values) in ranked.items()}


def uv_arguments(options: dict[str, list[str]]) -> list[str]:
    """uv's arguments for pip's configured ``options`` (``parse_pip_config``)."""
    args = ["--no-config"]
    no_index = options.get("no-index", ["0"])[0].lower() in TRUE
    if no_index:
        args.append("--no-index")  # wheel folders only, as pip is told (its extra indexes dropped too)
    else:
        main = (options.get("index-url") or [PYPI])[0]
        args += ["--index-strategy", "unsafe-best-match", "--index", main, "--default-index", main]
    if options.get("pre", ["0"])[0].lower() in TRUE:
        args += ["--prerelease", "allow"]
    for option, flag in LISTS:
        if not (no_index and option == "extra-index-url"):
            args += [arg for value in options.get(option, []) for arg in (flag, value)]
    return args


def uv_sources(python: str) -> list[str]:
    """uv's arguments for the sources ``python``'s pip is configured with."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    )
    return uv_arguments(parse_pip_config(listed.stdout))


if __name__ == "__main__":
    print("\n".join(uv_sources(sys.argv[1] if len(sys.argv) > 1 else sys.executable)))
