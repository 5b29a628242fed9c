"""omnipack's layers import one way: no import cycles, no import against the direction, no omnipack imports
hidden inside functions.

The modules are read with ``ast`` (nothing is imported). Every import counts, at module level, inside a
function or under ``TYPE_CHECKING``; importing ``omnipack.a.b`` from outside ``omnipack.a`` also runs
``omnipack.a``'s ``__init__``, so that edge counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = "omnipack"

# Which layers a layer may not import (by the module's second name component: ``omnipack.<layer>...``).
# media <- profiles <- text/stages/inputs; packing holds integers only; the trainer's loader needs none of
# the prepare stack.
FORBIDDEN = {
    "media": {"profiles", "text", "stages", "inputs", "packing", "loader", "tools", "cli", "pipeline"},
    "profiles": {"text", "stages", "inputs", "tools", "cli", "pipeline"},
    "packing": {"profiles", "media", "text"},
    "loader": {"stages", "text", "tools", "cli", "pipeline", "inputs"},
}

# Third-party modules that may be imported inside a function: optional or heavy dependencies that a path
# needs only when it runs (a trainer install lacks the prepare stack; Ray, S3, MSC and plots are extras).
LAZY_ALLOWED = frozenset(
    {
        "PIL",  # images: the trainer-side loader must not import it (tests/trainer_only_check.py)
        "aiohttp",  # media.remote: HTTP fetches only (the remote extra)
        "av",  # PyAV: video/audio decode (the prepare extra)
        "decord",  # video decode (the prepare extra)
        "fsspec",  # remote stores (the remote extra), on the first remote path
        "highspy",  # HiGHS: pack's LP-guided step, only for small plans above the bound (optional)
        "huggingface_hub",  # --tokenizer ORG/NAME from the local Hub cache (the prepare extra)
        "jsonschema",  # the manifest schema check, only for records the plain check cannot pass
        "matplotlib",  # omnipack inspect --plot (the plot extra)
        "megatron",  # Energon and megatron-core: torch and its stack, for the trainer's paths only
        "pyarrow",  # Parquet/Arrow inputs and stage tables
        "ray",  # the Ray executor (the ray extra)
        "rich",  # terminal output, by the commands that draw it
        "soundfile",  # audio decode (the prepare extra)
        "soxr",  # audio resampling (the prepare extra)
        "tokenizers",  # the demo tokenizer and token starts (the prepare extra)
        "torch",  # trainer-side collation; planning never needs it
        "tqdm",  # progress bars, drawn only on a terminal
        "transformers",  # tokenizers and processors (the prepare extra)
        "upath",  # universal-pathlib over fsspec (the remote extra)
    }
)

# omnipack modules that adapt an optional extra and import it at module level: imported only where that extra is
# chosen (inside a function), like the dependency itself. Each must import a LAZY_ALLOWED package at module level.
OPTIONAL_MODULES = {
    "omnipack.executors.ray": "ray",  # --executor ray only
}

# Known violations that work in flight removes, as (importer, imported, kind): none left. The test fails on an
# entry that no longer occurs, so this set only shrinks.
KNOWN_PENDING: frozenset[tuple[str, str, str]] = frozenset()


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # an omnipack module (or package) name
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield child, inner
        yield from _walk(child, inner)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


_TREES: dict[str, ast.Module] = {}  # by source text: every test parses all of omnipack, mostly the same files


def _parsed(path: Path) -> ast.Module:
    source = path.read_text()
    if source not in _TREES:
        _TREES[source] = ast.parse(source, str(path))
    return _TREES[source]


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function) of every import in a module; ``from a import b`` names
    ``a.b`` when that is a module, else ``a``. Third-party imports come back too (with their full name)."""
    tree = _parsed(path)
    is_package = path.name == "__init__.py"
    for node, in_function in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, in_function
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, is_package, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (sub if sub in known else source), node.lineno, in_function


