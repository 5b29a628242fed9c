"""`.ci/uv_sources.py`: the package sources CI's uv installs take from pip's configuration (files and PIP_*
variables, with pip's precedence), the main index first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "uv_sources.py"


def load_script():
    spec = importlib.util.spec_from_file_location("uv_sources", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uv_gets_pips_sources_with_the_main_index_first_and_no_index_kept(tmp_path, monkeypatch):
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "pip.conf"  # [install] values over [global] ones, and a value on several lines
    config.write_text(
        "[global]\nindex-url = https://global.example/simple\nfind-links = /srv/global-wheels\n"
        "[install]\nindex-url = https://mirror.example/simple\nfind-links = /srv/wheels\n"
        "extra-index-url =\n    file:///srv/a/simple\n    file:///srv/b/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_CONSTRAINT", "/srv/constraints.txt")
    uv_sources = load_script().uv_sources
    assert uv_sources(sys.executable) == [
        "--index-strategy", "unsafe-best-match", "--index", "https://mirror.example/simple",
        "--index", "file:///srv/a/simple", "--index", "file:///srv/b/simple",
        "--find-links", "/srv/wheels", "--constraint", "/srv/constraints.txt",
    ]  # fmt: skip
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip reads the wheel folders only, and so must uv
    assert uv_sources(sys.executable) == [
        "--no-index",
        "--find-links",
        "/srv/wheels",
        "--constraint",
        "/srv/constraints.txt",
    ]
