"""The trainer-only install loads every model family, with and without context parallelism.

Two steps, run by ``.ci/run`` in two virtual environments:

``python tests/trainer_only_check.py prepare OUT``
    In the full install (``.[test]``): one small demo dataset per family in ``OUT/<family>`` (images,
    video and audio where the family takes them), and ``OUT/expected.json``: a digest of every batch the
    loader gives for it at cp=1 and at each rank of cp=2.

``python tests/trainer_only_check.py check OUT``
    In a trainer install (``pip install .`` plus megatron-core, nothing else): each family in a process of
    its own (forked, see below) with transformers, PIL, PyAV, decord and tokenizers blocked. It checks that
    importing the task encoder imports no family module and loading a dataset imports only its own family
    module, that the batches (token fields and encoder inputs, audio features included) equal the full
    install's bit for bit, that every CP rank holds exactly its ``cp_token_indices`` of the full stream
    with the full encoder inputs, and that a loader with a worker process gives the same first batch.

Then one family is loaded from an S3 bucket (moto's server on 127.0.0.1, run by the full install's Python,
``--moto-python``, so that nothing of moto's, boto3 included, is in the trainer venv) through every documented
loader entry point, by ``s3://`` and by ``msc://`` URL (``check_remote``): the trainer install reads S3 with
the ``s3`` extra alone.

Each family's check runs in a child forked from a process that blocked the prepare stack and imported what
every check imports before it loads a dataset (torch and the task encoder, no family module): what a fresh
process would have at that point, without importing torch once per family (``forked_check``).
``serve-checks`` keeps such a process for the test suite's per-family checks (the ``trainer_checks``
fixture of ``tests/test_family_conformance.py``).

This file is a script, not a test module (pytest collects ``test_*.py`` only); ``tests/test_profiles_split.py``
checks the same import discipline per family inside the test suite.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

# What a trainer install lacks: the offline preparation stack (the ``prepare`` extra).
BLOCKED = ("transformers", "av", "decord", "tokenizers", "soundfile", "soxr")
# Present in a trainer install (megatron-energon needs pillow, torch jinja2); omnipack's loader never imports them.
NOT_FROM_OMNIPACK = ("PIL", "jinja2")
SEQ_LENGTH = 1024
MICRO_BATCH = 2
CP = 2
BUCKET = "trainer-check"
# The family loaded from S3: images, video and audio.
REMOTE_FAMILY = "qwen3_omni"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def prepare(out: Path) -> None:
    """One demo dataset per family (full install), and the digests of the batches it loads into."""
    from omnipack.profiles import available_profiles

    expected = {name: prepare_family(out, name) for name in available_profiles()}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


# Clips of at least 32 frames, the most any family's processor requires (Gemma 4 samples 32 and refuses fewer).
KIT_CLIPS = ((36, 12, 96, 64), (33, 11, 64, 64), (40, 8, 80, 48), (32, 16, 128, 96))


def _seq_length(planner: Any, media: Path) -> int:
    """SEQ_LENGTH, or the power of two that holds two of the corpus's largest media items (a family whose
    videos are many tokens, e.g. Gemma 4's 32 sampled frames, still packs every sample)."""
    from omnipack.media.probe import probe

    largest = 0
    for path in sorted(media.iterdir()):
        kind = {".mp4": "video", ".wav": "audio", ".flac": "audio"}.get(path.suffix)
        if kind in planner.kinds:
            largest = max(largest, planner.plan(probe(path, kind)).num_tokens)
    need = 2 * largest + 512
    return max(SEQ_LENGTH, 1 << (need - 1).bit_length())


def prepare_family(out: Path, name: str) -> dict[str, Any]:
    """Family ``name``'s demo dataset in ``OUT/<name>`` (images, video and audio where it takes them);
    returns the digests of the batches it loads into (``batch_digests``)."""
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import profile_class

    cls = profile_class(name)
    root = out / f"{name}.src"
    model = None
    if cls.processor_backed:  # the model's own processor: a tiny Idefics3 folder (its tiles' tensors stored)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.test_profile_hf import build_idefics3_model_dir

        tok = model = build_idefics3_model_dir(root / "model")
        kinds: tuple[str, ...] = ("image",)
    else:
        tok = build_demo_tokenizer(root / "tokenizer", profile=name)
        kinds = cls().kinds
    manifest, media = build_demo_corpus(root / "corpus", num_samples=12, kinds=kinds, clips=KIT_CLIPS)
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            model=None if model is None else str(model),
            output=str(out / name),
            profile=name,
            seq_length=_seq_length(cls(), media),
            cp=CP,
            shard_max_rows=3,
            mrope=cls.uses_mrope(),
            overwrite=True,
            progress=False,
        )
    )
    return batch_digests(out / name)


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


def trainer_stack() -> None:
    """This process as a trainer install's: the prepare stack blocked (and dropped where imported), then what
    every family's check imports before it loads a dataset (torch, the task encoder; no family module)."""
    if not any(isinstance(f, _Blocker) for f in sys.meta_path):
        sys.meta_path.insert(0, _Blocker())
    for m in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
        del sys.modules[m]
    import torch  # noqa: F401

    import omnipack.loader.task_encoder  # noqa: F401


