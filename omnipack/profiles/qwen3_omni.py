"""Qwen3-Omni (thinker): Qwen-VL images and video at factor 32, Whisper-mel audio, audio-in-video.

Images use ``Qwen2VLImageProcessor`` and videos ``Qwen2VLVideoProcessor`` (2-D smart_resize, fps sampling)
with patch 16 / merge 2, as transformers maps ``qwen3_omni_moe``. Audio is 16 kHz mono; one clip alone
gives ``n // 160`` Whisper mel frames (``feature_size=128``, hop 160, ``padding=True``), and the audio
encoder turns ``L`` mel frames into 13 tokens per full 100-frame chunk plus three stride-2 halvings of
the rest. With ``use_audio_in_video`` the video's own audio track is interleaved into the video block by
comparing each video grid step's temporal position with the audio token index, as the HF processor does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..media.audio import audio_samples_at
from ..media.audio_storage import AUDIO_LOADING
from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .audio_features import (
    WHISPER_PAD,
    WhisperLogMel,
    check_whisper_clip,
    whisper_log_mel,
    whisper_padded_waves,
)
from .base import MediaPlan, MediaSpan, Segment
from .cost import TransformerShape, blocks_pairs, encoder_flops, tiled_sizes
from .model_inputs import (
    MediaInputOptions,
    Payload,
    audio_waveform,
    empty_batch_tensor,
    item_kind,
    payload_audio,
    payload_frames,
    wave_samples_key,
)
from .qwen_vl import HALF, VISION_BATCH_KEYS, QwenVLInputs, QwenVLProfile, VideoSettings, VisionSettings

AUDIO_RATE = 16000
HOP_LENGTH = 160
# WhisperFeatureExtractor reflect-pads by n_fft // 2 = 200 samples, which needs a longer input.
MIN_SAMPLES = 201
# Where the workers put the clips' stored samples when the consumer computes the log-mel (its own key, so
# ``input_features`` is never samples).
WAVES_KEY = wave_samples_key("input_features")


def mel_frames(num_samples: int) -> int:
    """Whisper mel frames of one clip run alone with ``padding=True`` (the last STFT frame is dropped)."""
    return num_samples // HOP_LENGTH


def audio_output_length(mel_len: int, n_window: int = 50) -> int:
    """Qwen3-Omni audio tokens for ``mel_len`` mel frames: 13 per full ``2*n_window`` chunk + the tail."""
    chunk = 2 * n_window
    rest = mel_len % chunk
    f = (rest - 1) // 2 + 1
    return ((f - 1) // 2 + 1 - 1) // 2 + 1 + (mel_len // chunk) * 13


def whisper_features(stored: np.ndarray) -> np.ndarray:
    """float32 [128, n // 160] log-mel of one stored clip alone: what ``WhisperFeatureExtractor(feature_size=
    128)`` gives with ``padding=True, truncation=False`` (valid frames), computed without transformers."""
    return whisper_log_mel(audio_waveform(stored), num_mels=128, sample_rate=AUDIO_RATE)


def interleave_runs(
    grid_t: int, tokens_per_step: int, num_audio: int, step_positions: float
) -> list[tuple[str, int]]:
    """Run-length order of video ("v") and audio ("a") tokens in an audio-in-video block.

    Video step ``t`` sits at temporal position ``t * step_positions`` (float64, as the processor computes
    it); audio token ``a`` at ``a``; a video token goes first when its position is ``<=`` the audio index.
    """
    runs: list[tuple[str, int]] = []
    a = 0
    audio_idx = np.arange(num_audio)
    for t in range(grid_t):
        vt = np.float64(t) * step_positions
        upto = int(np.searchsorted(audio_idx, vt, side="left"))  # audio indices strictly below vt
        if upto > a:
            runs.append(("a", upto - a))
            a = upto
        runs.append(("v", tokens_per_step))
    if a < num_audio:
        runs.append(("a", num_audio - a))
    merged: list[tuple[str, int]] = []
    for k, n in runs:
        if merged and merged[-1][0] == k:
            merged[-1] = (k, merged[-1][1] + n)
        else:
            merged.append((k, n))
    return merged


class Qwen3OmniInputs(QwenVLInputs):
    """Trainer half: Qwen-VL pixel patches and grids (``video_second_per_grid`` per video) and Whisper
    log-mel features of audio clips and of videos' own tracks (``input_features`` [N, 128, Lmax] with
    ``feature_attention_mask`` and ``audio_feature_lengths``), computed in torch (no transformers): in the
    worker, or where the batch is used from the shipped samples (``wave_features``, the loader's default)."""

    name = "qwen3_omni"
    # A video block with its own audio interleaves audio pads: both count as that block's features.
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<|image_pad|>",),
        "video": ("<|video_pad|>", "<|audio_pad|>"),
        "audio": ("<|audio_pad|>",),
    }
    second_per_grid_key = "video_second_per_grid"
    batch_keys = (
        *VISION_BATCH_KEYS,
        "video_second_per_grid",
        "input_features",
        "feature_attention_mask",
        "audio_feature_lengths",
        WAVES_KEY,  # the clips' stored samples instead of input_features (MediaInputOptions.waves)
    )

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.n_window = int(settings["n_window"])

    def audio_feature_count(self, wave: np.ndarray) -> int:
        mel = mel_frames(int(wave.shape[0]))
        return audio_output_length(mel, self.n_window) if mel > 0 else 0

    def feature_count(self, item: Any, payload: Payload) -> int:
        kind = item_kind(item)
        if kind == "audio":
            return self.audio_feature_count(payload_audio(payload))
        n = super().feature_count(item, payload)
        if kind == "video" and isinstance(payload, Mapping) and (wave := payload_audio(payload)) is not None:
            n += self.audio_feature_count(wave)  # audio-in-video: both kinds of placeholder in one block
        return n

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        kind = item_kind(item)
        out: dict[str, Any] = {}
        if kind in ("image", "video"):
            out.update(self.vision_inputs(kind, item, payload_frames(payload), options))
        wave = payload_audio(payload) if kind == "audio" or isinstance(payload, Mapping) else None
        if wave is not None and options.waves:
            check_whisper_clip(tuple(wave.shape))
            out[WAVES_KEY] = wave  # the stored samples (a view); the consumer runs WhisperLogMel
        elif wave is not None:
            out["input_features"] = whisper_features(wave)  # [128, L]; collate pads and masks
        if not out:
            return super().media_inputs(item, payload, options)
        return out

    def collate_media(self, per_item: list[dict[str, Any]], options: MediaInputOptions) -> dict[str, Any]:
        """Vision keys concatenated; mel features padded to the longest clip with a mask, as HF batches them.

        ``input_features`` [N, 128, Lmax], ``feature_attention_mask`` [N, Lmax] (int64, 1 = valid frame),
        ``audio_feature_lengths`` [N]: N audio clips (audio items and videos' own tracks) in placeholder order.
        Under ``options.waves`` ``input_features_waves`` (``wave_samples_key``) holds the clips' stored
        samples instead of ``input_features``, ``[N, nmax + 400]`` as ``whisper_padded_waves`` lays them out
        (int16 when every clip is stored so), straight in the batch's storage; ``WhisperLogMel``
        (``wave_features``) turns them into the features above.
        """
        import torch

        key = WAVES_KEY if options.waves else "input_features"
        feats = [d[key] for d in per_item if key in d]
        vision = [{k: v for k, v in d.items() if k != key} for d in per_item]
        out = super().collate_media(vision, options)
        if not feats:
            return out
        if options.waves:  # stored samples [n_i]: WhisperLogMel gives n_i // 160 frames where the batch is used
            lens = [mel_frames(int(w.shape[0])) for w in feats]
            dtype = np.int16 if all(w.dtype == np.int16 for w in feats) else np.float32
            longest = max(int(w.shape[0]) for w in feats) + 2 * WHISPER_PAD
            waves = empty_batch_tensor((len(feats), longest), dtype, options.allocate)
            whisper_padded_waves(feats, waves.numpy())
            out[WAVES_KEY] = waves
        else:
            lens = [f.shape[1] for f in feats]
            x = np.zeros((len(feats), feats[0].shape[0], max(lens)), dtype=np.float32)
            for i, f in enumerate(feats):
                x[i, :, : f.shape[1]] = f
            out["input_features"] = torch.from_numpy(x)
        out["feature_attention_mask"] = (torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]).long()
        out["audio_feature_lengths"] = torch.tensor(lens, dtype=torch.int64)
        return out

    def wave_features(self) -> dict[str, Any]:
        return {"input_features": WhisperLogMel("audio_feature_lengths", num_mels=128, sample_rate=AUDIO_RATE)}


