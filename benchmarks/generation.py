"""How fast do we generate, against Hugging Face ``generate`` on the same weights? Tokens/s of greedy
decoding on a GPT-2-small-shaped decoder-only model, and sentences/s of beam search (beam 4) on a
Marian-shaped encoder-decoder, in one process, rounds interleaved, medians reported.

Decoder-only variants (``--variants``): ours in fp32 over the static KV cache (``ours-fp32``), the
same over the dynamic (growing) cache (``ours-fp32-dynamic``), with bf16 weights (``ours-bf16``),
with int8 or int4 weight-only Linear layers (``ours-int8``, ``ours-int4``), with int8 weights and activations
(``ours-int8dyn``: ``quantize="int8-dynamic"``, llama.cpp's Q8_0 scheme in kind), compiled (``ours-*-compiled``), with the
one-token step through the model's Python modules rather than the C++ step the default load takes where the model allows
it (``ours-*-eager``: ``CausalLMDecoder(native=False)``, :mod:`aiayn.decoding.native_step`), with the weights left on
4 KiB pages where the default load puts them on transparent huge pages (``ours-*-small-pages``: ``huge_pages=False``,
:mod:`aiayn.inference.huge_pages`; the same kernels), with the static cache's keys and values kept in bf16
(``ours-{fp32,int8,int4,int8dyn}-kvbf16``: ``CausalLMDecoder(kv_dtype=torch.bfloat16)``, as llama.cpp keeps fp16 by default) or in
the activations' dtype (``ours-{int8,int4}-kvfp32``: ``kv_dtype=None``; the other variants take ``kv_dtype="auto"``, as
``aiayn.load(...).generate`` does: bf16 for weight-only int8 and int4 weights, else the activations'), without a
cache (``ours-fp32-uncached``), with plain ``nn.Linear`` layers instead of the oneDNN-packed ones
``load_pretrained`` gives (``ours-fp32-unpacked``: MKL's sgemm, as Hugging Face runs); Hugging Face ``GPT2LMHeadModel.generate`` in fp32 (``hf-fp32``) and
with bf16 weights (``hf-bf16``). Weights are random (no download), built as ``GPT2LMHeadModel`` and
imported with ``aiayn.interop.load_hf``; prompts are random ids, every row of a batch as long as
the others; every variant generates exactly ``--new-tokens`` tokens (no EOS).

The bandwidth bound: at batch 1 every step reads every weight once, so tokens/s cannot exceed
(copy bandwidth) / (bytes of the weights read per token); the copy bandwidth is measured in the same
run (``dst.copy_(src)`` of 256 MiB, read + written bytes over time).

What is left outside the weights: for each of our variants, a share of a decode step's wall time (timed
without the profiler) that is not spent in the kernels that read the weights (torch.profiler's self time of
``aten::addmm``/``mm``, ``aten::baddbmm``/``bmm`` (the split kernel's slices), oneDNN's ``_linear_pointwise``,
our native matrix-vector product ``aiayn_native::gemv``, ``gemv_add_`` and ``gemv_activation`` (the same product added
into the residual stream, or put through the feed-forward's activation, as it is written: that work is counted inside),
the int8 and int4 kernels: :data:`WEIGHT_KERNELS`; one row a token, so each is a weight read).
The rest is attention, norms, activations, casts, the cache writes, the argmax, the dispatch of every op and the Python
between them.

    python benchmarks/generation.py                                   # everything (long on 2 cores)
    python benchmarks/generation.py --batches 1 --threads 2 --rounds 3
    python benchmarks/generation.py --variants ours-bf16,hf-fp32 --profile ours-bf16
    python benchmarks/generation.py --quick                            # tiny shapes in seconds (smoke test)
    python benchmarks/generation.py --token-chain --threads 2          # one token's weight reads, each one-row kernel

llama.cpp is the peer at batch 1 when its llama-bench is built (``benchmarks/llama_cpp.sh build``, 5 to 25
minutes on 2 cores): the same random GPT-2 weights are converted by llama.cpp's own converter to F32, BF16, Q8_0
and Q4_0, and ``llama-bench -t THREADS -p PROMPT -n NEW_TOKENS -r 1 --repack 0`` runs each once a round, in the
same interleaved rounds as ours (a shared machine's bandwidth drifts by a third within minutes: only rounds taken
together compare; each format's runs follow our variants of that format). Its rows join the table (``llama.cpp-f32``
...), and a second table gives ours (the best variant of each format) against it: the ratio of the two medians, and the
median and range of each round's ratio, which the verdict reads. Without the build the column is skipped, saying how to build it. ``--llama-cpp no``
skips it.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from aiayn.cpu import cpu_summary
from aiayn.decoding import BeamConfig, GenerationConfig, beam_search, generate
from aiayn.decoding.adapters import CausalLMDecoder, Seq2SeqDecoder
from aiayn.decoding.sampling import argmax_last
from aiayn.inference import Int8Linear, PackedLinear, gemv
from aiayn.inference.huge_pages import huge_page_copies
from aiayn.inference.huge_pages import unavailable_reason as huge_pages_reason
from aiayn.inference.precision import can_pack, native_bf16
from aiayn.interop.hf import load_hf
from aiayn.nn.cache import KV_AUTO
from aiayn.pretrained import prepare_for_inference

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/llama_peer.py, however this script is loaded
import llama_peer  # noqa: E402
from paired import paired_ratio, round_ratios  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    n_layers: int
    n_heads: int
    d_model: int
    vocab_size: int
    n_positions: int


GPT2 = Shape(n_layers=12, n_heads=12, d_model=768, vocab_size=50257, n_positions=1024)
QUICK_GPT = Shape(n_layers=2, n_heads=2, d_model=64, vocab_size=512, n_positions=64)
MARIAN = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101}  # opus-mt-de-en's sizes
QUICK_MARIAN = {"d_model": 32, "layers": 2, "heads": 2, "ffn": 64, "vocab": 128}

VARIANTS = (
    "ours-fp32", "ours-fp32-dynamic", "ours-bf16", "ours-int8", "ours-fp32-compiled", "ours-bf16-compiled",
    "ours-int8-compiled", "ours-int8dyn", "ours-int8dyn-compiled", "ours-int4", "ours-int4-compiled", "ours-fp32-uncached", "ours-fp32-unpacked", "hf-fp32", "hf-bf16",
    "ours-fp32-eager", "ours-bf16-eager", "ours-int8-eager", "ours-int4-eager",
    "ours-fp32-small-pages", "ours-bf16-small-pages", "ours-int8-small-pages", "ours-int4-small-pages",
    "ours-fp32-kvbf16", "ours-int8-kvbf16", "ours-int4-kvbf16", "ours-int8-kvfp32", "ours-int4-kvfp32", "ours-int8dyn-kvbf16",
)
DEFAULT_VARIANTS = (
    "ours-fp32", "ours-fp32-unpacked", "ours-fp32-dynamic", "ours-bf16", "ours-int8", "ours-int4", "ours-fp32-compiled", "ours-fp32-uncached",
    "hf-fp32", "hf-bf16",
)
# The targets: (variant, batch) -> (peer variant, ratio)
TARGETS = {
    ("ours-fp32", 1): ("hf-fp32", 1.2), ("ours-bf16", 1): ("hf-fp32", 2.0), ("ours-int8", 1): ("hf-fp32", 3.0),
    ("ours-fp32", 8): ("hf-fp32", 1.5), ("ours-bf16", 8): ("hf-bf16", 1.5), ("ours-int8", 8): ("hf-fp32", 1.5),
}


# --------------------------------------------------------------------------- models


def gpt2_pair(shape: Shape, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(ours, peer): a random ``GPT2LMHeadModel`` and its import, both in eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    peer = GPT2LMHeadModel(GPT2Config(
        n_layer=shape.n_layers, n_head=shape.n_heads, n_embd=shape.d_model, vocab_size=shape.vocab_size,
        n_positions=shape.n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=shape.vocab_size - 1, eos_token_id=shape.vocab_size - 1,
    )).eval()
    return load_hf(peer).model.eval(), peer


def marian_pair(sizes: dict, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(ours, peer): a random ``MarianMTModel`` (6+6 layers, d_model 512 by default) and its import."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    peer = MarianMTModel(MarianConfig(
        vocab_size=sizes["vocab"], d_model=sizes["d_model"], encoder_layers=sizes["layers"], decoder_layers=sizes["layers"],
        encoder_attention_heads=sizes["heads"], decoder_attention_heads=sizes["heads"], encoder_ffn_dim=sizes["ffn"],
        decoder_ffn_dim=sizes["ffn"], max_position_embeddings=512, pad_token_id=0, eos_token_id=2,
        decoder_start_token_id=0, forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )).eval()
    return load_hf(peer).model.eval(), peer


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the Linear weights (and int8 scales, biases) a decoding step reads once per token."""
    from aiayn.inference.int4 import Int4Linear

    total = 0
    for module in model.modules():
        if isinstance(module, Int4Linear):  # what its kernel reads: the packed codes and the scales-and-zeros
            total += sum(t.numel() * t.element_size() for t in (module.packed, module.scale_zeros))
            total += module.bias.numel() * module.bias.element_size() if module.bias is not None else 0
        elif isinstance(module, (nn.Linear, Int8Linear, PackedLinear)) or type(module).__name__ == "Conv1D":  # HF GPT-2's Linear
            total += sum(t.numel() * t.element_size() for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)))
    return total


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of ``dst.copy_(src)`` (read + write), the best of ``repeats``."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


