"""``aiayn generate``: continue a prompt with a decoder-only checkpoint, streaming the text as it comes."""

from __future__ import annotations

import argparse
import sys

import torch

from aiayn.cli.args import finite_float
from aiayn.cli.inference import add_checkpoint_arguments, check_at_least, check_compile, check_range, load_model_for
from aiayn.decoding.static import StaticCausalLMDecoder
from aiayn.decoding.streaming import stream_text
from aiayn.decoding.text import generation_config, prompt_ids
from aiayn.models.decoder_only import DecoderOnly

HELP = "continue a prompt with a decoder-only checkpoint (sampling or greedy), streaming to the terminal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser, compile=True)
    parser.add_argument("--prompt", required=True, help="text to continue (empty: start from BOS)")
    parser.add_argument("--max-new-tokens", type=int, required=True, help="tokens to generate at most")
    parser.add_argument("--min-new-tokens", type=int, default=0, help="tokens before EOS is allowed (default: 0)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely token instead of sampling")
    parser.add_argument("--temperature", type=finite_float, default=1.0, help="sampling temperature, > 0 (default: 1.0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=finite_float, default=None, help="sample from the smallest set with probability >= p (nucleus)")
    parser.add_argument("--repetition-penalty", type=finite_float, default=1.0, help="> 1 discourages repeated tokens (default: 1.0)")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0, help="never repeat an n-gram of this size (default: 0 = off)")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop once this text is generated (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default: 0)")


def run(args: argparse.Namespace) -> int:
    check_at_least("generate", args, "max_new_tokens", 1)
    for name in ("min_new_tokens", "no_repeat_ngram_size"):
        check_at_least("generate", args, name, 0)
    if args.min_new_tokens > args.max_new_tokens:
        raise SystemExit(f"aiayn generate: --min-new-tokens must be <= --max-new-tokens={args.max_new_tokens}, got {args.min_new_tokens}")
    check_range("generate", args, "temperature", 0.0, float("inf"), "> 0 (use --greedy for temperature 0)")
    check_at_least("generate", args, "top_k", 1)
    check_range("generate", args, "top_p", 0.0, 1.0, "in (0, 1]")
    check_range("generate", args, "repetition_penalty", 0.0, float("inf"), "> 0 (1 = off)")
    if any(not stop for stop in args.stop):
        raise SystemExit("aiayn generate: --stop must not be empty, got ''")
    if args.compile:
        check_compile("generate")
    loaded, tokenizer, _ = load_model_for("generate", args, DecoderOnly, "a decoder-only model (for translation use aiayn translate)")
    config = generation_config(  # EOS and pad: the tokenizer's own (GPT-2: <|endoftext|>)
        tokenizer, max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens, greedy=args.greedy,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size, stop_strings=tuple(args.stop),
    )
    try:
        ids = torch.tensor([prompt_ids(tokenizer, args.prompt)], device=args.device)
    except ValueError as e:
        raise SystemExit(f"aiayn generate: --prompt {args.prompt!r}: {e}") from None
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    decoder = StaticCausalLMDecoder(loaded.model, compile=args.compile)  # type: ignore[arg-type]
    if args.compile:  # the second token waits for the compiler: say so, or it looks like a hang
        print("aiayn generate: --compile: compiling the one-token step after the prompt (up to a minute or two for "
              "a GPT-2-sized model; torch caches it for later runs of the same shapes)", file=sys.stderr, flush=True)
    pieces = stream_text(decoder, ids, None, config, detokenize=tokenizer.decode, generator=generator)
    try:
        first = next(pieces, "")  # the prefill: a bad length fails here, before anything is printed
    except ValueError as e:
        raise SystemExit(f"aiayn generate: {e}") from None
    sys.stdout.write(args.prompt + first)
    sys.stdout.flush()
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