def forked_check(out: Path, name: str, families: list[str], output: tuple[str, str] | None = None) -> int:
    """``check_family`` in a child forked from this process (``trainer_stack`` done), its stdout and stderr
    to the files ``output`` if given: the child's exit code. The child starts with the modules a fresh
    process has once ``trainer_stack`` ran, so its import checks hold as they would there."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    code = 1
    try:  # the child never returns: whatever happens, it ends at os._exit (it must not serve as a parent)
        try:
            for fd, path in zip((1, 2), output or (), strict=False):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(target, fd)
                os.close(target)
            check_family(out, name, families)
            code = 0
        except BaseException:
            traceback.print_exc()
        _end_worker_loaders()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _end_worker_loaders() -> None:
    """End the worker processes of the worker loaders this process started (before ``os._exit``, which runs
    no finalizer). Energon's loader holds its epoch generator, whose frame holds the loader: a cycle that
    only the garbage collector frees. There, the queues' weakref finalizers run first and queue their feeder
    threads' stop, so the worker's end signal that torch's shutdown (the iterator's ``__del__``, after them)
    puts behind it is never sent: torch waits 5 s, then terminates the worker. Shut each down first instead.
    A failure here is printed; it does not change the check's exit code."""
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    try:
        children = multiprocessing.active_children()  # not a forked parent's workers: only it can end them
        # type(), not isinstance: an object's __class__ may warn (torch.distributed's deprecated reduce_op)
        for loader_iter in [o for o in gc.get_objects() if issubclass(type(o), _MultiProcessingDataLoaderIter)]:
            if any(worker in children for worker in loader_iter._workers):
                loader_iter._shutdown_workers()
    except Exception:
        traceback.print_exc()


def serve_checks() -> None:
    """``serve-checks``: ``trainer_stack``, then one request a line on stdin (a JSON list: out, family,
    families, stdout file, stderr file), each answered with a line on stdout: ``forked_check``'s exit code."""
    trainer_stack()
    print("ready", flush=True)
    for line in sys.stdin:
        out, name, families, stdout, stderr = json.loads(line)
        print(forked_check(Path(out), name, families, (stdout, stderr)), flush=True)


def check_family(out: Path, name: str, families: list[str]) -> None:
    """One family in this process (the prepare stack blocked): import discipline, batches, CP slices."""
    trainer_stack()
    import torch

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


def _digests(loader: Any, n: int | None = None) -> list[dict[str, str]]:
    out = []
    for b in loader:
        out.append(digest(b))
        if n is not None and len(out) == n:
            break
    return out


def upload(local: Path, url: str) -> None:
    """Every file of the folder ``local`` (``.nv-meta`` included) to ``url`` (``msc://``), through Energon's
    storage client."""
    from megatron.energon.epathlib import EPath

    root = EPath(url)
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        (root / f.relative_to(local).as_posix()).write_bytes(f.read_bytes())


def check_remote(local: Path, url_root: str) -> list[str]:
    """The dataset ``local`` uploaded to ``URL_ROOT/<its name>`` (an ``s3://bucket/prefix``), with a metadataset
    ``URL_ROOT/blend.yaml`` blending it, loaded through every documented loader entry point by ``s3://`` and by
    ``msc://`` URL: the batches equal those of the local folder (and of the same YAML beside it). Returns one
    line per entry point checked."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from megatron.energon.epathlib import EPath

    import omnipack
    from omnipack.loader.blend import task_encoder_for
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    url_root = url_root.rstrip("/")
    bucket, _, prefix = url_root.removeprefix("s3://").partition("/")
    msc_root = f"msc://_s3-{bucket}/{prefix}".rstrip("/")
    upload(local, f"{msc_root}/{local.name}")
    blend = (
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{path: {local.name}, weight: 2}}\n      - {{path: ./{local.name}, weight: 1}}\n"
    )
    (local.parent / "blend.yaml").write_text(blend)
    EPath(f"{msc_root}/blend.yaml").write_text(blend)

    def val(path: Any, **kw: Any) -> list[dict[str, str]]:
        loader = omnipack.get_val_loader(path, split_part="train", batch_size=MICRO_BATCH, num_workers=0, **kw)
        return _digests(loader)

    def train(path: Any) -> list[dict[str, str]]:
        loader = omnipack.get_train_loader(path, batch_size=MICRO_BATCH, num_workers=0, cp=CP, cp_rank=1)
        return _digests(loader, 4)

    expected_val, expected_train = val(local), train(local)
    expected_blend_val = val(local.parent / "blend.yaml", cp=CP)
    expected_blend_train = train(local.parent / "blend.yaml")
    assert expected_val and expected_blend_val
    lines = []
    for root in (url_root, msc_root):
        ds, yaml_url = f"{root}/{local.name}", f"{root}/blend.yaml"
        assert val(ds) == expected_val, f"get_val_loader({ds!r}) differs from the local dataset's batches"
        assert train(ds) == expected_train, f"get_train_loader({ds!r}) differs from the local dataset's"
        assert val(yaml_url, cp=CP) == expected_blend_val, f"get_val_loader({yaml_url!r}) differs"
        assert train(yaml_url) == expected_blend_train, f"get_train_loader({yaml_url!r}) differs"
        te = OmnipackTaskEncoder.from_dataset(ds)
        wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
        stock = get_val_dataset(  # Energon itself opens msc:// URLs only
            f"{msc_root}/{local.name}",
            split_part="train",
            worker_config=wc,
            batch_size=MICRO_BATCH,
            task_encoder=te,
        )
        assert _digests(get_loader(stock)) == expected_val, f"OmnipackTaskEncoder.from_dataset({ds!r}) differs"
        local_align = task_encoder_for(local.parent / "blend.yaml", cp=CP).align
        assert task_encoder_for(yaml_url, cp=CP).align == local_align
        lines.append(
            f"{root}: get_train_loader, get_val_loader, OmnipackTaskEncoder.from_dataset + get_val_dataset, "
            f"task_encoder_for and a blend.yaml give the local batches ({len(expected_val)} val batches)"
        )
    return lines


def serve_s3() -> None:
    """moto's S3 server on 127.0.0.1 with the check's bucket (run by the full install's Python): prints its URL,
    serves until its standard input closes."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, **_boto_credentials()).create_bucket(Bucket=BUCKET)
    print(url, flush=True)
    sys.stdin.read()
    server.stop()


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


def check_family_remote(out: Path, name: str, families: list[str]) -> None:
    """One family loaded from S3 in this process (the prepare stack blocked), through every entry point."""
    trainer_stack()
    for line in check_remote(out / name, f"s3://{BUCKET}/datasets"):
        print(f"{name} from S3: {line}")
    assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), "a blocked module got imported"
    others = _family_modules([f for f in families if f != name]) & set(sys.modules)
    assert not others, f"loading {name} imported other families: {sorted(others)}"


