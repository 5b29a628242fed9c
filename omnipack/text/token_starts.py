"""Where each token starts in the text, from its ids alone, for byte-level BPE tokenizers.

A byte-level BPE token stands for a fixed run of the text's bytes (each character of a vocabulary entry is
one byte; an added token is its content), so once the normalizer leaves a text as it is, the tokens' byte
lengths add up to the text and their running sum gives every token's start. That lets the measure stage
call the tokenizer's batch encode without character offsets (``encode_batch_fast``, ~14% less tokenizer
time on one core) and still find each assistant turn's first token exactly.

Used only where it is provably the same as the tokenizer's own offsets: a BPE model under ByteLevel
pre-tokenization without a prefix space, an identity-or-Unicode-form normalizer, no post-processor that
trims offsets, no added token that strips whitespace; a start-up probe compares with the real offsets;
and each sample checks that its text is in the normalizer's form and that the byte lengths add up to it.
Everything else keeps the offsets path.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import numpy as np

# Normalizers that leave a text unchanged exactly when it is already in their Unicode form.
_UNICODE_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
# Pre-tokenizers that only split (never change the bytes), besides ByteLevel itself.
_SPLITTERS = {"Split", "Digits", "Punctuation"}
# Post-processors that leave offsets as the model made them (with add_special_tokens=False they add nothing).
_PLAIN_POST = {"TemplateProcessing"}

PROBE_TEXTS = (
    "plain ascii text, with  double spaces\tand\ttabs\n\nand newlines ",
    " leading space and trailing  ",
    "caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587\u5b57 \U0001f600\U0001f680 \u0928\u092e\u0938\u094d\u0924\u0947 \u00e9t\u00e9",
    "mixed\u200bzero width \u2028line sep \x07bell \ufeffbom 12345 3.14159 !!??..",
)


def _components(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A tokenizer.json component as a flat list (a Sequence unrolled)."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [c for sub in node.get(key, []) for c in _components(sub, key)]
    return [node]


class TokenByteStarts:
    """Byte lengths of every token id, and the checks that make them equal to the tokenizer's offsets."""

    def __init__(self, byte_lengths: np.ndarray, unicode_form: str | None) -> None:
        self.byte_lengths = byte_lengths
        self.unicode_form = unicode_form

    @classmethod
    def for_tokenizer(cls, backend: Any) -> TokenByteStarts | None:
        """The byte starts of ``backend`` (a ``tokenizers.Tokenizer``), or None where they may differ from
        its offsets."""
        if not hasattr(backend, "encode_batch_fast"):
            return None
        spec = json.loads(backend.to_str())
        if (spec.get("model") or {}).get("type") != "BPE":
            return None
        normalizers = _components(spec.get("normalizer"), "normalizers")
        if len(normalizers) > 1 or any(n.get("type") not in _UNICODE_FORMS for n in normalizers):
            return None
        pre = _components(spec.get("pre_tokenizer"), "pretokenizers")
        byte_level = [p for p in pre if p.get("type") == "ByteLevel"]
        if not byte_level or any(p.get("add_prefix_space") for p in byte_level):
            return None
        if any(p.get("type") not in _SPLITTERS | {"ByteLevel"} for p in pre):
            return None
        for post in _components(spec.get("post_processor"), "processors"):
            kind = post.get("type")
            if not (kind in _PLAIN_POST or (kind == "ByteLevel" and not post.get("trim_offsets", True))):
                return None
        added = backend.get_added_tokens_decoder()
        if any(t.lstrip or t.rstrip for t in added.values()):
            return None
        from tokenizers import pre_tokenizers

        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        size = max(backend.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        lengths = np.zeros(size, dtype=np.int64)
        for token, tid in backend.get_vocab(with_added_tokens=False).items():
            if tid not in added:
                if not alphabet.issuperset(token):
                    return None  # not a byte-level vocabulary entry
                lengths[tid] = len(token)
        for tid, token in added.items():
            lengths[tid] = len(token.content.encode("utf-8"))
        out = cls(lengths, normalizers[0]["type"] if normalizers else None)
        for text in PROBE_TEXTS:
            enc = backend.encode(text, add_special_tokens=False)
            starts = out.starts(np.asarray(enc.ids, dtype=np.int64), text)
            if starts is None:
                return None
            char_of_byte = np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text])
            if not np.array_equal(char_of_byte[starts], [a for a, _ in enc.offsets]):
                return None
        return out

    def starts(self, ids: np.ndarray, text: str) -> np.ndarray | None:
        """Each token's first byte in ``text`` encoded as UTF-8; None where that text is not what the model
        tokenized (the normalizer changes it) or the lengths do not add up to it (then use the offsets)."""
        if self.unicode_form is not None and not unicodedata.is_normalized(self.unicode_form, text):
            return None
        lengths = self.byte_lengths[ids]
        ends = np.cumsum(lengths)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if (ends[-1] if len(ends) else 0) != size:
            return None
        return ends - lengths

    @staticmethod
    def byte_index(text: str, char: int) -> int:
        """The UTF-8 byte position of character ``char`` of ``text``."""
        return char if text.isascii() else len(text[:char].encode("utf-8"))
