"""`.ci/uv_sources.py`: the package sources CI's uv installs take from pip's configuration (files and PIP_*
variables, with pip's precedence), the main index first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "uv_sources.py"


def load_script():
    spec = importlib.util.spec_from_file_location("uv_sources", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed(**values: str) -> str:
    """`pip config list`'s output for ``values`` (``scope__option=value``), each printed as pip does: repr."""
    return "".join(f"{key.replace('__', '.').replace('_', '-')}={value!r}\n" for key, value in values.items())


def test_uv_gets_what_pip_install_takes_from_its_configuration():
    """PIP_* variables over [install] over [global], empty values skipped, values on several lines split, the
    main index first and also uv's default (no fallback to PyPI), booleans as pip reads them."""
    uv = load_script()
    config = uv.parse_pip_config(
        listed(
            global__index_url="https://global.example/simple",
            global__find_links="/srv/global-wheels",
            global__constraint="/srv/global-constraints.txt",
            install__index_url="https://mirror.example/simple",
            install__find_links="/srv/wheels",
            install__constraint="/srv/install-constraints.txt",
            install__extra_index_url="\nfile:///srv/a/simple\nfile:///srv/b/simple",
            **{":env:.constraint": "/srv/constraints.txt", ":env:.find-links": "", ":env:.pre": "t"},
        )
    )
    assert uv.uv_arguments(config) == [
        "--no-config", "--index-strategy", "unsafe-best-match", "--index", "https://mirror.example/simple",
        "--default-index", "https://mirror.example/simple", "--prerelease", "allow",
        "--index", "file:///srv/a/simple", "--index", "file:///srv/b/simple",
        "--find-links", "/srv/wheels", "--constraint", "/srv/constraints.txt",
    ]  # fmt: skip
    # no index, as pip is told (its extra indexes dropped too); an empty value is no value
    no_index = uv.parse_pip_config(listed(global__no_index="yes", global__extra_index_url="http://a/simple"))
    assert uv.uv_arguments(no_index) == ["--no-config", "--no-index"]
    assert uv.uv_arguments(uv.parse_pip_config(listed(global__no_index="")))[:3] == [
        "--no-config", "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip


def test_the_script_reads_pips_own_listing(tmp_path, monkeypatch):
    """The same through a real `pip config list` (pip's format), where this venv has pip (CI's venvs do not)."""
    pytest.importorskip("pip")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "pip.conf"
    config.write_text(
        "[install]\nindex-url = https://mirror.example/simple\nextra-index-url =\n    http://x/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/wheels")
    args = load_script().uv_sources(sys.executable)
    assert args[args.index("--index") + 1] == "https://mirror.example/simple"
    assert args[args.index("--find-links") + 1] == "/srv/wheels" and "http://x/simple" in args