class Qwen3OmniProfile(QwenVLProfile):
    """Qwen3-Omni thinker inputs.

    Options (besides the Qwen-VL ones): ``use_audio_in_video`` (interleave the video's own audio track;
    a video without one is rejected), ``position_id_per_seconds`` (temporal positions per second; the
    released thinker config and the processor use 13), ``n_window`` (audio chunk half-size, 50),
    ``position_fps`` (the ``fps`` the HF processor is told, from which ``video_second_per_grid =
    temporal_patch_size / fps``; the processor falls back to 1.0 when no fps is passed; None here means
    "the sampling fps", i.e. the caller passes its fps), ``max_audio_seconds`` (reject longer clips;
    None = no limit, Qwen3-Omni does not truncate).

    Positions are int32: fractional temporal positions are truncated as Megatron-Bridge's port does
    (HF keeps them as floats). ``mrope_rule`` / ``video_layout`` / ``tokens_per_second`` are refused:
    Qwen3-Omni always continues at ``max + 1`` and writes no per-frame timestamps. The video frame budget
    is the processor's own (``processor_video_defaults``), sampling is at 2 fps unless
    ``do_sample_frames=False`` (every frame, the video processor class's default).
    """

    name = "qwen3_omni"
    model_types = ("qwen3_omni_moe",)
    inputs_class = Qwen3OmniInputs
    default_image = VisionSettings(16, 2, 2, 3136, 12845056)
    # Qwen2VLVideoProcessor's class defaults (sampled at 2 fps, as qwen-vl-utils does) ...
    default_video = VideoSettings(2.0, 4, 768, 128 * 28 * 28, 28 * 28 * 768, False, 128000)
    # ... but Qwen3OmniMoeProcessor.videos_kwargs passes its own size on every call (factor-32 bounds).
    processor_video_defaults: ClassVar[dict[str, Any]] = {
        "min_pixels": 128 * 32 * 32,
        "max_pixels": 768 * 32 * 32,
    }
    video_sampler = "qwen2"
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
        "video": ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
        "audio": ("<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"),
    }
    audio_start: ClassVar[str] = "<|audio_start|>"
    audio_pad: ClassVar[str] = "<|audio_pad|>"
    audio_end: ClassVar[str] = "<|audio_end|>"
    # Assumed as Qwen3-VL's SigLIP-style encoder; pass the checkpoint's preprocessor_config to be sure.
    default_mean = HALF
    default_std = HALF

    def __init__(
        self,
        *,
        use_audio_in_video: bool = False,
        position_id_per_seconds: float = 13.0,
        n_window: int = 50,
        position_fps: float | None = None,
        max_audio_seconds: float | None = None,
        **vision_options: Any,
    ) -> None:
        # Image/video options are Qwen-VL's (min/max pixels, preprocessor configs, video_* sampling);
        # its mRoPE options do not apply: Qwen3-Omni always continues at max + 1, timed by position_id_per_seconds.
        unused = {"mrope_rule", "tokens_per_second", "video_layout"} & set(vision_options)
        if unused:
            raise TypeError(f"qwen3_omni does not take {sorted(unused)}")
        super().__init__(**vision_options)
        self.use_audio_in_video = use_audio_in_video
        self.position_id_per_seconds = float(position_id_per_seconds)
        self.n_window = n_window
        self.position_fps = position_fps
        self.max_audio_seconds = max_audio_seconds

    # ---- audio ----

    def audio_counts(self, num_samples_16k: int) -> tuple[int, int]:
        """(mel frames, tokens) of a 16 kHz clip; rejects clips too short for one token or too long."""
        if self.max_audio_seconds is not None and num_samples_16k > self.max_audio_seconds * AUDIO_RATE:
            raise MediaRejected(
                f"audio is {num_samples_16k / AUDIO_RATE:.1f} s, longer than max_audio_seconds={self.max_audio_seconds}"
            )
        if num_samples_16k < MIN_SAMPLES:
            raise MediaRejected(
                f"audio too short: {num_samples_16k} samples at 16 kHz (the mel front end needs {MIN_SAMPLES})"
            )
        mel = mel_frames(num_samples_16k)
        tokens = audio_output_length(mel, self.n_window) if mel > 0 else 0
        if tokens <= 0:
            raise MediaRejected(f"audio too short: {num_samples_16k} samples give {mel} mel frames")
        return mel, tokens

    def plan_audio(self, meta: MediaMeta) -> MediaPlan:
        n = audio_samples_at(meta, AUDIO_RATE)
        mel, tokens = self.audio_counts(n)
        return MediaPlan(
            kind="audio",
            num_tokens=tokens,
            sample_rate=AUDIO_RATE,
            num_audio_samples=n,
            audio_frames=mel,
            info={"mel_frames": mel},
        )

    # ---- video ----

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        plan = super().plan_video(meta)
        tps = self.image.temporal_patch_size
        fps = self.position_fps if self.position_fps is not None else (self.video.fps or 1.0)
        info = dict(plan.info, second_per_grid=tps / fps)
        if not self.use_audio_in_video:
            return MediaPlan(**{**plan.__dict__, "info": info})
        if not meta.has_audio or not meta.audio_num_samples:
            raise MediaRejected("use_audio_in_video requested but the video has no audio track")
        mel, a_tokens = self.audio_counts(meta.audio_num_samples)
        assert plan.grid_thw is not None
        t, gh, gw = plan.grid_thw
        per_step = gh * gw // self.image.merge_size**2
        info["interleave"] = interleave_runs(
            t, per_step, a_tokens, info["second_per_grid"] * self.position_id_per_seconds
        )
        info["mel_frames"] = mel
        info["video_tokens"] = plan.num_tokens
        return MediaPlan(
            **{
                **plan.__dict__,
                "num_tokens": plan.num_tokens + a_tokens,  # every placeholder of the block
                "audio_num_tokens": a_tokens,
                "sample_rate": AUDIO_RATE,
                "num_audio_samples": meta.audio_num_samples,
                "audio_frames": mel,
                "info": info,
            }
        )

    # ---- expansion ----

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind == "audio":
            return [
                Segment(token=self.audio_start),
                Segment(token=self.audio_pad, count=plan.num_tokens, placeholder=True),
                Segment(token=self.audio_end),
            ]
        if plan.kind == "video" and plan.audio_num_tokens:
            pads = {"v": self.video_pad, "a": self.audio_pad}
            return [
                Segment(token=self.vision_start),
                Segment(token=self.audio_start),
                *(Segment(token=pads[k], count=n, placeholder=True) for k, n in plan.info["interleave"]),
                Segment(token=self.audio_end),
                Segment(token=self.vision_end),
            ]
        return super().expand(plan)

    # ---- mRoPE ----

    def _vision_positions(self, plan: MediaPlan, start: int) -> np.ndarray:
        """float [3, t*h'*w'] positions of a vision grid starting at ``start`` (t fastest-outer, w inner)."""
        assert plan.grid_thw is not None
        t, gh, gw = plan.grid_thw
        m = self.image.merge_size
        if plan.kind == "image":
            tt = np.arange(t, dtype=np.float32) * np.float32(self.position_id_per_seconds)
        else:
            # float32 as the model: arange * second_per_grid (float32 tensor) * position_id_per_seconds
            tt = (np.arange(t, dtype=np.float32) * np.float32(plan.info["second_per_grid"])) * np.float32(
                self.position_id_per_seconds
            )
        tt = np.floor(tt)  # Bridge casts to long; positions are >= 0 so floor == truncation
        g = np.stack(np.meshgrid(tt, np.arange(gh // m), np.arange(gw // m), indexing="ij")).reshape(3, -1)
        return g + start

    def mrope_position_ids(self, input_ids: Any, spans: list[MediaSpan]) -> np.ndarray:
        """int32 [3, L]: HF ``get_rope_index`` layout: 1 or 2 start tokens, body, end tokens at ``max + 1``."""
        n = len(input_ids)
        out = np.empty((3, n), dtype=np.float64)
        cur, nxt = 0, 0
        for sp in sorted(spans, key=lambda s: s.start):
            plan = sp.plan
            k = sp.start - cur
            out[:, cur : sp.start] = np.arange(k) + nxt
            nxt += k
            i = sp.start
            interleaved = plan.kind == "video" and plan.audio_num_tokens > 0
            bos = 2 if interleaved else 1
            out[:, i : i + bos] = np.arange(bos) + nxt
            i += bos
            body_start = nxt + bos
            if plan.kind == "audio":
                body = np.arange(plan.num_tokens, dtype=np.float64) + body_start
                out[:, i : i + plan.num_tokens] = body
                i += plan.num_tokens
                last_max = body[-1]
            elif not interleaved:
                body = self._vision_positions(plan, body_start)
                out[:, i : i + body.shape[1]] = body
                i += body.shape[1]
                last_max = body.max()
            else:
                vid = self._vision_positions(plan, body_start)
                aud = np.arange(plan.audio_num_tokens, dtype=np.float64) + body_start
                vi = ai = 0
                for kind, cnt in plan.info["interleave"]:
                    if kind == "v":
                        chunk = vid[:, vi : vi + cnt]
                        vi += cnt
                    else:
                        chunk = np.broadcast_to(aud[ai : ai + cnt], (3, cnt))
                        ai += cnt
                    out[:, i : i + cnt] = chunk
                    i += cnt
                # HF continues from the last appended chunk: the trailing run, which is a whole remainder.
                last_max = chunk.max()
            eos = n_eos = bos
            out[:, i : i + n_eos] = np.arange(eos) + last_max + 1
            i += n_eos
            if i != sp.end:
                raise ValueError(
                    f"{plan.kind} block spans {sp.end - sp.start} tokens, layout gives {i - sp.start}"
                )
            nxt = int(last_max) + 1 + n_eos
            cur = sp.end
        out[:, cur:] = np.arange(n - cur) + nxt
        return out.astype(np.int32)

    def settings(self) -> dict[str, Any]:
        d = super().settings()
        d.pop("mrope_rule")
        d.pop("video_layout")
        d.pop("tokens_per_second")
        d.update(
            use_audio_in_video=self.use_audio_in_video,
            position_id_per_seconds=self.position_id_per_seconds,
            n_window=self.n_window,
            position_fps=self.position_fps,
            max_audio_seconds=self.max_audio_seconds,
            audio_rate=AUDIO_RATE,
            audio_loading=AUDIO_LOADING,
            mel="whisper feature_size=128 hop=160, one clip per call (n // 160 frames)",
            fractional_positions="truncate (Megatron-Bridge)",
        )
        return d

    # ---- training cost model (profiles.cost): new methods ----

    vision_mergers: ClassVar[int] = 4  # the final merger and 3 deepstack mergers
    audio_conv_channels: ClassVar[int] = 480  # the audio tower's downsample_hidden_size
    audio_mel_bins: ClassVar[int] = 128
    audio_window_infer: ClassVar[int] = 800  # n_window_infer: mel frames one attention window spans

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Qwen3-Omni-30B-A3B thinker: LM hidden 2048, 48 layers, 32/4 heads of 128, 8 of 128 experts of
        768 active (SwiGLU 6144); ViT 27 x 1152, 16 heads, GELU 4304; audio tower 32 x 1280, 20 heads,
        GELU 5120, attention in windows of ``audio_window_infer`` mel frames."""
        return {
            "lm": TransformerShape(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=8 * 768),
            "vision": TransformerShape(hidden=1152, layers=27, heads=16, ffn=4304, gated_ffn=False),
            "audio": TransformerShape(hidden=1280, layers=32, heads=20, ffn=5120, gated_ffn=False),
        }

    def audio_tower_flops(self, mel: int, tokens: int, shapes: dict[str, TransformerShape]) -> float:
        """Audio tower FLOPs: 3 stride-2 3x3 convs over the mel image, the transformer with attention
        inside windows of ``13 * audio_window_infer // (2 * n_window)`` tokens, the output projection."""
        audio, lm = shapes["audio"], shapes["lm"]
        c, bins = self.audio_conv_channels, self.audio_mel_bins
        conv = (
            2.0
            * 9
            * (c * (bins // 2) * mel / 2 + c * c * (bins // 4) * mel / 4 + c * c * (bins // 8) * mel / 8)
        )
        window = 13 * max(1, self.audio_window_infer // (2 * self.n_window))
        pairs = blocks_pairs(tiled_sizes(tokens, window))
        per_token = 2.0 * (
            c * (bins // 8) * audio.hidden + audio.hidden * audio.hidden + audio.hidden * lm.hidden
        )
        return conv + encoder_flops(audio, tokens, pairs) + tokens * per_token

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        if plan.kind == "audio":
            return self.audio_tower_flops(plan.audio_frames, plan.num_tokens, shapes)
        vision = super().media_cost(plan, shapes)
        if plan.kind == "video" and plan.audio_num_tokens:
            vision += self.audio_tower_flops(plan.audio_frames, plan.audio_num_tokens, shapes)
        return vision


PROFILE = Qwen3OmniProfile