def omnipack_imports(known: dict[str, Path]) -> list[Import]:
    """Every import of an omnipack module by an omnipack module, with the package ``__init__``s it runs."""
    out = []
    for name, path in known.items():
        for target, line, in_function in imports_of(name, path, known):
            if target.split(".")[0] != PACKAGE:
                continue
            parts = target.split(".")
            # the packages it runs on the way (not the root, not the importer's own ancestors: running already)
            for k in range(2, len(parts) + 1):
                mod = ".".join(parts[:k])
                if mod == name or (k < len(parts) and name.startswith(mod + ".")):
                    continue
                out.append(Import(name, mod, line, in_function))
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def cycle_path(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One concrete cycle inside a strongly connected component, for the failure message."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(edges[path[-1]] & members)
        back = [w for w in nxt if w in seen]
        if back:
            return path[path.index(back[0]) :] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"


def violations(known: dict[str, Path]) -> dict[tuple[str, str, str], str]:
    """{(importer, imported, kind): where}: kind "direction", "function" or "cycle"."""
    found: dict[tuple[str, str, str], str] = {}
    imports = omnipack_imports(known)
    for imp in imports:
        where = _where(known[imp.importer], imp.line)
        if layer(imp.target) in FORBIDDEN.get(layer(imp.importer), ()):
            found.setdefault((imp.importer, imp.target, "direction"), where)
        if imp.in_function and imp.target not in OPTIONAL_MODULES:
            found.setdefault((imp.importer, imp.target, "function"), where)
    for name, path in known.items():
        for target, line, in_function in imports_of(name, path, known):
            top = target.split(".")[0]
            if in_function and top != PACKAGE and top not in LAZY_ALLOWED:
                found.setdefault((name, target, "function"), _where(path, line))
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if (imp.importer, imp.target, "direction") in KNOWN_PENDING or (
            imp.importer,
            imp.target,
            "function",
        ) in KNOWN_PENDING:
            continue  # a pending edge's cycle is the pending work itself
        edges.setdefault(imp.importer, set()).add(imp.target)
    for comp in find_cycles(edges):
        path = cycle_path(comp, edges)
        found[(path[0], path[1], "cycle")] = " -> ".join(path) + f"; all of {', '.join(comp)} import each other"
    return found


def test_the_graph_sees_every_kind_of_import():
    """The walker finds module-level, function-level and relative imports (else the test below proves
    nothing)."""
    known = modules()
    assert "omnipack.media.sources" in known and "omnipack.profiles" in known
    got = {(i.importer, i.target, i.in_function) for i in omnipack_imports(known)}
    assert ("omnipack.profiles.base", "omnipack.media.meta", False) in got  # from ..media.meta import
    assert ("omnipack.profiles.base", "omnipack.media", False) in got  # the package it runs
    assert ("omnipack.executors", "omnipack.executors.ray", True) in got  # from .ray import ... in a function
    assert ("omnipack.inputs", "omnipack.inputs.arrow", False) in got  # from . import arrow


def test_optional_modules_are_the_adapters_of_an_optional_dependency():
    """An exemption holds only while the module really imports its extra at module level."""
    known = modules()
    for module, extra in OPTIONAL_MODULES.items():
        assert extra in LAZY_ALLOWED
        top_level = {t.split(".")[0] for t, _, in_function in imports_of(module, known[module], known) if not in_function}
        assert extra in top_level, f"{module} no longer imports {extra} at module level: drop its exemption"


def test_imports_run_one_way():
    found = violations(modules())
    new = {k: v for k, v in found.items() if k not in KNOWN_PENDING}
    stale = sorted(k for k in KNOWN_PENDING if k not in found)
    lines = [f"{kind}: {a} imports {b} ({where})" for (a, b, kind), where in sorted(new.items())]
    assert not new, "imports against the layering:\n" + "\n".join(lines)
    assert not stale, f"KNOWN_PENDING entries that no longer occur (remove them): {stale}"


@pytest.mark.parametrize(
    ("added", "kind"),
    [
        ({"omnipack/media/meta.py": "from ..profiles.base import ModelProfile"}, "direction"),  # (a cycle too)
        ({"omnipack/media/meta.py": "def f():\n    from . import errors"}, "function"),
        ({"omnipack/media/meta.py": "def f():\n    import json"}, "function"),
        ({"omnipack/media/meta.py": "from .errors import MediaError"}, None),  # the right way: no violation
        (
            {"omnipack/media/meta.py": "from .errors import MediaError", "omnipack/media/errors.py": "from . import meta"},
            "cycle",
        ),
    ],
)
def test_a_bad_import_fails(tmp_path, added, kind):
    """An import against the direction, an import inside a function and a cycle are each found."""
    known = modules()
    for k, (module, source) in enumerate(added.items()):
        fake = tmp_path / f"{k}.py"
        fake.write_text((ROOT / module).read_text() + "\n\n" + source + "\n")
        known[module_name(ROOT / module)] = fake
    new = {key for key in violations(known) if key not in KNOWN_PENDING}
    if kind is None:
        assert not new, new
    else:
        assert kind in {key[2] for key in new} and all(key[0].startswith("omnipack.media.") for key in new), new


def test_the_prepare_entry_points_import_no_optional_extra():
    """Importing the CLI and the prepare pipeline loads none of the optional extras and decoders (they are
    imported where a run uses them), which the lazy imports the layering keeps are for."""
    extras = ("ray", "matplotlib", "transformers", "tokenizers", "av", "decord", "soundfile", "soxr", "upath", "s3fs")
    code = (
        "import sys\nimport omnipack.cli, omnipack.pipeline\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({extras!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
