"""Speculative decoding against plain greedy decoding, in the same process, interleaved: tokens/s of each,
whether the tokens are the same, the acceptance rate and the target forwards per token.

Rows: ``plain`` (``CausalLMDecoder`` with a static cache, as ``aiayn generate`` decodes), ``prompt-lookup``
(:class:`~aiayn.decoding.speculative.SpeculativeDecoder`) and ``perfect-drafts``: drafts known to be right
(the plain run's own tokens), the ceiling prompt lookup reaches when the model's greedy continuation
copies its prompt. A random-weights model (the default, GPT-2-small-shaped, imported like
``benchmarks/generation.py``'s) does not copy its prompt, so its prompt-lookup acceptance says little;
the issue's target (prompt lookup >= 2x plain greedy on a prompt that repeats text) needs a trained
model: ``--checkpoint DIR --prompt TEXT`` (the prompt is repeated ``--prompt-repeats`` times).

    python benchmarks/speculative.py --threads 2
    python benchmarks/speculative.py --threads 2 --dtype bfloat16        # or --quantize int8 / int4
    python benchmarks/speculative.py --checkpoint runs/shakespeare/averaged --prompt "ROMEO: ..." --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from aiayn.cpu import cpu_summary
from aiayn.decoding import GenerationConfig, generate
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.speculative import DEFAULT_DRAFT_TOKENS, DEFAULT_NGRAM, SpeculativeDecoder
from aiayn.pretrained import prepare_for_inference

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/generation.py, however this script is loaded
import generation as generation_bench  # noqa: E402
from paired import paired_ratio  # noqa: E402


class PerfectDrafts:
    """A drafter that proposes the known answer (the plain run's tokens): acceptance 1, the ceiling."""

    def __init__(self, answer: list[int], prefix: int) -> None:
        self.answer, self.prefix = answer, prefix

    def start(self, ids: Tensor, mask: Tensor | None, max_new_tokens: int | None) -> object:
        return None

    def propose(self, sequence: list[int], count: int, run: object, config: object, generator: object) -> tuple[list[int], list]:
        done = len(sequence) - self.prefix
        drafts = self.answer[done : done + count]
        return drafts, [None] * len(drafts)


@dataclass
class Row:
    name: str
    seconds: list[float]
    tokens: list[int]
    acceptance: float | None = None
    forwards: int | None = None
    prefill_s: list[float] = field(default_factory=list)  # each run's time in the target's prefill
    forward_s: list[float] = field(default_factory=list)  # and in its forwards after it (steps, or checks)


class TimeSplit:
    """Times a target decoder's prefill (``start``) and its forwards (``step``, ``extend``) in a run, by wrapping them on
    the instance: what a run spends outside them (choosing tokens, drafting, the decoders' bookkeeping) is the rest."""

    def __init__(self, decoder: CausalLMDecoder) -> None:
        self.prefill = self.forwards = 0.0
        for name, part in (("start", "prefill"), ("step", "forwards"), ("extend", "forwards")):
            setattr(decoder, name, self._timed(getattr(decoder, name), part))

    def _timed(self, method: Callable[..., Tensor], part: str) -> Callable[..., Tensor]:
        def timed(*args: object, **kwargs: object) -> Tensor:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                setattr(self, part, getattr(self, part) + time.perf_counter() - start)
        return timed

    def take(self) -> tuple[float, float]:
        """The prefill's and the forwards' seconds since the last call."""
        parts, self.prefill, self.forwards = (self.prefill, self.forwards), 0.0, 0.0
        return parts


def model_and_prompt(args: argparse.Namespace) -> tuple[nn.Module, Tensor]:
    """The target model and a prompt ``(1, P)`` that repeats a text ``--prompt-repeats`` times."""
    if args.checkpoint:
        from aiayn.api import load_parts
        from aiayn.decoding.text import prompt_ids

        loaded = load_parts(args.checkpoint, dtype=args.dtype, quantize=args.quantize)
        text = args.prompt or "It is a truth universally acknowledged, that a single man in possession of a good fortune "
        assert loaded.src_tokenizer is not None, f"{args.checkpoint} holds no tokenizer"
        return loaded.model.eval(), torch.tensor([prompt_ids(loaded.src_tokenizer, text * args.prompt_repeats)])
    shape = generation_bench.QUICK_GPT if args.quick else generation_bench.GPT2
    model, _ = generation_bench.gpt2_pair(shape)
    model = prepare_for_inference(model, dtype=args.dtype, quantize=args.quantize)  # as aiayn.load prepares it
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, shape.vocab_size - 1, (args.text_tokens,), generator=g)
    return model, text.repeat(args.prompt_repeats)[None]


