"""A tiny byte-level BPE tokenizer with Qwen-style special tokens and a ChatML chat template.

It stands in for a model's tokenizer directory in the demo and the tests (nothing is downloaded):
``AutoTokenizer.from_pretrained(dir)`` loads it exactly like a real checkpoint's tokenizer.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<img>",
    "</img>",
    "<image>",
    "<so_start>",
    "<so_end>",
    "<so_embedding>",
]

TRAINING_TEXT = [
    "You are a helpful assistant.",
    "Describe the picture in detail. What colours do you see? Count the objects.",
    "The image shows a red square on a blue background, with a green circle in the corner.",
    "Listen to the audio clip and transcribe it. The speaker says hello and counts to ten.",
    "Watch the video. A ball moves from the left to the right over three seconds.",
    "user assistant system 0 1 2 3 4 5 6 7 8 9 seconds frame sampled at",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
]


def chat_template() -> str:
    return resources.files("omnipack.demo").joinpath("chat_template.jinja").read_text()


def build_demo_tokenizer(out_dir: str | Path, vocab_size: int = 600) -> Path:
    """Train and save the demo tokenizer to ``out_dir``; returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = chat_template()
    fast.save_pretrained(out)
    return out
