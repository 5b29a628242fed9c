"""The trainer-only install loads every model family, with and without context parallelism.

Two steps, run by ``.ci/run`` in two virtual environments:

``python tests/trainer_only_check.py prepare OUT``
    In the full install (``.[test]``): one small demo dataset per family in ``OUT/<family>`` (images,
    video and audio where the family takes them), and ``OUT/expected.json``: a digest of every batch the
    loader gives for it at cp=1 and at each rank of cp=2.

``python tests/trainer_only_check.py check OUT``
    In a trainer install (``pip install .`` plus megatron-core, nothing else): each family in a fresh
    process with transformers, PIL, PyAV, decord and tokenizers blocked. It checks that importing the task
    encoder imports no family module and loading a dataset imports only its own family module, that the
    batches (token fields and encoder inputs, audio features included) equal the full install's bit for
    bit, that every CP rank holds exactly its ``cp_token_indices`` of the full stream with the full
    encoder inputs, and that a loader with a worker process gives the same first batch.

This file is a script, not a test module (pytest collects ``test_*.py`` only); ``tests/test_profiles_split.py``
checks the same import discipline per family inside the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# What a trainer install lacks: the offline preparation stack (the ``prepare`` extra).
BLOCKED = ("transformers", "av", "decord", "tokenizers", "soundfile", "soxr")
# Present in a trainer install (megatron-energon needs pillow, torch jinja2); omnipack's loader never imports them.
NOT_FROM_OMNIPACK = ("PIL", "jinja2")
SEQ_LENGTH = 1024
MICRO_BATCH = 2
CP = 2


def prepare(out: Path) -> None:
    """One demo dataset per family (full install), and the digests of the batches it loads into."""
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import available_profiles, profile_class

    expected: dict[str, Any] = {}
    for name in available_profiles():
        cls = profile_class(name)
        root = out / f"{name}.src"
        tok = build_demo_tokenizer(root / "tokenizer", profile=name)
        manifest, media = build_demo_corpus(root / "corpus", num_samples=12, kinds=cls().kinds)
        run_prepare(
            PrepareConfig(
                manifest=[str(manifest)],
                media_root=str(media),
                tokenizer=str(tok),
                output=str(out / name),
                profile=name,
                seq_length=SEQ_LENGTH,
                cp=CP,
                shard_max_rows=3,
                mrope=cls.uses_mrope(),
                overwrite=True,
                progress=False,
            )
        )
        expected[name] = batch_digests(out / name)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


def _tensor_digest(h: Any, key: str, t: Any) -> None:
    import torch

    t = t.detach().cpu().contiguous()
    h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def digest(batch: Any) -> dict[str, str]:
    """sha256 of a batch's token fields and of its encoder inputs (each tensor's dtype, shape, bytes)."""
    import torch

    tokens, media = hashlib.sha256(), hashlib.sha256()
    for k, v in sorted(batch._token_fields().items()):
        if isinstance(v, torch.Tensor):
            _tensor_digest(tokens, k, v)
        else:
            tokens.update(f"{k}={v}|".encode())
    for k, v in sorted(batch.media_inputs().items()):
        _tensor_digest(media, k, v)
    return {
        "tokens": tokens.hexdigest(),
        "media": media.hexdigest(),
        "keys": ",".join(sorted(batch.media_inputs())),
    }


def _batches(path: Path, **encoder_options: Any) -> list[Any]:
    import omnipack

    loader = omnipack.get_val_loader(
        path, split_part="train", batch_size=MICRO_BATCH, num_workers=0, **encoder_options
    )
    return list(loader)


def batch_digests(path: Path) -> dict[str, list[dict[str, str]]]:
    """Digests of every batch at cp=1 and at each rank of cp=2 (in loader order)."""
    out = {"cp1": [digest(b) for b in _batches(path)]}
    for r in range(CP):
        out[f"cp{CP}_rank{r}"] = [digest(b) for b in _batches(path, cp=CP, cp_rank=r)]
    return out


def _importer() -> str:
    """Module name of the code running the current import statement (importlib's frames skipped)."""
    f = sys._getframe(2)
    while f is not None and (
        f.f_code.co_filename.startswith("<frozen") or f.f_globals.get("__name__") == __name__
    ):
        f = f.f_back
    return "" if f is None else str(f.f_globals.get("__name__", ""))


class _Blocker:
    """A meta path finder that refuses the prepare stack (as if it were not installed), and pillow to
    omnipack's own modules (Energon imports it; omnipack's trainer side must not need it)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        top = name.split(".")[0]
        if top in BLOCKED or (top in NOT_FROM_OMNIPACK and _importer().split(".")[0] == "omnipack"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: trainer-only check)", name=name)
        return None


def _family_modules(names: list[str]) -> set[str]:
    return {f"omnipack.profiles.{n}" for n in names}


def check_family(out: Path, name: str, families: list[str]) -> None:
    """One family in this process (the prepare stack blocked): import discipline, batches, CP slices."""
    sys.meta_path.insert(0, _Blocker())
    for m in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
        del sys.modules[m]
    import torch

    import omnipack.loader.task_encoder  # noqa: F401

    loaded = _family_modules(families) & set(sys.modules)
    assert not loaded, f"importing the task encoder imported family modules {sorted(loaded)}"
    path = out / name
    expected = json.loads((out / "expected.json").read_text())[name]
    full = _batches(path)
    others = _family_modules([f for f in families if f != name]) & set(sys.modules)
    assert f"omnipack.profiles.{name}" in sys.modules and not others, (
        f"loading {name} imported other families: {sorted(others)}"
    )
    assert [digest(b) for b in full] == expected["cp1"], (
        f"{name}: cp=1 batches differ from the full install's"
    )
    assert any(b.media_inputs() for b in full), f"{name}: no batch carried encoder inputs"
    for r in range(CP):
        local = _batches(path, cp=CP, cp_rank=r)
        assert [digest(b) for b in local] == expected[f"cp{CP}_rank{r}"], (
            f"{name}: cp={CP} rank {r} batches differ from the full install's"
        )
        assert len(local) == len(full)
        for a, b in zip(full, local, strict=True):
            idx = b.cp_token_indices
            assert idx is not None and b.tokens.shape[-1] * CP == a.tokens.shape[-1]
            for k in ("tokens", "labels", "loss_mask", "position_ids"):
                assert torch.equal(getattr(a, k)[..., idx], getattr(b, k)), f"{name}: rank {r} {k}"
            ta, tb = a.token_inputs or {}, b.token_inputs or {}  # per-token family inputs are CP-sliced
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k][..., idx], tb[k]) for k in ta), name
            if a.mrope_position_ids is not None:
                assert torch.equal(a.mrope_position_ids[..., idx], b.mrope_position_ids)
            assert torch.equal(a.cu_seqlens_q_padded, b.cu_seqlens_q_padded)
            ma, mb = a.media_inputs(), b.media_inputs()  # encoder inputs are not CP-split
            assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    import omnipack

    first = next(iter(omnipack.get_train_loader(path, batch_size=MICRO_BATCH, num_workers=1, cp=CP)))
    assert first.media_inputs() or first.tokens.numel(), "worker loader gave an empty batch"
    assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), "a blocked module got imported"
    kinds = sorted({m["kind"] for b in full for row in b.row_meta for m in row.get("media", [])})
    keys = sorted({k for b in full for k in b.media_inputs()})
    tok_keys = sorted({k for b in full for k in (b.token_inputs or {})})
    print(f"{name}: {len(full)} batches, media {kinds}, encoder inputs {keys}, token inputs {tok_keys}; cp=1 and cp={CP} match")


def check(out: Path) -> None:
    """Every family of ``OUT/expected.json``, each in a fresh process."""
    import omnipack
    from omnipack.profiles import available_profiles

    families = sorted(json.loads((out / "expected.json").read_text()))
    print(f"omnipack from {Path(omnipack.__file__).parent}")
    # Every family module this install has (gemma3, nemotron_omni, qwen2_5_vl, qwen3_omni, qwen3_vl) must
    # have been prepared: a family module that imports the prepare stack would fail here, not be skipped.
    missing = sorted(set(available_profiles()) - set(families))
    if missing:
        raise SystemExit(f"trainer-only check: no dataset prepared for families {missing}")
    failed = []
    for name in families:
        proc = subprocess.run(
            [sys.executable, __file__, "check-family", str(out), name, *families],
            capture_output=True,
            text=True,
        )
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            failed.append(name)
            sys.stderr.write(f"--- {name} failed ---\n{proc.stderr[-4000:]}\n")
    if failed:
        raise SystemExit(f"trainer-only check failed for {failed}")
    print(f"trainer-only check: {len(families)} families load with and without CP")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("step", choices=["prepare", "check", "check-family"])
    p.add_argument("out", type=Path)
    p.add_argument("family", nargs="?")
    p.add_argument("families", nargs="*")
    a = p.parse_args(argv)
    if a.step == "prepare":
        prepare(a.out)
    elif a.step == "check":
        check(a.out)
    else:
        check_family(a.out, a.family, [a.family, *a.families])


if __name__ == "__main__":
    main()
