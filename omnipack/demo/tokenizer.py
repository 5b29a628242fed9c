"""A tiny byte-level BPE tokenizer with every profile's special tokens and a ChatML chat template.

It stands in for a model's tokenizer directory in the demo and the tests (nothing is downloaded):
``AutoTokenizer.from_pretrained(dir)`` loads it exactly like a real checkpoint's tokenizer. Its ids are
stable: the vocabulary is trained with a fixed list of special tokens, and the tokens a profile added later
brings get new ids after it, so registering a family renumbers no id (the demo's bytes are pinned).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from ..profiles import PROFILES

BASE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The special tokens the BPE vocabulary is trained with, in order (they take its first ids, and the merges
# follow them): every profile's when the demo's bytes were pinned. Never reorder or remove one; tokens of
# profiles added since are appended after training (``build_demo_tokenizer``).
TRAINED_SPECIAL_TOKENS = [
    *BASE_SPECIAL_TOKENS,
    "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>",
    "<image>", "<video>", "<so_embedding>", "<img>", "</img>", "<so_start>", "<so_end>",
    "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>",
    "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>",
]  # fmt: skip


def special_tokens() -> list[str]:
    """The demo vocabulary's special tokens, in id order: ``TRAINED_SPECIAL_TOKENS``, then every registered
    profile's others (in registry order)."""
    toks = list(TRAINED_SPECIAL_TOKENS)
    for cls in PROFILES.values():
        toks += [t for t in cls().special_tokens() if t not in toks]
    return toks


TRAINING_TEXT = [
    "You are a helpful assistant.",
    "Describe the picture in detail. What colours do you see? Count the objects.",
    "The image shows a red square on a blue background, with a green circle in the corner.",
    "Listen to the audio clip and transcribe it. The speaker says hello and counts to ten.",
    "Watch the video. A ball moves from the left to the right over three seconds.",
    "user assistant system 0 1 2 3 4 5 6 7 8 9 seconds frame sampled at",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
]


def chat_template(profile: str = "qwen2_5_vl") -> str:
    """The demo template with media items rendered as ``profile``'s template blocks."""
    if PROFILES[profile].chat_template is not None:  # the family's own turns (it writes its own blocks)
        return PROFILES[profile].chat_template
    blocks = PROFILES[profile].template_blocks
    text = resources.files("omnipack.demo").joinpath("chat_template.jinja").read_text()
    for kind in ("image", "video", "audio"):
        text = text.replace(f"@{kind.upper()}_BLOCK@", "".join(blocks.get(kind, ())))
    return text


def build_demo_tokenizer(
    out_dir: str | Path,
    profile: str = "qwen2_5_vl",
    vocab_size: int = 600,
    training_text: Iterable[str] | None = None,
) -> Path:
    """Train and save the demo tokenizer (chat template for ``profile``) to ``out_dir``; ``training_text``
    replaces the built-in text (e.g. a corpus for a real-size vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TRAINED_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT * 20 if training_text is None else training_text, trainer=trainer)
    tok.add_special_tokens(special_tokens()[len(TRAINED_SPECIAL_TOKENS) :])  # new ids after the trained ones
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special_tokens()[len(BASE_SPECIAL_TOKENS) :],
    )
    fast.chat_template = chat_template(profile)
    fast.save_pretrained(out)
    return out
