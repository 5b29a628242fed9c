"""Chat encoding speed: ``ChatTokenizer.encode_many`` (render, tokenize, labels, media expansion) per family
on its demo tokenizer, over a small corpus of varied conversations (``tests/chat_cases.py``: multi-turn,
every media kind the family takes, some tool use), best of ``--repeats`` runs, one core, in CPU time
(``process_time``: steadier than wall time on a shared machine).

    PYTHONPATH=. python benchmarks/bench_chat.py --samples 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def bench_family(name: str, root: Path, samples: int, repeats: int) -> dict[str, float]:
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.profiles import get_profile
    from omnipack.text.chat import ChatTokenizer
    from tests.chat_cases import conversation

    profile = get_profile(name)
    chat = ChatTokenizer(build_demo_tokenizer(root / name, profile=name), profile)
    rng = random.Random(0)
    corpus = [conversation(profile, rng, tools=k % 4 == 0, words=40) for k in range(samples)]
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        t0 = time.process_time()
        out = chat.encode_many(corpus)
        best = min(best, time.process_time() - t0)
        tokens = sum(o.num_tokens for o in out if not isinstance(o, Exception))
    return {"seconds": best, "tokens": tokens, "samples_s": samples / best, "tokens_s": tokens / best}


def main() -> None:
    from omnipack.profiles import available_profiles

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in available_profiles():
            if name == "hf":  # processor-backed: needs a model folder
                continue
            results[name] = r = bench_family(name, Path(tmp), args.samples, args.repeats)
            print(f"{name:14s} {r['samples_s']:9.0f} samples/s {r['tokens_s']:11.0f} tokens/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
