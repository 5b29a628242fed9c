"""The family conformance kit's helpers (``tests/test_family_conformance.py`` runs them for every family).

A family registers its HF reference as ``REFERENCE = FamilyReference(...)`` in ``tests/references/<name>.py``;
the kit discovers families with ``omnipack.profiles.available_profiles()`` and their references by that
module name. A new family adds its module under ``omnipack/profiles``, its reference there and its own test
file; nothing in the kit names a family.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta, MediaPlan, ModelProfile
from omnipack.profiles.model_inputs import EncoderInputs, MediaInputOptions

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class KitMedia:
    """One media item of the kit's conversation: its file, what probing it gives and the profile's plan."""

    kind: str
    path: Path
    meta: MediaMeta
    plan: MediaPlan


def demo_tokenizer(out: Path, name: str) -> Path:
    """The demo tokenizer with family ``name``'s chat template and special tokens."""
    from omnipack.demo.tokenizer import build_demo_tokenizer

    return build_demo_tokenizer(out, profile=name)


@dataclass(frozen=True)
class FamilyReference:
    """What a family registers for the kit.

    ``hf_input_ids(tokenizer_dir, messages, media, profile)``: the token ids the family's HF processor gives
    for the conversation ``messages`` (its chat template rendered by the tokenizer, each media placeholder
    replaced by the processor's own ``replace_<kind>_token``, tokenized), ``media`` in conversation order.
    ``tokenizer(out, name)``: a tokenizer directory the processor and omnipack both use (default: the demo
    tokenizer). ``profile_options``: the profile's options for this comparison (where a default follows
    another consumer than the HF processor, e.g. Nemotron's Bridge audio rule).
    """

    hf_input_ids: Callable[[Path, list[dict], list[KitMedia], ModelProfile], list[int]]
    tokenizer: Callable[[Path, str], Path] = demo_tokenizer
    profile_options: dict[str, Any] = field(default_factory=dict)


