"""Write a text for training a model that copies what it read: the first 90% of a text file cut into chunks of
whole lines (30-60 characters), each written 2 to 8 times in a row (the count drawn at random, so that a model
cannot know when a copy ends). A small model trained on it continues a repeated prompt by copying it, which is
what prompt-lookup speculative decoding needs to pay (``benchmarks/speculative.py``; docs/benchmarks.md); the last
10% of the file stays unseen, for prompts.

    python benchmarks/copy_text.py ../shared/data/tinyshakespeare/input.txt /tmp/copy.txt
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

TRAIN_SHARE = 0.9
CHUNK_CHARS = (30, 60)
REPEATS = (2, 8)


def copy_text(text: str, seed: int = 0) -> str:
    """The first :data:`TRAIN_SHARE` of ``text`` as chunks of whole lines, each repeated a random 2-8 times."""
    rng = random.Random(seed)
    shortest, longest = CHUNK_CHARS
    out, chunk = [], ""
    for line in text[: int(len(text) * TRAIN_SHARE)].splitlines(keepends=True):
        chunk += line
        if len(chunk) >= shortest:
            if len(chunk) <= longest:
                out.append(chunk * rng.randint(*REPEATS))
            chunk = ""
    return "".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a UTF-8 text file")
    parser.add_argument("output", type=Path, help="where the repeated chunks are written")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    text = copy_text(args.source.read_text(encoding="utf-8"), args.seed)
    if not text:
        parser.error(f"source: {args.source} has no run of whole lines of {CHUNK_CHARS[0]}-{CHUNK_CHARS[1]} characters to repeat")
    args.output.write_text(text, encoding="utf-8")
    print(f"{len(text):,} characters written to {args.output}")


if __name__ == "__main__":
    main()