# --------------------------------------------------------------------------- runners


# Each format's load (prepare_for_inference's arguments). int4: a scale and zero per 32 inputs, as llama.cpp's Q4_0;
# int8dyn: int8 activations too, as its Q8_0.
LOADS: dict[str, dict[str, object]] = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"},
                                       "int8dyn": {"quantize": "int8-dynamic"}, "int4": {"quantize": "int4"}}
Runner = tuple[Callable[[Tensor], Tensor], nn.Module, CausalLMDecoder | None]
PROMPT = ":prompt"  # after llama.cpp-<GGUF>: its prompt-processing runner and row
# A variant's KV cache by its suffix; the others take "auto", the default load's (aiayn.load(...).generate)
KV_CACHES: dict[str, torch.dtype | None] = {"kvbf16": torch.bfloat16, "kvfp32": None}


def _model_key(name: str) -> str:
    """The model a variant of ours decodes: its format's load (``ours-bf16-compiled`` -> ``bf16``), ``unpacked``, or the
    format's load on 4 KiB pages (``ours-int8-small-pages`` -> ``int8-small-pages``)."""
    fmt = name.split("-")[1]
    return "unpacked" if name.endswith("-unpacked") else f"{fmt}-small-pages" if name.endswith("-small-pages") else fmt


def decoder_only_runners(ours: nn.Module, peer: nn.Module, names: Sequence[str], new_tokens: int) -> dict[str, Runner]:
    """name -> (ids (B, P) -> generated (B, N), the model it reads, our decoder or ``None``), for the variants asked for. Each
    of ours is prepared as ``aiayn.load`` prepares a model (``prepare_for_inference``: quantised, Q/K/V fused, cast, packed
    where timed faster); ``ours`` becomes the fp32 one in place, and an unpacked copy is kept only when an ``-unpacked``
    variant is asked for (GPT-2 small: 0.5 GB)."""
    config = GenerationConfig(max_new_tokens=new_tokens, greedy=True, eos_id=None)
    models: dict[str, nn.Module] = {}
    for key in sorted({_model_key(n) for n in names if n.startswith("ours-")} - {"fp32"}):  # each load once, fp32 last (in place)
        fmt = key.split("-")[0]
        if key == "unpacked":  # MKL's sgemm through F.linear, as a plain nn.Linear runs
            models[key] = prepare_for_inference(copy.deepcopy(ours), pack=False)
        else:  # the format's load; -small-pages: its weights left on 4 KiB pages
            models[key] = prepare_for_inference(copy.deepcopy(ours), **LOADS[fmt], **({"huge_pages": False} if key != fmt else {}))
    models["fp32"] = prepare_for_inference(ours)
    peer_bf16 = copy.deepcopy(peer).to(torch.bfloat16) if "hf-bf16" in names else None

    def ours_with(decoder: object) -> Callable[[Tensor], Tensor]:
        return lambda ids: generate(decoder, ids, None, config).tokens  # type: ignore[arg-type]

    def hf_with(model: nn.Module) -> Callable[[Tensor], Tensor]:
        def run(ids: Tensor) -> Tensor:
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False, num_beams=1, pad_token_id=0)
            return out[:, ids.shape[1]:]
        return run

    runners: dict[str, Runner] = {}
    for name in names:
        if name.startswith("hf-"):
            model = peer if name == "hf-fp32" else peer_bf16
            runners[name] = (hf_with(model), model, None)  # type: ignore[arg-type]
            continue
        model = models[_model_key(name)]
        if name.endswith("-dynamic"):
            decoder = CausalLMDecoder(model)
        elif name.endswith("-uncached"):
            decoder = CausalLMDecoder(model, use_cache=False)
        else:
            decoder = CausalLMDecoder(model, static_cache=True, compile=name.endswith("-compiled"), native=not name.endswith("-eager"),
                                      kv_dtype=KV_CACHES.get(name.rsplit("-", 1)[-1], KV_AUTO))
        runners[name] = (ours_with(decoder), model, decoder)
    return runners


