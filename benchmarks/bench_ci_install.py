"""CI's venv installs: pip (as CI ran it: pip upgraded, then `pip install --no-compile`) against uv (as
`.ci/run` runs it, with the sources pip is configured with: `.ci/uv_sources.py`), for each of CI's three
venvs, taking turns.

Each install goes into a fresh venv: wall seconds and the CPU seconds of the installer's process tree
(``RUSAGE_CHILDREN``), then what it installed, package by package: name, version and wheel tags (from each
``*.dist-info``; pip itself left out, as the uv venvs have none). The table lists every package where the
two installers differ. Both read their caches, which a first run fills (the table is of warm caches, as
CI's are on a machine that ran it before). Run from the repository root; needs pip and network access to the indexes.

    python benchmarks/bench_ci_install.py --rounds 2
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.utils import canonicalize_name  # transformers' dependency: in the project's venv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
from uv_sources import uv_sources  # noqa: E402

VENVS = {  # as .ci/run installs them (the trainer venv's two steps in one)
    "main (.[test])": ["torch==2.13.0", "-e", ".[test]"],
    "trainer (.[megatron,s3])": ["torch==2.13.0", ".[megatron,s3]"],
    "vision (torch 2.14.1, torchvision)": ["torch==2.14.1", "torchvision==0.29.1", "-e", ".[prepare]"]
    + ["pytest>=8", "hypothesis>=6.100"],
}


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the command's process tree) of running ``cmd`` in the repository root."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def installed(venv: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each installed distribution's normalized name (PEP 503): (version, its wheel's tags)."""
    found = {}
    for dist in importlib.metadata.distributions(
        path=[str(p) for p in venv.glob("lib/python*/site-packages")]
    ):
        wheel = email.parser.Parser().parsestr(dist.read_text("WHEEL") or "")
        found[canonicalize_name(dist.metadata["Name"])] = (dist.version, tuple(sorted(wheel.get_all("Tag", []))))
    found.pop("pip", None)
    return found


def difference(name: str, pip_has: tuple | None, uv_has: tuple | None) -> str:
    """How one package differs: versions, with the tags where those differ (None: not installed)."""
    tags_differ = pip_has and uv_has and pip_has[1] != uv_has[1]

    def shown(has: tuple | None) -> str:
        if has is None:
            return "none"
        return f"{has[0]} ({' '.join(has[1])})" if tags_differ else has[0]

    return f"{name}: pip {shown(pip_has)}, uv {shown(uv_has)}"


def install(tool: str, venv: Path, uv: Path, sources: list[str], packages: list[str]) -> tuple[float, float]:
    if tool == "pip":
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run(
            [venv / "bin/python", "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True
        )  # as CI had
        return timed([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-compile", *packages])
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    return timed([str(uv), "pip", "install", "-q", "--python", str(venv / "bin/python"), *sources, *packages])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="installs per venv and installer (best kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ci-install-") as tmp:
        tools = Path(tmp) / "uv"
        subprocess.run([sys.executable, "-m", "venv", tools], check=True)
        subprocess.run([tools / "bin/python", "-m", "pip", "install", "-q", "uv==0.13.9"], check=True)
        sources = uv_sources(str(tools / "bin/python"))
        rows = []
        for label, packages in VENVS.items():
            best: dict[str, tuple[float, float]] = {}
            got: dict[str, dict] = {}
            for round_ in range(args.rounds):
                for tool in ("pip", "uv"):
                    venv = Path(tmp) / f"{tool}-{round_}"
                    wall, cpu = install(tool, venv, tools / "bin/uv", sources, packages)
                    best[tool] = min(best.get(tool, (wall, cpu)), (wall, cpu))
                    got[tool] = installed(venv)
                    shutil.rmtree(venv)
            pip_got, uv_got = got["pip"], got["uv"]
            differ = sorted(k for k in pip_got.keys() | uv_got.keys() if pip_got.get(k) != uv_got.get(k))
            rows.append(
                (label, best, len(pip_got), [difference(k, pip_got.get(k), uv_got.get(k)) for k in differ])
            )
    print(
        "| venv | pip wall s | pip CPU s | uv wall s | uv CPU s | CPU ratio | packages | where they differ |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, best, count, differ in rows:
        (pw, pc), (uw, uc) = best["pip"], best["uv"]
        where = "; ".join(differ) or "nowhere (same versions and wheel tags)"
        print(f"| {label} | {pw:.1f} | {pc:.1f} | {uw:.1f} | {uc:.1f} | x{pc / uc:.1f} | {count} | {where} |")


if __name__ == "__main__":
    main()
