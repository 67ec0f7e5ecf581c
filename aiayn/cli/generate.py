"""``aiayn generate``: continue a prompt with a decoder-only checkpoint, streaming the text as it comes."""

from __future__ import annotations

import argparse
import sys

import torch

from aiayn.cli.args import finite_float
from aiayn.cli.inference import add_checkpoint_arguments, add_kv_cache_argument, check_compile, load_model_for
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.sampling import GenerationConfig
from aiayn.decoding.speculative import DEFAULT_DRAFT_TOKENS, DEFAULT_NGRAM, SPECULATIVE_MODES, SpeculativeDecoder
from aiayn.decoding.streaming import stream_text
from aiayn.decoding.text import generation_config, prompt_ids
from aiayn.inference.precision import parse_kv_dtype
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.cache import KV_AUTO
from aiayn.tokenization.base import same_vocabulary


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
    parser.add_argument("--presence-penalty", type=finite_float, default=0.0,
                        help="OpenAI's, in [-2, 2]: subtracted from the logit of each token already generated (default: 0)")
    parser.add_argument("--frequency-penalty", type=finite_float, default=0.0,
                        help="OpenAI's, in [-2, 2]: subtracted once per time a token was generated (default: 0)")
    parser.add_argument("--min-p", type=finite_float, default=None, help="sample among tokens at least this fraction as likely as the best one")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0, help="never repeat an n-gram of this size (default: 0 = off)")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop once this text is generated (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default: 0)")
    parser.add_argument("--speculative", choices=SPECULATIVE_MODES, default=None,
                        help="speculative decoding: draft tokens by prompt lookup (n-gram copy) or by --draft-checkpoint, "
                             "checked K at a time by one forward of the model; the same tokens as without (default: off)")
    parser.add_argument("--draft-checkpoint", default=None, metavar="DIR",
                        help="--speculative draft: a smaller decoder-only model with the same tokenizer")
    parser.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, metavar="K",
                        help=f"--speculative: draft tokens checked per forward, >= 1 (default: {DEFAULT_DRAFT_TOKENS})")
    add_kv_cache_argument(parser)
    parser.add_argument("--ngram", type=int, default=DEFAULT_NGRAM, metavar="N",
                        help=f"--speculative prompt-lookup: the longest n-gram looked up, >= 1 (default: {DEFAULT_NGRAM})")


def run(args: argparse.Namespace) -> int:
    if any(not stop for stop in args.stop):
        raise SystemExit("aiayn generate: --stop must not be empty, got ''")
    settings = dict(  # validated by GenerationConfig, the one check the CLI, Python and the server share
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens, greedy=args.greedy, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size, stop_strings=tuple(args.stop),
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, min_p=args.min_p,
    )
    try:
        GenerationConfig(**settings)  # before the model is loaded
    except ValueError as e:
        name, _, rest = str(e).partition("=")  # "top_p=1.5 must be ..." -> "--top-p=1.5 must be ..."
        raise SystemExit(f"aiayn generate: --{name.replace('_', '-')}={rest}") from None
    _check_speculative(args)
    kv_dtype = parse_kv_dtype(args.kv_cache_dtype, name="--kv-cache-dtype")
    if args.compile and kv_dtype != KV_AUTO:
        raise SystemExit(f"aiayn generate: --kv-cache-dtype {args.kv_cache_dtype} is the C++ and eager steps' KV cache, not "
                         "--compile's: drop one of the two")
    loaded, tokenizer, _ = load_model_for("generate", args, DecoderOnly, "a decoder-only model (for translation use aiayn translate)")
    config = generation_config(tokenizer, **settings)  # EOS and pad: the tokenizer's own (GPT-2: <|endoftext|>)
    try:
        ids = torch.tensor([prompt_ids(tokenizer, args.prompt)], device=args.device)
    except ValueError as e:
        raise SystemExit(f"aiayn generate: --prompt {args.prompt!r}: {e}") from None
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    if args.compile:  # a toolchain that cannot compile, then a model that cannot: both before any decoding
        check_compile("generate")
    try:
        plain = CausalLMDecoder(loaded.model, static_cache=True, compile=args.compile,  # type: ignore[arg-type]
                                kv_dtype=kv_dtype)
    except ValueError as e:
        raise SystemExit(f"aiayn generate: {'--compile' if args.compile else '--kv-cache-dtype'}: {e}") from None
    decoder: CausalLMDecoder | SpeculativeDecoder = _speculative(args, plain, tokenizer) if args.speculative else plain
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


def _check_speculative(args: argparse.Namespace) -> None:
    """The speculative flags, before any model is loaded."""
    if args.draft_checkpoint is not None and args.speculative != "draft":
        raise SystemExit(f"aiayn generate: --draft-checkpoint is used by --speculative draft, got --speculative {args.speculative}")
    if args.speculative is None:
        return
    if args.speculative == "draft" and args.draft_checkpoint is None:
        raise SystemExit("aiayn generate: --speculative draft needs --draft-checkpoint DIR (a smaller model of the same "
                         "tokenizer); --speculative prompt-lookup needs none")
    for flag, value in (("--draft-tokens", args.draft_tokens), ("--ngram", args.ngram)):
        if value < 1:
            raise SystemExit(f"aiayn generate: {flag}={value} must be an integer >= 1")
    if args.compile:
        raise SystemExit("aiayn generate: --compile compiles the one-token step, which --speculative does not take "
                         "(it checks several tokens per forward): use one of them")


def _speculative(args: argparse.Namespace, decoder: CausalLMDecoder, tokenizer: object) -> SpeculativeDecoder:
    """The speculative decoder of ``--speculative``; a draft checkpoint must share the model's tokenizer."""
    draft = None
    if args.speculative == "draft":
        loaded, draft_tokenizer, _ = load_model_for("generate", args, DecoderOnly, "a decoder-only draft model", path=args.draft_checkpoint)
        if not same_vocabulary(draft_tokenizer, tokenizer):  # type: ignore[arg-type]
            raise SystemExit(f"aiayn generate: --draft-checkpoint {args.draft_checkpoint} has another tokenizer than "
                             f"--checkpoint {args.checkpoint}: a draft model must share the model's tokenizer (same vocabulary "
                             "and special ids), or use --speculative prompt-lookup")
        draft = loaded.model
    try:
        return SpeculativeDecoder(decoder, mode=args.speculative, draft_tokens=args.draft_tokens, ngram=args.ngram, draft_model=draft)
    except ValueError as e:
        raise SystemExit(f"aiayn generate: --speculative {args.speculative}: {e}") from None
