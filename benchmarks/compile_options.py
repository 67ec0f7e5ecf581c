"""Does an option of ``torch.compile`` shorten the compiled decode step? Tokens/s of greedy decoding on the
GPT-2-small shape (random weights, batch 1, prompt 16) with ``CausalLMDecoder(compile=True)`` as it is (weights
frozen into the graph, oneDNN's packed weights as its constants: ``aiayn.decoding.adapters.compiled_step``), against
the same step with Inductor's ``cpp_wrapper``, with Inductor packing plain ``nn.Linear`` weights itself
(``inductor-pack``: ``cpp.weight_prepack``, no kernel timed at load), with attention's formula (``backend="math"``)
instead of the flash kernel, or with the settings of :data:`SETTINGS`; rounds interleaved in one process. docs/benchmarks.md (issue 27, item 5) has runs.

    python benchmarks/compile_options.py --dtype fp32 --variants compiled,cppw,inductor-pack
    python benchmarks/compile_options.py --dtype bf16 --variants compiled,inductor-pack,compiled-math
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generation  # noqa: E402  # benchmarks/generation.py: the model pair

from aiayn.cpu import cpu_summary  # noqa: E402
from aiayn.decoding import GenerationConfig, generate  # noqa: E402
from aiayn.decoding.adapters import CausalLMDecoder, compiled_step  # noqa: E402
from aiayn.nn.multihead import MultiHeadAttention  # noqa: E402
from aiayn.pretrained import prepare_for_inference  # noqa: E402

VARIANTS = ("compiled", "cppw", "inductor-pack", "inductor-pack-cppw", "compiled-math", "serial", "noasserts", "serial-noasserts")
# Inductor settings a variant's name adds: "serial", no OpenMP region in the graph's own kernels (a one-token step's
# elementwise work is a few thousand elements); "noasserts", no size and alignment checks in the Python wrapper.
SETTINGS = {"serial": {"cpp.min_chunk_size": 1 << 20}, "noasserts": {"size_asserts": False, "alignment_asserts": False}}


def decoder(model: torch.nn.Module, variant: str, dtype: str) -> CausalLMDecoder:
    """The model loaded as ``aiayn.load`` does (plain Linear layers for ``inductor-pack``), its step compiled as
    ``variant`` says."""
    model = prepare_for_inference(copy.deepcopy(model), dtype="bfloat16" if dtype == "bf16" else None,
                                  quantize="int8" if dtype == "int8" else None, pack="inductor-pack" not in variant)
    if variant.endswith("-math"):
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.backend = "math"
    dec = CausalLMDecoder(model, static_cache=True, compile=True)
    options: dict[str, Any] = {"cpp.weight_prepack": True} if "inductor-pack" in variant else {}
    options |= {"cpp_wrapper": True} if "cppw" in variant else {}
    for word, settings in SETTINGS.items():
        options |= settings if word in variant.split("-") else {}
    if options:
        dec._step = compiled_step(model, options)
    return dec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32", help="int8: weight-only int8 (fp32 activations)")
    p.add_argument("--variants", default="compiled,cppw,freeze", help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    names = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in names if v not in VARIANTS]:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    print(cpu_summary(), f"torch {torch.__version__}, {args.threads} threads", flush=True)
    ours, _ = generation.gpt2_pair(generation.GPT2)
    config = GenerationConfig(max_new_tokens=args.new_tokens, greedy=True, eos_id=None)
    ids = torch.randint(0, generation.GPT2.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    decoders, first = {}, {}
    for name in names:
        decoders[name] = decoder(ours, name, args.dtype)
        start = time.perf_counter()
        first[name] = generate(decoders[name], ids, None, config).tokens  # compiles
        print(f"{name}: first call (compiling) {time.perf_counter() - start:.1f} s", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            generate(decoders[name], ids, None, config)
            seconds[name].append(time.perf_counter() - start)
    print(f"| variant | {args.dtype} tok/s (median of {args.rounds}) | leading tokens = {names[0]} |\n| --- | ---: | ---: |")
    for name in names:
        median = sorted(seconds[name])[len(seconds[name]) // 2]
        print(f"| {name} | {args.new_tokens / median:.2f} | {generation.leading_agreement(first[name], first[names[0]])}/{args.new_tokens} |")


if __name__ == "__main__":
    main()