def check_s3(out: Path, families: list[str], moto_python: str) -> None:
    """``check_family_remote`` for ``REMOTE_FAMILY`` against a moto server run by ``moto_python``."""
    name = REMOTE_FAMILY if REMOTE_FAMILY in families else families[0]
    server = subprocess.Popen(
        [moto_python, __file__, "serve-s3", str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        url = server.stdout.readline().strip()
        if not url.startswith("http://"):
            raise SystemExit(f"trainer-only check: the S3 server did not start ({moto_python})")
        env = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL": url}
        proc = subprocess.run(
            [sys.executable, __file__, "check-remote", str(out), name, *families],
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    sys.stdout.write(proc.stdout)
    if proc.returncode:
        sys.stderr.write(f"--- {name} from S3 failed ---\n{proc.stderr[-4000:]}\n")
        raise SystemExit(f"trainer-only check: {name} does not load from S3")


def check(out: Path, moto_python: str | None = None) -> None:
    """Every family of ``OUT/expected.json``, each in a child forked from this process (``forked_check``);
    then one from S3 (``check_s3``) when ``moto_python`` is given."""
    trainer_stack()  # first: what is imported before the blocker would escape it in the forked checks
    import omnipack

    families = sorted(json.loads((out / "expected.json").read_text()))
    print(f"omnipack from {Path(omnipack.__file__).parent}")
    failed = []
    for name in families:  # each check's output as it comes
        code = forked_check(out, name, families)
        if code:
            failed.append(name)
            print(f"--- {name} failed: exit code {code} (a traceback above, unless a signal ended it) ---",
                  file=sys.stderr)  # fmt: skip
    # Every family module this install has must have been prepared: a family module that imports the
    # prepare stack would fail here, not be skipped. (After the checks: listing the families imports them.)
    from omnipack.profiles import available_profiles

    missing = sorted(set(available_profiles()) - set(families))
    problems = [f"failed for {failed}"] if failed else []
    if missing:
        problems.append(f"no dataset prepared for families {missing}")
    if problems:
        raise SystemExit(f"trainer-only check: {'; '.join(problems)}")
    print(f"trainer-only check: {len(families)} families load with and without CP")
    if moto_python:
        check_s3(out, families, moto_python)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    steps = ["prepare", "check", "check-family", "check-remote", "serve-s3", "serve-checks"]
    p.add_argument("step", choices=steps)
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("family", nargs="?")
    p.add_argument("families", nargs="*")
    p.add_argument(
        "--moto-python", help="check: a Python with moto[server] (the full install) to serve S3 for the S3 check"
    )
    a = p.parse_args(argv)
    if a.out is None and a.step != "serve-checks":
        p.error(f"{a.step} needs OUT")
    if a.step == "prepare":
        prepare(a.out)
    elif a.step == "check":
        check(a.out, a.moto_python)
    elif a.step == "serve-s3":
        serve_s3()
    elif a.step == "serve-checks":
        serve_checks()
    elif a.step == "check-remote":
        check_family_remote(a.out, a.family, [a.family, *a.families])
    else:
        check_family(a.out, a.family, [a.family, *a.families])


if __name__ == "__main__":
    main()