def run(args: argparse.Namespace) -> tuple[list[Row], int]:
    """The rows, timed ``--repeats`` times each, interleaved; and the prompt's length."""
    torch.set_num_threads(args.threads)
    model, ids = model_and_prompt(args)
    config = GenerationConfig(max_new_tokens=args.new_tokens, greedy=True, eos_id=None)
    plain = CausalLMDecoder(model, static_cache=True)
    lookup = SpeculativeDecoder(CausalLMDecoder(model, static_cache=True), draft_tokens=args.draft_tokens, ngram=args.ngram)
    answer = generate(plain, ids, None, config).sequences()[0]  # also the warm-up
    perfect = SpeculativeDecoder(CausalLMDecoder(model, static_cache=True), draft_tokens=args.draft_tokens)
    perfect.drafter = PerfectDrafts(answer, ids.shape[1])
    rows = [Row("plain", [], []), Row("prompt-lookup", [], []), Row("perfect-drafts", [], [])]
    splits = [TimeSplit(plain), TimeSplit(lookup.target), TimeSplit(perfect.target)]
    for _ in range(args.repeats):  # interleaved: a change of machine load hits every row alike
        for row, decoder, split in zip(rows, (plain, lookup, perfect), splits):
            split.take()
            start = time.perf_counter()
            out = generate(decoder, ids, None, config)
            row.seconds.append(time.perf_counter() - start)
            prefill, forwards = split.take()
            row.prefill_s.append(prefill)
            row.forward_s.append(forwards)
            row.tokens = out.sequences()[0]
            if isinstance(decoder, SpeculativeDecoder):
                row.acceptance, row.forwards = decoder.acceptance_rate, decoder.forwards
    return rows, ids.shape[1]


def report(rows: list[Row], args: argparse.Namespace, prompt_len: int) -> None:
    weights = args.quantize or args.dtype or "float32"
    print(f"# speculative decoding, {cpu_summary()}, {args.threads} threads, {weights} weights, prompt {prompt_len} "
          f"tokens ({args.prompt_repeats}x a text), {args.new_tokens} greedy tokens, K={args.draft_tokens}, ngram={args.ngram}")
    plain = rows[0].seconds  # each run of a row beside plain decoding's of the same round
    print("| decoder | tok/s (median) | vs plain (rounds' median) | same tokens | acceptance | target forwards | ms: prefill | forwards | the rest |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        median = statistics.median(row.seconds)
        same = "yes" if row.tokens == rows[0].tokens else "NO"
        acceptance = "—" if row.acceptance is None else f"{row.acceptance:.2f}"
        forwards = str(args.new_tokens) if row.forwards is None else str(row.forwards)
        prefill, forward = statistics.median(row.prefill_s), statistics.median(row.forward_s)
        rest = statistics.median(total - a - b for total, a, b in zip(row.seconds, row.prefill_s, row.forward_s))
        speedup = paired_ratio(plain, row.seconds)  # times: plain's over the row's
        print(f"| {row.name} | {len(row.tokens) / median:.1f} | {speedup:.2f}x | {same} | {acceptance} | {forwards} "
              f"| {prefill * 1e3:.2f} | {forward * 1e3:.2f} | {rest * 1e3:.2f} |")
    print("ms: each part's median over the runs; prefill: the target decoder's start; forwards: its step (plain) or "
          "extend (a check) calls after it, their own Python included; the rest: choosing each token, drafting and the "
          "speculative decoder's bookkeeping")


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random model (a smoke test)")
    parser.add_argument("--checkpoint", default=None, help="a trained decoder-only model directory (else a random GPT-2-small shape)")
    parser.add_argument("--prompt", default=None, help="--checkpoint: the text to repeat")
    parser.add_argument("--prompt-repeats", type=int, default=2, help="times the text appears in the prompt (default: 2)")
    parser.add_argument("--text-tokens", type=int, default=64, help="random model: tokens of the repeated text (default: 64)")
    parser.add_argument("--new-tokens", type=int, default=128, help="greedy tokens to generate (default: 128)")
    parser.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, help=f"K (default: {DEFAULT_DRAFT_TOKENS})")
    parser.add_argument("--ngram", type=int, default=DEFAULT_NGRAM, help=f"prompt lookup's longest n-gram (default: {DEFAULT_NGRAM})")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed runs of each row (default: 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--dtype", default=None, help="the weights' dtype, as aiayn.load takes it (default: as stored, fp32)")
    parser.add_argument("--quantize", default=None, help="int8 or int4 weights, as aiayn.load takes it (default: none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.text_tokens, args.repeats = min(args.new_tokens, 16), min(args.text_tokens, 12), 1
    rows, prompt_len = run(args)
    report(rows, args, prompt_len)
    return rows


if __name__ == "__main__":
    main()