def leading_agreement(tokens: Tensor, reference: Tensor) -> int:
    """How many leading steps agree in every row."""
    same = (tokens == reference).all(dim=0).long()  # (N,)
    return int(same.cumprod(0).sum())


def interleaved(runners: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each runner, ``rounds`` times, the order rotated every round."""
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)
    return times


def beside_their_format(calls: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
    """``calls`` reordered so that each llama.cpp format's runs follow our variants of that format (and their
    prefills) in a round: the host's memory speed can change within a round (about half a minute; on a Zen 4 EPYC it
    moved from 31 to 48 GB/s between two rounds, 2026-12-07), and the per-round ratio pairs what ran seconds apart."""
    def group(name: str) -> int:
        base = name.split(":")[0]
        for i, (fmt, variants) in enumerate(llama_peer.FORMATS.items()):
            if base in variants or base == f"llama.cpp-{fmt}":
                return i
        return len(llama_peer.FORMATS)

    return dict(sorted(calls.items(), key=lambda item: group(item[0])))  # stable: the order within a group is kept


# --------------------------------------------------------------------------- the two benchmarks


@dataclass(frozen=True)
class Row:
    batch: int
    threads: int
    variant: str
    tokens_per_s: float
    agree: int
    bound_tokens_per_s: float | None
    rates: tuple[float, ...]
    outside: float | None = None  # the share of a decode step outside the weight kernels (ours only)
    decode_tokens_per_s: float | None = None  # ours without the prefill: the tokens after the first over the steps' time
    prefill_tokens_per_s: float | None = None  # ours: the prompt's tokens over the median prefill (decoder.start)
    decode_rates: tuple[float | None, ...] = ()  # ours: each round's decode-only rate (its call less its prefill), None
    # where that round's prefill outlasted its call: paired with llama.cpp's rate of the same round


def bench_decoder_only(args: argparse.Namespace, shape: Shape, batch: int, threads: int, bandwidth: float) -> list[Row]:
    torch.set_num_threads(threads)
    ours, peer = gpt2_pair(shape)
    runners = decoder_only_runners(ours, peer, args.variants, args.new_tokens)
    torch.manual_seed(1)
    ids = torch.randint(1, shape.vocab_size - 1, (batch, args.prompt))
    outputs = {name: run(ids) for name, (run, _, _) in runners.items()}  # warm-up (and compilation), and the tokens
    reference = outputs.get("hf-fp32")
    if reference is not None and "ours-fp32" in outputs and not torch.equal(outputs["ours-fp32"], reference):
        log.warning("ours-fp32 tokens differ from hf-fp32: %d leading steps agree", leading_agreement(outputs["ours-fp32"], reference))
    calls: dict[str, Callable[[], object]] = {n: (lambda run=run: run(ids)) for n, (run, _, _) in runners.items()}
    peer_rates = llama_runners(args, peer, threads) if batch == 1 else {}
    if peer_rates:  # llama-bench times generation alone (its prompt is in the cache before, -d): time our prefills apart
        calls.update({f"{n}:prefill": (lambda d=d: d.start(ids, max_new_tokens=args.new_tokens))
                      for n, (_, _, d) in runners.items() if d is not None})
    calls.update({name: call for name, (call, _) in peer_rates.items()})
    times = interleaved(beside_their_format(calls), args.rounds)  # llama-bench's runs among ours: the drift hits both alike
    rows = [Row(batch, threads, name, statistics.median(rates), -1, None, tuple(rates)) for name, (_, rates) in peer_rates.items()]
    prompt_tokens = batch * args.prompt
    for name, (_, model, decoder) in runners.items():
        rates = tuple(batch * args.new_tokens / t for t in times[name])
        agree = leading_agreement(outputs[name], reference) if reference is not None else -1
        bound = batch * bandwidth / weight_bytes(model) if not name.endswith("-uncached") else None
        outside = outside_the_weights(decoder, ids, min(16, args.new_tokens)) if decoder is not None else None
        decode, prefill, decode_rates = None, None, ()
        if f"{name}:prefill" in times:
            prefill = prompt_tokens / statistics.median(times[f"{name}:prefill"])
            decode_rates = tuple(batch * (args.new_tokens - 1) / (t - p) if t > p and args.new_tokens > 1 else None
                                 for t, p in zip(times[name], times[f"{name}:prefill"]))
        if f"{name}:prefill" in times and args.new_tokens > 1:  # new_tokens - 1 steps: the first token is the prefill's
            steps = statistics.median(times[name]) - statistics.median(times[f"{name}:prefill"])
            if steps > 0:  # a noisy round can make the median prefill outlast the median whole call: no rate then
                decode = batch * (args.new_tokens - 1) / steps
            else:
                log.warning("%s: the median prefill (%.4f s) is not shorter than the median call: no decode-only rate", name,
                            statistics.median(times[f"{name}:prefill"]))
        rows.append(Row(batch, threads, name, statistics.median(rates), agree, bound, rates, outside, decode, prefill, decode_rates))
    if args.profile:
        for name in args.profile:
            if name in runners:
                print(profile_table(name, lambda run=runners[name][0]: run(ids)))
    return rows


# The kernels that read a Linear layer's weight (fp32/bf16 through MKL or oneDNN, split over the threads by batched
# matmuls, int8, int4, FBGEMM's int8-dynamic), as torch.profiler names them. Attention's formula path multiplies by bmm too: counted here,
# it is small beside the weights at these lengths (the fused SDPA kernel, taken at longer ones, is not a bmm).
WEIGHT_KERNELS = frozenset({"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "mkldnn::_linear_pointwise",
                            "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu", "quantized::linear_dynamic",
                            "aiayn_native::gemv", "aiayn_native::gemv_add_", "aiayn_native::gemv_activation"})


def outside_the_weights(decoder: CausalLMDecoder, ids: Tensor, steps: int) -> float:
    """The share of a decode step's wall time spent outside :data:`WEIGHT_KERNELS`: ``1 - median(kernel time) /
    median(step time)`` over ``steps`` steps timed without the profiler and, alternating with them (so that both
    see the same load), ``steps`` steps profiled one by one for the kernels' self time; after two warm-up steps. Each picks its token as greedy decoding does (:func:`~aiayn.decoding.sampling.argmax_last`).
    One untimed step follows each profiled one: the step right after the profiler's ``key_averages()`` ran 0.3-0.4 ms
    slower than the second to fourth steps after it (int8 GPT-2 small, AMX Xeon, 2026-12-06; docs/benchmarks.md), a
    cost no decoding run pays."""
    from torch.profiler import ProfilerActivity, profile

    state, logits = decoder.start(ids, max_new_tokens=3 * steps + 2)
    tokens = argmax_last(logits)
    for _ in range(2):
        tokens = argmax_last(decoder.step(tokens, state))
    walls, kernels = [], []
    for _ in range(steps):
        start = time.perf_counter()
        tokens = argmax_last(decoder.step(tokens, state))
        walls.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            tokens = argmax_last(decoder.step(tokens, state))
        kernels.append(sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in WEIGHT_KERNELS) / 1e6)  # us -> s
        tokens = argmax_last(decoder.step(tokens, state))  # settling after the profiler, untimed
    return 1 - statistics.median(kernels) / statistics.median(walls)


def profile_table(name: str, fn: Callable[[], object], rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    return f"\nprofile of {name} (one generate call), by self CPU time:\n{table}"


def bench_beam(args: argparse.Namespace, sizes: dict, threads: int) -> tuple[float, float, bool]:
    """(ours sentences/s, peer sentences/s, same best hypotheses) of beam 4 over ``--beam-sentences`` sources."""
    torch.set_num_threads(threads)
    ours, peer = marian_pair(sizes)
    prepare_for_inference(ours, pack=args.beam_packed)  # as aiayn.load prepares it (packed unless --beam-unpacked)
    n_new = args.beam_new_tokens
    torch.manual_seed(2)
    src = torch.randint(3, sizes["vocab"], (args.beam_sentences, args.beam_source_len))
    config = BeamConfig(beam_size=4, length_penalty=1.0, max_new_tokens=n_new, min_new_tokens=n_new, eos_id=2, pad_id=0)
    decoder = Seq2SeqDecoder(ours, bos_id=0)

    def run_ours() -> list[list[int]]:
        return [h[0].tokens for h in beam_search(decoder, src, None, config)]

    def run_peer() -> list[list[int]]:
        with torch.no_grad():
            out = peer.generate(src, attention_mask=torch.ones_like(src), num_beams=4, max_new_tokens=n_new,
                                min_new_tokens=n_new, length_penalty=1.0, early_stopping=True, do_sample=False)
        return [row[1:].tolist() for row in out]  # without the decoder start token

    same = run_ours() == run_peer()
    times = interleaved({"ours": run_ours, "peer": run_peer}, args.rounds)
    return (args.beam_sentences / statistics.median(times["ours"]), args.beam_sentences / statistics.median(times["peer"]), same)


def few_row_linears(rows: int, out_features: int, repeats: int = 15, calls: int = 5) -> dict[str, tuple[float, float]]:
    """ms per ``x (rows, 768) @ W^T`` with ``W (out_features, 768)`` -> (median, best), for fp32 as ``nn.Linear``
    runs it (MKL's sgemm), fp32 and bf16 packed once for oneDNN (``PackedLinear``), bf16 plain, int8 (weight-only, bf16
    activations), int8-dynamic (FBGEMM, int8 activations) and int4 (groups of 32, torch's kernel); for one row also our
    native kernel over fp32, bf16, int8 and int4 weights (fp32 activations for int8 and int4; int8 and int4 a few rows
    too), without and with prefetching, where it builds. The same layer is called
    again, so a weight that fits the cache is timed hot: the decoding rows are the model's case."""
    from aiayn.inference.int4 import Int4Linear
    from aiayn.inference.int8_dynamic import Int8DynamicLinear
    from aiayn.inference.quantization import Int8Linear as Int8

    torch.manual_seed(0)
    linear = nn.Linear(768, out_features, bias=False)
    bf16 = copy.deepcopy(linear).to(torch.bfloat16)
    x, x_bf16 = torch.randn(rows, 768), torch.randn(rows, 768, dtype=torch.bfloat16)
    cases = {"fp32": (linear, x), "fp32 packed": (PackedLinear(linear), x), "bf16": (bf16, x_bf16)}
    if can_pack(bf16.weight):  # oneDNN packs bf16 only with AVX512 or AVX-NE-CONVERT
        cases["bf16 packed"] = (PackedLinear(bf16), x_bf16)
    cases["int8"] = (Int8.from_linear(linear), x_bf16)
    cases["int8-dynamic"] = (Int8DynamicLinear.from_linear(linear), x)
    cases["int4"] = (Int4Linear.from_linear(linear, 32), x)
    if gemv.available():  # our matrix-vector kernel, built on this machine (aiayn.inference.gemv)
        for kernel in gemv.KERNELS:  # without and with prefetching
            if rows == 1:
                cases[f"fp32 {kernel}"] = (PackedLinear(linear, one=kernel, many="plain"), x)
                cases[f"bf16 {kernel}"] = (PackedLinear(bf16, one=kernel, many="plain"), x_bf16)
            int8_native = Int8.from_linear(linear)
            int8_native.one = int8_native.many = kernel  # int8: a few rows too (up to gemv.FEW_ROWS)
            cases[f"int8 {kernel}"] = (int8_native, x)
            int4_native = Int4Linear.from_linear(linear, 32)
            int4_native.one = int4_native.many = kernel
            cases[f"int4 {kernel}"] = (int4_native, x)
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for _ in range(repeats):
            for name, (module, inputs) in cases.items():
                module(inputs)
                start = time.perf_counter()
                for _ in range(calls):
                    module(inputs)
                times[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def token_chain(shape: Shape, rounds: int = 9) -> dict[str, dict[str, float]]:
    """dtype -> kernel -> ms of one token's weight reads: the one-row calls of a decoding step of ``shape`` in their
    order (fused Q/K/V, the output projection, the two feed-forward layers per layer, then the vocabulary), each weight
    its own tensor, through each one-row kernel the load may choose (the median of ``rounds`` interleaved rounds), on
    4 KiB pages and, where the system has them, on transparent huge pages (:mod:`aiayn.inference.huge_pages`).
    What a step costs without the rest of it: the kernels' in-model rate, which a layer timed alone in the cache
    (``--linears``) does not show."""
    from aiayn.inference.kernel_choice import WEIGHT_ONLY_ONE_ROW, _kernel, one_row_kernels

    d, layers = shape.d_model, shape.n_layers
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers + [(shape.vocab_size, d)]
    out: dict[str, dict[str, float]] = {}
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.int8, "int4"):
        group = 32 if dtype == "int4" else 0  # int4: codes two to a byte, in groups of 32 inputs (GROUP_SIZES[0])
        if dtype == "int4":
            weights, names = [torch.randint(0, 256, (o, i // 2), dtype=torch.uint8) for o, i in shapes], WEIGHT_ONLY_ONE_ROW
        elif dtype == torch.int8:
            weights, names = [torch.randint(-127, 128, s, dtype=torch.int8) for s in shapes], WEIGHT_ONLY_ONE_ROW
        else:
            weights, names = [torch.randn(s).to(dtype) for s in shapes], one_row_kernels(dtype)
        floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
        xs = {n: torch.randn(1, n, dtype=dtype if floating else torch.float32) for n in {i for _, i in shapes}}
        width = 2 if group else 1  # a row's inputs per element of the weight

        def chain_of(ws: list[Tensor], name: str, xs: dict[int, Tensor] = xs, width: int = width, group: int = group) -> list[Callable[[], Tensor]]:
            return [_kernel(name, w, xs[width * w.shape[1]], group) for w in ws]

        calls = {name: chain_of(weights, name) for name in names}
        if huge_pages_reason() is None:  # and the same weights on transparent huge pages, as the load may put them
            placed = huge_page_copies(weights)
            calls.update({f"{name}+huge-pages": chain_of(placed, name) for name in names})
            del placed  # the calls hold them

        def token(chain: list[Callable[[], Tensor]]) -> Callable[[], None]:
            def run() -> None:
                for call in chain:
                    call()
            return run

        with torch.no_grad():
            times = interleaved({name: token(chain) for name, chain in calls.items()}, rounds + 1)
        # the first round warms up
        out[str(dtype).removeprefix("torch.")] = {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}
        del calls, weights
    return out


# --------------------------------------------------------------------------- report


LLAMA_SKIPPED = "\nllama.cpp: skipped (no llama-bench; build it with benchmarks/llama_cpp.sh build, or pass --llama-bench PATH)"


def llama_runners(args: argparse.Namespace, peer: nn.Module, threads: int) -> dict[str, tuple[Callable[[], None], list[float]]]:
    """``llama.cpp-<GGUF>`` -> (a call that runs llama-bench once on ``peer``'s weights in that format and keeps its
    generation's tokens/s, the list it keeps them in), and ``llama.cpp-<GGUF>:prompt`` the same for its prompt processing:
    timed in the same interleaved rounds as ours. Empty without llama-bench or with ``--llama-cpp no``."""
    bench = llama_peer.find_llama_bench(args.llama_bench) if args.llama_cpp == "auto" else None
    if bench is None:
        return {}
    files = llama_peer.gguf_files(peer)
    runners: dict[str, tuple[Callable[[], None], list[float]]] = {}
    for fmt in llama_peer.FORMATS:
        rates: list[float] = []
        def call(gguf: Path = files[fmt], rates: list[float] = rates) -> None:
            rates.append(llama_peer.llama_bench_tokens_per_s(bench, gguf, threads, args.prompt, args.new_tokens, 1))
        runners[f"llama.cpp-{fmt}"] = (call, rates)
        prompt_rates: list[float] = []
        def prompt(gguf: Path = files[fmt], rates: list[float] = prompt_rates) -> None:
            rates.append(llama_peer.llama_bench_prompt_tokens_per_s(bench, gguf, threads, args.prompt, 1))
        runners[f"llama.cpp-{fmt}{PROMPT}"] = (prompt, prompt_rates)
    return runners


def prompt_table(args: argparse.Namespace, rows: Sequence[Row]) -> str:
    """Ours (the variant of each format with the fastest prefill) against llama.cpp's prompt processing (llama-bench
    ``-p``, an empty cache), batch 1, in the same rounds: a table (no target in issue 27; the time to the first token)."""
    lines = [f"\nthe prompt ({args.prompt} tokens, batch 1) against llama.cpp's prompt processing (llama-bench -p {args.prompt} "
             "-n 0, in the rounds of ours); ours: the prompt's tokens over the median of decoder.start (the prefill, its "
             "Python and the cache's allocation)",
             "| threads | GGUF | llama.cpp prompt tok/s | ours, fastest prefill | ours prompt tok/s | ours/llama.cpp |",
             "| ---: | --- | ---: | --- | ---: | ---: |"]
    for threads, fmt, peer, best in _against_llama(args, rows, PROMPT, lambda r: r.prefill_tokens_per_s):
        if best is not None and best.prefill_tokens_per_s is not None:
            lines.append(f"| {threads} | {fmt} | {peer.tokens_per_s:,.1f} | {best.variant} | {best.prefill_tokens_per_s:,.1f} | "
                         f"{best.prefill_tokens_per_s / peer.tokens_per_s:.2f} |")
    return "\n".join(lines)


def _against_llama(args: argparse.Namespace, rows: Sequence[Row], suffix: str,
                   rate: Callable[[Row], float | None]) -> Iterator[tuple[int, str, Row, Row | None]]:
    """(threads, GGUF, llama.cpp's row ``llama.cpp-<GGUF><suffix>``, our variant of that format with the highest
    ``rate``, or ``None``) for each thread count and format llama.cpp ran, batch 1."""
    for threads in args.threads:
        for fmt, variants in llama_peer.FORMATS.items():
            peer = next((r for r in rows if r.batch == 1 and r.threads == threads and r.variant == f"llama.cpp-{fmt}{suffix}"), None)
            if peer is not None:
                ours = [r for r in rows if r.batch == 1 and r.threads == threads and r.variant in variants and rate(r)]
                yield threads, fmt, peer, max(ours, key=lambda r: rate(r) or 0.0, default=None)


def llama_table(args: argparse.Namespace, rows: Sequence[Row]) -> str:
    """Ours (the best variant of each format) against llama.cpp's rows timed in the same rounds, batch 1: a table."""
    if not any(r.variant.startswith("llama.cpp-") for r in rows):
        return LLAMA_SKIPPED
    bench = llama_peer.find_llama_bench(args.llama_bench)
    lines = [f"\nllama.cpp ({bench}), batch 1, --repack 0, one llama-bench run a round, in the rounds of ours; generation "
             f"alone on both sides: llama-bench's -n after -d {args.prompt} tokens in its cache, ours without the prefill "
             "(the tokens after the first over the time of the steps, the median prefill subtracted)",
             "| threads | GGUF | llama.cpp tok/s | ours, best variant | ours tok/s (decode only) | ratio of the medians | "
             "ours/llama.cpp per round: median (range) | target (on the rounds' median) |",
             "| ---: | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for threads, fmt, peer_row, best in _against_llama(args, rows, "", lambda r: r.decode_tokens_per_s):
        variants = llama_peer.FORMATS[fmt]
        want, peer_rate = llama_peer.TARGETS[fmt], peer_row.tokens_per_s
        if best is None:
            lines.append(f"| {threads} | {fmt} | {peer_rate:,.2f} | (not run: {', '.join(variants)}) | - | - | - | >= {want} |")
            continue
        rate = best.decode_tokens_per_s or 0.0
        of_medians = rate / peer_rate
        # Each round's ratio pairs runs seconds apart; the two medians can come from rounds minutes apart, on either side
        # of a change of the host's memory speed. The verdict reads the median of the rounds' ratios where there are any.
        paired = round_ratios(best.decode_rates, peer_row.rates)
        got = statistics.median(paired) if paired else of_medians
        verdict = "met" if got >= want else f"missed by {want - got:.2f} ({got / want:.0%} of it)"
        rounds = "-"
        if paired:
            rounds = f"{got:.2f} ({min(paired):.2f}-{max(paired):.2f})"
            verdict += f", {sum(r >= want for r in paired)} of {len(paired)} rounds"
        lines.append(f"| {threads} | {fmt} | {peer_rate:,.2f} | {best.variant} | {rate:,.2f} | {of_medians:.2f} | {rounds} | "
                     f">= {want}: {verdict} |")
    return "\n".join(lines)


def default_table(rows: Sequence[Row]) -> str:
    """The default load (``ours-FORMAT``, as ``aiayn.load`` decodes) against the best of our variants of its format
    timed in the same rounds (the issue's target: at most 5% slower), for each batch and thread count run: the median
    of the rounds' own ratios."""
    lines = ["\nthe default load against our best variant of its format (target: at most 5% slower; default/best: the median of the rounds' own ratios)",
             "| batch | threads | default | tok/s | best variant | tok/s | default/best | target |",
             "| ---: | ---: | --- | ---: | --- | ---: | ---: | --- |"]
    for default in (r for r in rows if r.variant in {v[0] for v in llama_peer.FORMATS.values()}):
        fmt = next(f for f, v in llama_peer.FORMATS.items() if v[0] == default.variant)
        same = [r for r in rows if (r.batch, r.threads) == (default.batch, default.threads)
                and (r.variant in llama_peer.FORMATS[fmt] or r.variant == f"{default.variant}-eager")]
        best = max(same, key=lambda r: r.tokens_per_s)
        got = paired_ratio(default.rates, best.rates)  # the two ran seconds apart in every round
        verdict = "met" if got >= 0.95 else f"missed: {1 - got:.0%} slower"
        lines.append(f"| {default.batch} | {default.threads} | {default.variant} | {default.tokens_per_s:,.2f} | {best.variant} | "
                     f"{best.tokens_per_s:,.2f} | {got:.2f} | {verdict} |")
    return "\n".join(lines)


def format_rows(rows: Sequence[Row], new_tokens: int) -> str:
    by_key = {(r.batch, r.threads, r.variant): r for r in rows}
    lines = [
        "| batch | threads | variant | tok/s (median) | vs hf-fp32 (rounds' median) | vs hf, same dtype | target | leading tokens = hf-fp32 | bandwidth bound tok/s "
        "| outside the weights, % of a token |",
        "| ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in (r for r in rows if not r.variant.endswith(PROMPT)):  # llama.cpp's prompt rates: prompt_table's
        base = by_key.get((r.batch, r.threads, "hf-fp32"))
        same_peer = by_key.get((r.batch, r.threads, "hf-bf16" if "bf16" in r.variant else "hf-fp32"))
        vs = f"{paired_ratio(r.rates, base.rates):.2f}" if base else "-"  # each round's own ratio
        vs_same = (f"{paired_ratio(r.rates, same_peer.rates):.2f}"
                   if same_peer and r.variant.startswith("ours") else "-")
        target = "-"
        if (r.variant, r.batch) in TARGETS:
            peer_name, want = TARGETS[(r.variant, r.batch)]
            peer = by_key.get((r.batch, r.threads, peer_name))
            if peer:
                got = paired_ratio(r.rates, peer.rates)
                target = f">= {want} x {peer_name}: " + ("met" if got >= want else f"missed by {want - got:.2f} ({got / want:.0%} of it)")
        bound = f"{r.bound_tokens_per_s:,.1f}" if r.bound_tokens_per_s else "-"
        agree = f"{r.agree}/{new_tokens}" if r.agree >= 0 else "-"
        outside = f"{r.outside:.0%}" if r.outside is not None else "-"
        lines.append(f"| {r.batch} | {r.threads} | {r.variant} | {r.tokens_per_s:,.2f} | {vs} | {vs_same} | {target} | {agree} | {bound} | {outside} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default: 1,8)")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default: 1,2)")
    p.add_argument("--prompt", type=int, default=16, help="prompt length (default: 16)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per row (default: 128)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, the median is reported (default: 3)")
    p.add_argument("--beam", choices=("yes", "no", "only"), default="yes", help="also time Marian-shaped beam search (default: yes)")
    p.add_argument("--beam-sentences", type=int, default=8, help="sources per beam-search call (default: 8)")
    p.add_argument("--beam-source-len", type=int, default=16, help="tokens per source (default: 16)")
    p.add_argument("--beam-new-tokens", type=int, default=32, help="tokens per hypothesis, EOS suppressed before (default: 32)")
    p.add_argument("--beam-unpacked", dest="beam_packed", action="store_false",
                   help="beam search with plain nn.Linear layers (MKL's sgemm) instead of load_pretrained's packed ones")
    p.add_argument("--profile", default="", help="comma-separated variants to profile (torch.profiler, one call each)")
    p.add_argument("--linears", action="store_true",
                   help="only time single Linear layers, 768 -> 3072 and 768 -> 50257, for 1 and 8 rows "
                        "(fp32, fp32 packed, bf16, bf16 packed, int8, int8-dynamic, int4)")
    p.add_argument("--token-chain", action="store_true",
                   help="only time one token's weight reads of the GPT-2-small shape (49 one-row calls in decoding order) "
                        "through each one-row kernel, fp32, bf16 and int8 weights")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 1 round, few tokens (a smoke test)")
    p.add_argument("--llama-cpp", choices=("auto", "no"), default="auto",
                   help="llama.cpp's llama-bench as the batch-1 peer when it is built (default: auto)")
    p.add_argument("--llama-bench", default=None, help="path of llama-bench (default: $PATH, then what llama_cpp.sh built)")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    args.profile = [v for v in args.profile.split(",") if v]
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
        args.threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        p.error(f"--batches and --threads take comma-separated integers, got {args.batches!r}, {args.threads!r}")
    if min(args.batches) < 1 or min(args.threads) < 1 or args.rounds < 1 or args.new_tokens < 1 or args.prompt < 1:
        p.error("--batches, --threads, --rounds, --new-tokens and --prompt must be >= 1")
    if args.quick:
        args.new_tokens, args.rounds, args.beam_new_tokens, args.beam_sentences = 8, 1, 4, 2
    return args


def main(argv: Sequence[str] | None = None) -> tuple[list[Row], list[tuple[int, float, float, bool]]]:
    args = parse_args(argv)
    threads_before = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace) -> tuple[list[Row], list[tuple[int, float, float, bool]]]:
    shape, sizes = (QUICK_GPT, QUICK_MARIAN) if args.quick else (GPT2, MARIAN)
    print(f"torch {torch.__version__}, {time.strftime('%a %b %d %Y %H:%M UTC', time.gmtime())}")
    print(f"CPU: {cpu_summary()}")
    if not native_bf16(torch.device("cpu")):
        print("NOTE: this CPU has no AMX or AVX512-BF16: its bf16 matmuls of several rows are a slow generic loop "
              "(one row is fast), so bf16 rows at batch > 1 measure that")
    rows: list[Row] = []
    if args.linears:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for out_features in (3072, 50257):
                for n_rows in (1, 8):
                    for name, (median, best) in few_row_linears(n_rows, out_features).items():
                        print(f"threads {threads}: Linear 768 -> {out_features}, {n_rows} row(s), {name}: median {median:.3f} ms, best {best:.3f} ms")
        return rows, []
    if args.token_chain:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for dtype, times in token_chain(shape).items():
                best = min(times.values())
                print(f"threads {threads}: one token's weight reads, {dtype}: "
                      + ", ".join(f"{name} {ms:.2f} ms ({best / ms:.2f})" for name, ms in sorted(times.items(), key=lambda kv: kv[1])))
        return rows, []
    if args.beam != "only":
        for threads in args.threads:
            torch.set_num_threads(threads)
            bandwidth = copy_bandwidth(16 if args.quick else 256)
            print(f"threads {threads}: copy bandwidth {bandwidth / 1e9:.1f} GB/s")
            for batch in args.batches:
                rows += bench_decoder_only(args, shape, batch, threads, bandwidth)
        print(f"\ndecoder-only, prompt {args.prompt}, {args.new_tokens} greedy tokens, median of {args.rounds} interleaved rounds")
        print(format_rows(rows, args.new_tokens))
        print("outside the weights: 1 - (the median step's time in the kernels that read the weights, torch.profiler's self "
              "time) / (the median step's wall time, unprofiled); 16 steps of each, alternating")
        print(default_table(rows))
        if args.llama_cpp == "auto" and 1 in args.batches:
            print(llama_table(args, rows))
            print(prompt_table(args, rows))
    beams = []
    if args.beam != "no":
        print(f"\nbeam 4, Marian shape ({sizes}), {args.beam_sentences} sources of {args.beam_source_len} tokens, {args.beam_new_tokens} tokens each")
        print("| threads | ours sent/s | hf sent/s | ours/hf | target >= 1.5 | same best hypotheses |")
        print("| ---: | ---: | ---: | ---: | --- | --- |")
        for threads in args.threads:
            ours, peer, same = bench_beam(args, sizes, threads)
            ratio = ours / peer
            verdict = "met" if ratio >= 1.5 else f"missed by {1.5 - ratio:.2f}"
            print(f"| {threads} | {ours:.3f} | {peer:.3f} | {ratio:.2f} | {verdict} | {same} |")
            beams.append((threads, ours, peer, same))
    return rows, beams


if __name__ == "__main__":
    main()