def byte_level_bpe(special_tokens: list[str], extra_text: list[str] = ()) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` (600 tokens) trained on the demo text and ``extra_text``,
    with ``special_tokens`` first: the vocabulary a family's test model folder is built on."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from omnipack.demo.tokenizer import TRAINING_TEXT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT * 20 + list(extra_text), trainer=trainer)
    return tok


def reference(name: str) -> FamilyReference:
    """Family ``name``'s registered reference; a clear failure when it registered none."""
    try:
        module = importlib.import_module(f"tests.references.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"tests.references.{name}":
            raise
        raise AssertionError(
            f"family {name!r} registers no HF reference: add tests/references/{name}.py with "
            "REFERENCE = FamilyReference(...) (see tests/family_kit.py)"
        ) from None
    ref = getattr(module, "REFERENCE", None)
    assert isinstance(ref, FamilyReference), f"tests/references/{name}.py defines no REFERENCE FamilyReference"
    return ref


def write_media(root: Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    """One small real file per kind: a noise PNG (300x400), a 2 s mp4 (96x128 at 16 fps: 32 frames, the
    fewest a family samples, Gemma 4), a 1.5 s wav."""
    from PIL import Image

    from omnipack.demo.media import sine, write_audio, write_video

    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    if "image" in kinds:
        px = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
        Image.fromarray(px).save(root / "image.png")
        out["image"] = root / "image.png"
    if "video" in kinds:
        write_video(root / "video.mp4", n=32, fps=16, w=128, h=96)
        out["video"] = root / "video.mp4"
    if "audio" in kinds:
        write_audio(root / "audio.wav", sine(24000, 16000), 16000)
        out["audio"] = root / "audio.wav"
    return out


def kit_media(root: Path, profile: ModelProfile) -> list[KitMedia]:
    """One probed, planned item of every kind ``profile`` takes (image, video, audio order)."""
    from omnipack.media.probe import probe

    files = write_media(root, profile.kinds)
    items = []
    for kind in ("image", "video", "audio"):
        if kind in files:
            meta = probe(files[kind], kind)
            items.append(KitMedia(kind, files[kind], meta, profile.plan(meta)))
    return items


ANSWERS = ("It shows what was asked about.", "Two of them.")


def conversation(media: list[KitMedia]) -> list[dict]:
    """Two user turns (every media item in the first) and two assistant answers (``ANSWERS``)."""
    first: list[dict] = [{"type": m.kind, m.kind: str(m.path)} for m in media]
    first.append({"type": "text", "text": "Describe these."})
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": ANSWERS[0]},
        {"role": "user", "content": [{"type": "text", "text": "How many?"}]},
        {"role": "assistant", "content": ANSWERS[1]},
    ]


def supervised_runs(input_ids: np.ndarray, labels: np.ndarray) -> list[list[int]]:
    """The runs of supervised targets; ``labels[p]`` must be ``input_ids[p + 1]`` wherever it is set."""
    runs: list[list[int]] = []
    cur: list[int] = []
    for p in range(len(input_ids) - 1):
        if labels[p] != -100:
            assert labels[p] == input_ids[p + 1], f"label at {p} is not the next token"
            cur.append(int(labels[p]))
        elif cur:
            runs.append(cur)
            cur = []
    assert labels[-1] == -100, "the last position has no next token to supervise"
    return [*runs, cur] if cur else runs


def family_profile(name: str, ref: FamilyReference) -> ModelProfile:
    return get_profile(name, **ref.profile_options)


def planned_payloads(name: str) -> list[tuple[dict, object]]:
    """(item, payload) pairs of every kind the family takes, stored as its own plans say (sizes, frames,
    views, samples), with the plans' JSON as the items' recorded info."""
    rng = np.random.default_rng(3)
    planner = get_profile(name)
    metas = {
        "image": MediaMeta(kind="image", height=120, width=200),
        "video": MediaMeta(kind="video", height=64, width=64, num_frames=32, fps=16.0),
        "audio": MediaMeta(kind="audio", num_samples=23456, sample_rate=16000),
    }
    out: list[tuple[dict, object]] = []
    for kind in planner.kinds:
        plan = planner.plan(metas[kind])
        if kind == "audio":
            t = np.arange(plan.num_audio_samples) / 16000
            payload: object = (0.2 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)
        else:
            views = len(plan.frame_indices) if kind == "video" else max(1, len(plan.image_views or ()))
            payload = rng.integers(0, 256, (views, *plan.target_hw, 3), np.uint8)
            payload = payload[0] if kind == "image" and views == 1 else payload
        out.append(({"kind": kind, "info": plan.to_json()}, payload))
    return out


def encode_payloads(inputs: EncoderInputs, name: str) -> dict[str, np.ndarray]:
    """The family's encoder inputs of ``planned_payloads(name)`` (default options), and their feature counts
    under ``_counts``."""
    pairs = planned_payloads(name)
    plain = MediaInputOptions()
    per_item = [inputs.media_inputs(item, payload, plain) for item, payload in pairs]
    counts = [inputs.feature_count(item, payload) for item, payload in pairs]
    out = {k: np.asarray(v) for k, v in inputs.collate_media(per_item, plain).items()}
    out["_counts"] = np.asarray(counts)
    return out


# ---- the family pipeline tests' corpora, runs and loader (test_pipeline_*.py, test_profile_hf*.py)

MISSING = "bad-missing"  # the id of a corpus's one sample whose media file does not exist


def noise_images(media: Path, rng: np.random.Generator, images: list[tuple[str, int, int]]) -> list[str]:
    """Random-pixel images ``(file name, height, width)`` under ``media`` (the format from the name's
    suffix); their names."""
    from PIL import Image

    media.mkdir(parents=True, exist_ok=True)
    for name, h, w in images:
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(media / name)
    return [name for name, _, _ in images]


def chat_samples(
    prefix: str,
    n: int,
    kind: str,
    files: list[str],
    question: str,
    answer: str,
    *,
    follow_up: tuple[str, str] | None = None,
    answer_parts: bool = True,
    answer_repeats: int = 2,
) -> dict[str, list[dict]]:
    """``n`` conversations ``{prefix}-{i:03d}``: a user turn of ``i % 3`` items of ``kind`` (``files`` in
    turn from the i-th) and ``question.format(i)``, then ``answer`` repeated ``1 + i % answer_repeats``
    times (a text part, or plain content without ``answer_parts``); with ``follow_up`` (file, answer), every
    fourth conversation goes on with that file, "And?" and that answer."""
    samples: dict[str, list[dict]] = {}
    for i in range(n):
        user: list[dict] = [{"type": kind, kind: files[(i + j) % len(files)]} for j in range(i % 3)]
        user.append({"type": "text", "text": question.format(i)})
        said = answer * (1 + i % answer_repeats)
        msgs = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": said}] if answer_parts else said},
        ]
        if follow_up is not None and i % 4 == 3:
            turn = [{"type": kind, kind: follow_up[0]}, {"type": "text", "text": "And?"}]
            msgs += [
                {"role": "user", "content": turn},
                {"role": "assistant", "content": [{"type": "text", "text": follow_up[1]}]},
            ]
        samples[f"{prefix}-{i:03d}"] = msgs
    return samples


def write_manifest(root: Path, samples: dict[str, list[dict]], missing: str | None = None) -> Path:
    """``root/manifest.jsonl`` of ``samples``; with ``missing`` (a file name), one more sample ``MISSING``
    whose media is that file, absent (the run must reject it, naming why)."""
    lines = [{"id": k, "messages": v} for k, v in samples.items()]
    if missing is not None:
        kind = {".png": "image", ".wav": "audio", ".mp4": "video"}[Path(missing).suffix]
        lines.append(
            {
                "id": MISSING,
                "messages": [
                    {"role": "user", "content": [{"type": kind, kind: missing}]},
                    {"role": "assistant", "content": "ok"},
                ],
            }
        )
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def prepare_args(manifest: Path, media: Path, out: Path, *options: str) -> list[str]:
    """``omnipack prepare``'s arguments for a test corpus into ``out``, without progress bars."""
    where = ["--manifest", str(manifest), "--media-root", str(media), "-o", str(out)]
    return ["prepare", *where, "--no-progress", *options]


def prepare(manifest: Path, media: Path, out: Path, *options: str) -> Path:
    """A test corpus prepared into ``out`` by the CLI (one worker: in this process); asserts it succeeded."""
    from omnipack.cli import main

    assert main(prepare_args(manifest, media, out, "--workers", "1", *options)) == 0
    return out


def prepare_family_corpus(
    root: Path, model_dir: Path, corpus: Callable[[Path], tuple[Path, Path, dict]], name: str, *options: str
) -> tuple[Path, Path, dict[str, list[dict]], Path]:
    """(model_dir, media, samples, dataset): ``corpus(root / "src")`` (manifest, media, samples; one sample
    of them ``MISSING``) prepared by family ``name`` with the tokenizer in ``model_dir``, two rows a shard."""
    manifest, media, samples = corpus(root / "src")
    out = prepare(
        manifest, media, root / "ds", "--tokenizer", str(model_dir), "--profile", name,
        "--shard-max-rows", "2", "--max-reject-fraction", "0.1", *options,  # one broken sample in a dozen
    )  # fmt: skip
    return model_dir, media, samples, out


def run_meta(out: Path) -> dict[str, Any]:
    """The dataset's ``omnipack.json``."""
    return json.loads((out / ".nv-meta" / "omnipack.json").read_text())


def assert_packed_but_the_missing(out: Path, samples: dict[str, list[dict]], reason: str) -> dict[str, Any]:
    """Every sample packed but ``MISSING``, rejected with ``reason`` in its reason; returns omnipack.json."""
    meta = run_meta(out)
    assert meta["counts"]["packed"] == len(samples)
    rejects = [json.loads(line) for line in (out / meta["rejects_file"]).read_text().splitlines()]
    assert [r["sample_id"] for r in rejects] == [MISSING] and reason in rejects[0]["reason"], rejects
    return meta


def val_batches(
    out: Path, task_encoder: Any = None, *, batch_size: int = 1, workers: int = 0
) -> Iterator[Any]:
    """The dataset's micro-batches in Energon's validation order (``task_encoder``: default, the one
    ``OmnipackTaskEncoder.from_dataset`` configures)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    ds = get_val_dataset(
        str(out),
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=batch_size,
        task_encoder=OmnipackTaskEncoder.from_dataset(out) if task_encoder is None else task_encoder,
    )
    return iter(get_loader(ds))


def sample_spans(batch: Any) -> list[tuple[str, int, int]]:
    """(sample id, start, tokens) of each sample of the batch's first row, in the stream."""
    cu, cup = batch.cu_seqlens_q, batch.cu_seqlens_q_padded
    return [(sid, int(cup[k]), int(cu[k + 1] - cu[k])) for k, sid in enumerate(batch.sample_ids[0])]


def packed_row_logits(model: Any, batch: Any) -> Any:
    """A model's logits on a micro-batch of one packed row: positions reset per sample, a block-diagonal
    causal mask from the padded boundaries, the batch's encoder inputs under the model's keys."""
    import torch

    from omnipack.loader.masks import packed_layer_masks

    d = batch.as_dict()
    tokens = d["tokens"]
    types = torch.zeros_like(tokens)
    mask = packed_layer_masks(d["cu_seqlens_q_padded"], types, tokens.shape[1], dtype=torch.float32)
    inputs = {"input_ids": tokens, "position_ids": d["position_ids"], **batch.media_inputs()}
    return model(**inputs, attention_mask=mask["full_attention"]).logits[0]


def assert_each_samples_own_logits(
    model: Any, out: Path, inputs_alone: Callable[[str], Mapping[str, Any]], rel: float = 0.0, atol: float = 1e-5
) -> int:
    """Each of the dataset's loader rows (``packed_row_logits``) gives, on every sample's tokens, the logits
    of ``model`` on that sample alone (``inputs_alone(sample id)``: the processor's outputs for it, arrays
    or tensors; its attention mask dropped), within ``atol`` plus ``rel`` of their largest: float noise
    only, far below what attention across samples or misplaced media gives. Returns how many samples after
    the first of their row hold media (a packed row's hard case, for the caller to require)."""
    import torch

    checked = 0
    with torch.no_grad():
        for b in val_batches(out):
            packed = packed_row_logits(model, b)
            for k, (sid, a, n) in enumerate(sample_spans(b)):
                alone = {key: torch.as_tensor(v) for key, v in inputs_alone(sid).items() if key != "attention_mask"}
                want = model(**alone).logits[0]
                assert n == want.shape[0], sid
                err, top = float((packed[a : a + n] - want).abs().max()), float(want.abs().max())
                assert err <= rel * top + atol, (sid, err, top)
                checked += k > 0 and len(alone) > 1  # more than input_ids: the sample's media
    return checked


def encoder_inputs_by_batch(batches: Iterator[Any]) -> dict[str, np.ndarray]:
    """Every micro-batch's encoder inputs, keyed ``"{batch}/{key}"``."""
    return {f"{i}/{k}": v.numpy() for i, b in enumerate(batches) for k, v in (b.encoder_inputs or {}).items()}


def trainer_only_encoder_inputs(
    out: Path, scratch: Path, unimported: tuple[str, ...], check: str = ""
) -> dict[str, np.ndarray]:
    """``encoder_inputs_by_batch`` of the dataset's micro-batches of two rows, loaded by a process where the
    prepare stack cannot be imported (``tests/test_profiles_split.BLOCKER``); there, none of the top-level
    modules ``unimported`` was imported, and ``check`` (more code) passes."""
    import subprocess
    import sys
    import textwrap

    from tests.test_profiles_split import BLOCKER  # a test module that imports this one: imported here

    code = BLOCKER + textwrap.dedent(
        f"""
        import numpy as np
        from tests.family_kit import encoder_inputs_by_batch, val_batches
        got = encoder_inputs_by_batch(val_batches({str(out)!r}, batch_size=2))
        np.savez({str(scratch / "got.npz")!r}, **got)
        bad = [m for m in sys.modules if m.split(".")[0] in {unimported!r}]
        assert not bad, bad
        """
    ) + textwrap.dedent(check) + "\nprint('ok')\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
    return dict(np.load(scratch / "got.npz"))
