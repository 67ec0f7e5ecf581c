"""Which kernel runs each Linear layer at inference, decided by timing the candidates on this machine.

For one row (batch-1 decoding), MKL's sgemm through ``F.linear``, oneDNN over a weight packed once, the
weight's rows split over torch's threads (:mod:`aiayn.inference.split_linear`) and, for fp32 and bf16, our own
matrix-vector product built on this machine (:mod:`aiayn.inference.gemv`), with and without prefetching the weights
ahead, trade places by CPU and shape:
oneDNN was 1.8x faster than MKL through GPT-2's output projection on an AVX2 AMD EPYC, MKL 1.36x faster for
768 -> 3072 on an AMX Xeon (issue 27). No rule read off the CPU's name picked the winner on both, so
:func:`choose_kernels` times them for each distinct shape, dtype and thread count, for one row and for
several (F.linear against oneDNN), keeps the fastest, and caches the answer per CPU (name, family, model,
stepping and kernel flags: two AMD EPYCs of different generations share a name), torch version and thread count
in ``$XDG_CACHE_HOME/aiayn/kernels.json`` (else ``~/.cache/aiayn/``), so a second load times nothing.

fp32 training asks the same question of a whole step's three products (:func:`choose_training_kernels`): MKL,
torch's fp32 default, ran at half oneDNN's speed on a Zen 5 EPYC (:mod:`aiayn.nn.onednn_linear`). bf16 training asks
whether a product's rows go in one call or two (:func:`choose_row_splits`): oneDNN ran some shapes at half speed on
1,024 rows on an AMX Xeon, and at full speed on 512.

Attention asks it of one query (a decoding step, :func:`choose_attention`): torch's fused kernel, the formula
(:mod:`aiayn.nn.attention`) or, where it builds, our own one-query kernel (:func:`aiayn.inference.gemv.attend_one`).
In bf16 on a Zen 5 EPYC the fused kernel took 1.7x the formula's time at 144 keys and 4x at 512; in fp32 it was the
faster. ``AIAYN_ATTENTION_KERNEL`` overrides: ``measure`` (the default), ``sdpa``, ``math`` or ``native``.

GPT-2's activation, GELU with tanh's approximation, and the training loss's cross-entropy ask it of torch's kernels and
ours (:func:`choose_native`): torch's GELU took 4.4x its exact GELU's time on an AMX Xeon, and its operators over chunks
of GPT-2's 50,257 logits a row 2.7x our kernel's time. ``AIAYN_ACTIVATION_KERNEL`` and ``AIAYN_LOSS_KERNEL`` override:
``measure``, ``torch`` or ``native``.

Where the weights lie asks it too (:func:`choose_huge_pages`), timed with each kernel that reads a weight where it
lies, the fastest on each kind of page: on transparent huge pages one token's weight reads ran 1.07-1.20x faster on an
AMX Xeon (:mod:`aiayn.inference.huge_pages`), and our kernel's one-row call 1.15-1.23x on a Zen 4 EPYC, where MKL's
alone (9-13 GB/s there, a third of what memory gives) showed 0.90-1.09x and had kept the weights off them. The kernels are then timed on
huge pages as well. ``AIAYN_HUGE_PAGES`` overrides: ``measure``, ``on`` or ``off``.

``AIAYN_LINEAR_KERNEL`` overrides: ``measure`` (the default), ``packed`` (oneDNN wherever it can pack; in
training, oneDNN), ``plain`` (``F.linear`` everywhere) or ``split`` (split for one row, ``F.linear`` for several;
in training, ``F.linear``); weight-only int8 and int4 layers take torch's kernel under each of them
(:func:`choose_int8_kernels`, :func:`choose_int4_kernels`).
None of them builds the native kernel.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.cpu import cpu_key
from aiayn.environment import env_choice, user_cache_dir
from aiayn.inference.gemv import DTYPES as GEMV_DTYPES
from aiayn.inference.gemv import FEW_ROWS, gemv_int4, gemv_int8, gemv_linear, unavailable_reason
from aiayn.inference.gemv import KERNELS as GEMV_KERNELS
from aiayn.inference.gemv import available as gemv_available
from aiayn.inference.huge_pages import ENV_VAR as HUGE_PAGES_ENV_VAR
from aiayn.inference.huge_pages import MODES as HUGE_PAGES_MODES
from aiayn.inference.huge_pages import huge_page_bytes, huge_page_copies
from aiayn.inference.huge_pages import unavailable_reason as huge_pages_reason
from aiayn.inference.int4 import KERNEL_N_MULTIPLE, dequantized_int4_mm
from aiayn.inference.precision import native_bf16
from aiayn.inference.quantization import PROMPT_KERNELS, dequantized_mm
from aiayn.inference.split_linear import split_linear, split_parts
from aiayn.untrusted import read_json_file

__all__ = [
    "ACTIVATION", "ACTIVATION_ENV_VAR", "ATTENTION", "ATTENTION_ENV_VAR", "CHOICES", "LOSS_ENV_VAR", "NORM_ENV_VAR", "NATIVE_OPS", "OPERATORS", "adopt_native", "attention_candidates", "choose_gelu_tanh", "choose_norm", "choose_native", "choose_huge_pages", "huge_page_kernels", "ENV_VAR", "WEIGHT_ONLY_KERNELS", "WEIGHT_ONLY_ONE_ROW", "KERNELS", "MANY_ROWS", "ONE_ROW", "TRAINING", "many_row_kernels",
    "ROW_SPLITS", "TRAINING_ATTENTION", "TRAINING_ATTENTION_ENV_VAR", "attention_mode", "choose_training_attention", "training_attention_candidates", "cache_path", "choose_attention", "choose_row_splits", "choose_int4_kernels", "choose_int8_kernels", "choose_kernels", "choose_model_attention",
    "cached_choices", "check_choice_record", "choices_made", "choose_training_kernels", "cpu_seconds", "pin_choices", "kernel_mode", "one_row_kernels", "machine_key", "remember_choices",
]

log = logging.getLogger(__name__)

ENV_VAR = "AIAYN_LINEAR_KERNEL"
ONE_ROW = ("plain", "packed", "split", *GEMV_KERNELS)  # the kernels for one row (native*: fp32 and bf16, where it builds)
# and for several rows (native*: up to gemv.FEW_ROWS rows, oneDNN's packed kernel for more)
MANY_ROWS = ("plain", "packed", *GEMV_KERNELS)
KERNELS = tuple(f"{one}/{many}" for one in ONE_ROW for many in MANY_ROWS)  # a choice: "<one row>/<several rows>"
OVERRIDES = {"packed": "packed/packed", "plain": "plain/plain", "split": "split/plain"}
CHOICES = ("measure", *OVERRIDES)
MARGIN = 0.97  # packed must be 3% faster to be kept: it holds a second copy of the weight


def kernel_mode() -> str:
    """``$AIAYN_LINEAR_KERNEL`` (default ``measure``); a ``ValueError`` naming it for another value."""
    return env_choice(ENV_VAR, CHOICES)


def cache_path() -> Path:
    return user_cache_dir() / "kernels.json"


def machine_key() -> str:
    """What a timing depends on besides the shape: the CPU (:func:`aiayn.cpu.cpu_key`: its name alone is shared by
    CPUs whose winners differ), torch's version and the thread count; "quiet" since choices timed under other work
    are no longer cached (the entries before, under the key without it, may hold such choices: they are timed again);
    "native" since our matrix-vector kernel is a candidate (choices made without it are timed again with it),
    "prefetch" since its prefetching variant is one too, "round mean" since a kernel's time is its mean call in a
    round (before, its fastest call), "bf16 pairs" since our kernel multiplies bf16 rows by bf16 weights with AVX512-BF16
    where the CPU has it (choices timed with the widening kernel are timed again)."""
    return (f"{cpu_key()} | torch {torch.__version__} | {torch.get_num_threads()} threads | quiet | native prefetch | round mean"
            " | bf16 pairs")


def choose_kernels(weights: list[Tensor], rows: int = 8) -> list[str]:
    """Which kernels run each ``weight (out, in)`` here, one of :data:`KERNELS` (``"<one row>/<several rows>"``):
    read from the cache, or timed once per distinct shape and dtype and cached (the cache is read once and
    written once per call).

    One row (one-token decoding) and ``rows`` rows (a batch, a prompt, speculative verification; an encoder's
    batch x tokens) are timed apart, since the winner can differ between the two (MKL fast for one row and
    many times slower for two, on some CPUs). The shapes timed now are logged in one INFO line. Only called for
    weights oneDNN can pack (see :func:`~aiayn.inference.precision.can_pack`)."""
    mode = kernel_mode()
    if mode != "measure":
        return [OVERRIDES[mode]] * len(weights)

    def timed(weight: Tensor) -> tuple[str, str]:
        return _one_and_many(weight, rows, one_row_kernels(weight.dtype), many_row_kernels(weight.dtype, rows))

    # A cached choice of the native kernel holds only where it still loads (and for fp32 and bf16): else timed again.
    native = gemv_available() if any(w.dtype in GEMV_DTYPES for w in weights) else False
    valid = KERNELS if native else tuple(k for k in KERNELS if not set(k.split("/")) & set(GEMV_KERNELS))
    # "ours to N": timed with our kernel for a few rows among the candidates (choices cached before were not)
    shapes = [f"{w.shape[1]}->{w.shape[0]} {str(w.dtype).removeprefix('torch.')} 1|{rows} rows, ours to {FEW_ROWS}"
              f"{PREFETCH_FIRST}{_pages()}" for w in weights]
    return _cached(shapes, weights, valid, timed, "Linear kernels")


def one_row_kernels(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels timed for one row of ``dtype``: :data:`ONE_ROW`, less the native ones for other dtypes than fp32
    and bf16 and where it does not build (:mod:`aiayn.inference.gemv`)."""
    native = dtype in GEMV_DTYPES and gemv_available()
    return ONE_ROW if native else tuple(name for name in ONE_ROW if name not in GEMV_KERNELS)


def many_row_kernels(dtype: torch.dtype, rows: int) -> tuple[str, ...]:
    """The kernels timed for ``rows`` rows of ``dtype``: :data:`MANY_ROWS`, less the native ones for other dtypes than
    fp32 and bf16, where it does not build, and for more rows than it takes (:data:`~aiayn.inference.gemv.FEW_ROWS`)."""
    native = dtype in GEMV_DTYPES and rows <= FEW_ROWS and gemv_available()
    return MANY_ROWS if native else tuple(name for name in MANY_ROWS if name not in GEMV_KERNELS)


# Weight-only int8 or int4, one row: torch's kernel (_weight_int8pack_mm, _weight_int4pack_mm_for_cpu), or our
# matrix-vector product
WEIGHT_ONLY_ONE_ROW = ("torch", *GEMV_KERNELS)
# A weight-only choice: "<one row>/<several rows>", each of WEIGHT_ONLY_ONE_ROW (several: up to gemv.FEW_ROWS through ours)
WEIGHT_ONLY_KERNELS = tuple(f"{one}/{many}" for one in WEIGHT_ONLY_ONE_ROW for many in WEIGHT_ONLY_ONE_ROW)


def choose_int8_kernels(weights: list[Tensor], rows: int = FEW_ROWS) -> list[str]:
    """The kernels of each weight-only int8 ``weight (out, in)`` here, one of :data:`WEIGHT_ONLY_KERNELS`: one row
    (one-token decoding) and ``rows`` rows (a small batch, speculative checks; a call of more than
    :data:`~aiayn.inference.gemv.FEW_ROWS` always takes torch's) timed apart once per shape and cached with the Linear
    kernels; any override but ``measure`` takes torch's, and so does a machine where the native kernel does not build."""
    shapes = [f"{w.shape[1]}->{w.shape[0]} int8 weight-only 1|{rows} rows{PREFETCH_FIRST}{OURS_FIRST}{_pages()}" for w in weights]
    return _weight_only(shapes, [(w, 0) for w in weights], rows, "int8 kernels")


def choose_int4_kernels(codes: list[Tensor], groups: list[int], rows: int = FEW_ROWS) -> list[str]:
    """:func:`choose_int8_kernels` for int4 layers: ``codes (out, in / 2)`` (uint8, two to a byte) in groups of
    ``groups[i]`` inputs, torch's int4 kernel against ours."""
    shapes = [f"{2 * c.shape[1]}->{c.shape[0]} int4 g{g} weight-only 1|{rows} rows{PREFETCH_FIRST}{OURS_FIRST}{INT4_KERNEL_REVISION}{_pages()}"
              for c, g in zip(codes, groups)]
    return _weight_only(shapes, list(zip(codes, groups)), rows, "int4 kernels")


def _weight_only(shapes: list[str], items: list[tuple[Tensor, int]], rows: int, what: str) -> list[str]:
    """The cached or timed choices of weight-only layers (``items``: a weight and its int4 group size, 0 for int8)."""
    if not items or kernel_mode() != "measure" or not gemv_available():
        return ["torch/torch"] * len(items)

    def timed(item: tuple[Tensor, int]) -> tuple[str, str]:
        return _one_and_many(item[0], rows, WEIGHT_ONLY_ONE_ROW, WEIGHT_ONLY_ONE_ROW, group=item[1])

    return _cached(shapes, items, WEIGHT_ONLY_KERNELS, timed, what)


def _one_and_many(weight: Tensor, rows: int, one_names: tuple[str, ...], many_names: tuple[str, ...], group: int = 0) -> tuple[str, str]:
    """The choice ``"<one row>/<rows rows>"`` for ``weight`` (int4 codes in groups of ``group``, else 0), each the
    fastest of its candidates (:func:`_fastest`), and the line that logs it with every kernel's time."""
    one, many = _time_kernels(weight, 1, one_names, group=group), _time_kernels(weight, rows, many_names, group=group)
    choice = f"{_fastest(one)}/{_fastest(many)}"
    return choice, (", ".join(f"{name} {one[name]:.3f}" for name in one_names) + " ms (1 row); "
                    + ", ".join(f"{name} {many[name]:.3f}" for name in many_names) + f" ms ({rows} rows) -> {choice}")


# Weight-only int8 or int4, a prompt's rows (more than gemv.FEW_ROWS): torch's kernel, or the weight widened to bf16
# and one oneDNN matmul (quantization.dequantized_mm, int4.dequantized_int4_mm) above the rows quantization.PROMPT_KERNELS
# names: timed at each row count of PROMPT_LADDER in turn until the widened weight wins, where bf16 matmuls are native
PROMPT_TIMED = ("torch", "dequant")
PROMPT_LADDER = ((64, "dequant"), (128, "dequant-mid"), (256, "dequant-long"))  # rows timed -> the choice where it wins


def choose_prompt_kernels(weights: list[Tensor], groups: list[int]) -> list[str]:
    """The kernel of a prompt's rows through each weight-only ``weight``: int8 ``(out, in)`` (group 0) or int4 codes
    ``(out, in / 2)`` in groups of ``groups[i]`` inputs; one of :data:`~aiayn.inference.quantization.PROMPT_KERNELS`,
    timed once per shape and cached with the other kernels, where this CPU multiplies bf16 natively: the first of
    :data:`PROMPT_LADDER` whose rows the widened weight is faster at, else ``torch`` (its threshold lies between that
    row count and the one before). Elsewhere torch's, untimed: there a bf16 matmul is a generic loop, about
    150x an fp32 one on an AVX2-only EPYC (``docs/benchmarks.md``). Any override but ``measure`` takes torch's."""
    if not weights or kernel_mode() != "measure" or not native_bf16(torch.device("cpu")):
        return ["torch"] * len(weights)
    ladder = "|".join(str(rows) for rows, _ in PROMPT_LADDER)
    shapes = [f"{2 * w.shape[1]}->{w.shape[0]} int4 g{g} weight-only prompt {ladder} rows{_pages()}" if g else
              f"{w.shape[1]}->{w.shape[0]} int8 weight-only prompt {ladder} rows{_pages()}" for w, g in zip(weights, groups)]

    def timed(item: tuple[Tensor, int]) -> tuple[str, str]:
        words = []
        for rows, name in PROMPT_LADDER:
            times = _time_kernels(item[0], rows, PROMPT_TIMED, rounds=3, group=item[1])
            words.append(", ".join(f"{kernel} {times[kernel]:.3f}" for kernel in PROMPT_TIMED) + f" ms ({rows} rows)")
            if times["dequant"] < times["torch"]:
                return name, "; ".join(words) + f" -> {name}"
        return "torch", "; ".join(words) + " -> torch"

    return _cached(shapes, list(zip(weights, groups)), tuple(PROMPT_KERNELS), timed, "prompt kernels")


TRAINING = ("plain", "onednn")  # fp32 training: MKL through F.linear and its autograd, or oneDNN (aiayn.nn.onednn_linear)
TRAINING_OVERRIDES = {"packed": "onednn", "plain": "plain", "split": "plain"}


def choose_training_kernels(weights: list[Tensor], rows: int) -> list[str]:
    """Which library multiplies each fp32 ``weight (out, in)`` in training here, one of :data:`TRAINING`: its
    forward and both backward products over ``rows`` rows timed once per shape by each (the fastest of three
    interleaved rounds), cached beside :func:`choose_kernels`' answers. ``$AIAYN_LINEAR_KERNEL=packed`` takes oneDNN
    everywhere, ``plain`` (or ``split``) MKL."""
    mode = kernel_mode()
    if mode != "measure":
        return [TRAINING_OVERRIDES[mode]] * len(weights)
    rows = max(1, min(rows, TRAINING_ROWS))

    def timed(weight: Tensor) -> tuple[str, str]:
        times = _time_training(weight, rows)
        choice = min(TRAINING, key=lambda name: times[name])
        return choice, ", ".join(f"{name} {times[name]:.3f}" for name in TRAINING) + f" ms (forward and backward) -> {choice}"

    shapes = [f"{w.shape[1]}->{w.shape[0]} {str(w.dtype).removeprefix('torch.')} train {rows} rows" for w in weights]
    return _cached(shapes, weights, TRAINING, timed, "fp32 training matmuls")


# bf16 training: each of a layer's three products in the layout timed fastest (aiayn.nn.onednn_linear.RowSplitLinear):
# the forward's rows in one call, in two, or over the weight's transpose written out; the input gradient's rows in one
# call or two; the weight gradient from transposed views, or with x's transpose written out. A choice names the parts
# that are not the first, joined by "+", or is "plain".
FORWARD_LAYOUTS = {"forward": "", "forward, two calls": "split-forward", "forward, weight transposed": "transposed-forward"}
INPUT_GRAD_LAYOUTS = {"input grad": "", "input grad, two calls": "split-input-grad"}
WEIGHT_GRAD_LAYOUTS = {"weight grad": "", "weight grad, input transposed": "transposed-weight-grad"}


def _layout_name(parts: Sequence[str]) -> str:
    """A bf16 training choice's name: its parts that are not the first layout of their product, joined by "+"."""
    return "+".join(p for p in parts if p) or "plain"


ROW_SPLITS = tuple(_layout_name(parts) for parts in itertools.product(
    FORWARD_LAYOUTS.values(), INPUT_GRAD_LAYOUTS.values(), WEIGHT_GRAD_LAYOUTS.values()))


def choose_row_splits(weights: list[Tensor], rows: int) -> list[str]:
    """Which of :data:`ROW_SPLITS` each ``weight (out, in)``'s bf16 training products take here: the forward (``rows``
    x ``in`` into ``out``), the input gradient (``rows`` x ``out`` into ``in``) and the weight gradient, each product's
    layouts timed at exactly ``rows`` rows (oneDNN's speed moves with the rows: splitting 1,024 doubled it on an AMX
    Xeon where splitting 2,048 halved it; with the shape: a written-out transpose doubled GPT-2's output projection's),
    the fastest of three interleaved rounds; cached beside the other choices. Transposes are candidates where our
    library built. ``$AIAYN_LINEAR_KERNEL`` other than ``measure``: ``plain`` everywhere."""
    if kernel_mode() != "measure":
        return ["plain"] * len(weights)

    def timed(weight: Tensor) -> tuple[str, str]:
        times = _time_row_splits(weight, rows)
        choice = _layout_name([layouts[min((name for name in layouts if name in times), key=times.__getitem__)]
                               for layouts in (FORWARD_LAYOUTS, INPUT_GRAD_LAYOUTS, WEIGHT_GRAD_LAYOUTS)])
        return choice, ", ".join(f"{name} {t:.3f}" for name, t in times.items()) + f" ms -> {choice}"

    shapes = [f"{w.shape[1]}->{w.shape[0]} bfloat16 train {rows} rows (product layouts)" for w in weights]
    return _cached(shapes, weights, ROW_SPLITS, timed, "bf16 training matmuls")


def _time_row_splits(weight: Tensor, rows: int, rounds: int = 3) -> dict[str, float]:
    """Milliseconds of ``weight``'s bf16 training products over ``rows`` rows in each layout of :data:`FORWARD_LAYOUTS`,
    :data:`INPUT_GRAD_LAYOUTS` and :data:`WEIGHT_GRAD_LAYOUTS` (the transposes only where our library built), each
    written-out transpose timed with its product."""
    from aiayn.nn.onednn_linear import forward_product, split_product, weight_grad_product

    w = weight.detach().to(torch.bfloat16)
    x = torch.randn(rows, w.shape[1], dtype=torch.bfloat16)
    grad = torch.randn(rows, w.shape[0], dtype=torch.bfloat16)
    runs: dict[str, Callable[[], object]] = {
        "forward": lambda: forward_product(x, w, None, False, False),
        "forward, two calls": lambda: forward_product(x, w, None, True, False),
        "input grad": lambda: split_product(grad, w, None, False),
        "input grad, two calls": lambda: split_product(grad, w, None, True),
        "weight grad": lambda: weight_grad_product(grad, x, False),
    }
    if gemv_available():
        runs["forward, weight transposed"] = lambda: forward_product(x, w, None, False, True)
        runs["weight grad, input transposed"] = lambda: weight_grad_product(grad, x, True)
    return _fastest_rounds(runs, rounds)


ATTENTION_ENV_VAR = "AIAYN_ATTENTION_KERNEL"
ATTENTION = ("sdpa", "math", "native")  # one query at inference: torch's fused kernel, the formula, or ours (where it builds)
ATTENTION_KEYS = (64, 256, 1024)  # the key lengths a one-query call is timed at, summed: long contexts weigh most


def attention_mode() -> str:
    """``$AIAYN_ATTENTION_KERNEL`` (default ``measure``); a ``ValueError`` naming it for another value, and for
    ``native`` where our kernel cannot run (saying why)."""
    return _native_mode(ATTENTION_ENV_VAR, ATTENTION, "one-query kernel")


def _native_mode(variable: str, kernels: tuple[str, ...], what: str) -> str:
    """``$variable``, ``measure`` or one of ``kernels`` (:func:`~aiayn.environment.env_choice`), refused with the reason
    where it names one of ours (``native``, ``native-...``) and our library cannot run here."""
    mode = env_choice(variable, ("measure", *kernels))
    if mode.startswith("native") and not gemv_available():
        others = ["measure", *(name for name in kernels if not name.startswith("native"))]
        raise ValueError(f"${variable}={mode}: our {what} cannot run here ({unavailable_reason()}); "
                         f"use {', '.join(others[:-1])} or {others[-1]}")
    return mode


def attention_candidates() -> tuple[str, ...]:
    """The backends of :data:`ATTENTION` that can run here: ``native`` only where our kernel built."""
    return ATTENTION if gemv_available() else tuple(name for name in ATTENTION if name != "native")


def choose_attention(shapes: list[tuple[torch.dtype, int, int]], queries: int = 1) -> list[str]:
    """Which backend of :data:`ATTENTION` attends one query (``queries`` 1) or a few causal ones (a speculative check,
    ``queries`` > 1) at inference for each ``(dtype, heads, head dim)``: read from the cache, or timed once (that many
    queries over each of :data:`ATTENTION_KEYS` keys, the fastest of five interleaved rounds, summed over the lengths)
    and cached beside the Linear choices."""
    mode = attention_mode()
    if mode != "measure":
        return [mode] * len(shapes)
    names = attention_candidates()
    what = "1 query" if queries == 1 else f"{queries} causal queries"

    def timed(shape: tuple[torch.dtype, int, int]) -> tuple[str, str]:
        times = _time_attention(*shape, names=names, queries=queries)
        choice = min(names, key=lambda name: times[name])
        keys = "+".join(str(n) for n in ATTENTION_KEYS)
        return choice, ", ".join(f"{name} {times[name]:.3f}" for name in names) + f" ms ({what} over {keys} keys) -> {choice}"

    # The candidates and the way of timing are in the key: a machine that timed two backends hot times them again;
    # "16-key sums": our kernel's scores summed 16 keys at a time since 2026-12-07 (choices timed before, again).
    shape_names = [f"attention {heads}x{dim} {str(dtype).removeprefix('torch.')} {what} ({'/'.join(names)}, cold, 16-key sums)"
                   for dtype, heads, dim in shapes]
    return _cached(shape_names, shapes, names, timed, f"attention of {what}", ATTENTION_ENV_VAR)


TRAINING_ATTENTION_ENV_VAR = "AIAYN_TRAINING_ATTENTION"
# training attention: the kernel aiayn.nn.attention's rule names, ours by our loops, or ours by oneDNN's small-matrix kernel
TRAINING_ATTENTION = ("rule", "native", "native-tiles")
_TRAINING_CHOSEN: dict[tuple[torch.dtype, tuple[int, ...], bool, str], str] = {}  # this process's answers


def training_attention_candidates(dtype: torch.dtype) -> tuple[str, ...]:
    """Our training kernels that take ``dtype`` here, where the library loaded: ``native``, and ``native-tiles`` (for bf16
    only where torch's small-matrix kernel takes packed bf16 operands: :func:`~aiayn.inference.gemv.tiles_available`)."""
    from aiayn.inference.gemv import tiles_available

    if not gemv_available():
        return ()
    return ("native",) if dtype == torch.bfloat16 and not tiles_available() else ("native", "native-tiles")


def choose_training_attention(dtype: torch.dtype, shape: tuple[int, ...], causal: bool, rule: str) -> str:
    """Which kernel computes a training call of self-attention at queries of ``shape`` (B, H, T, D), keys as many and
    ``causal``, forward and backward: ``rule`` (the backend ``aiayn.nn.attention``'s rule names: ``sdpa`` or ``math``),
    ``native`` (``aiayn/inference/attention_train.cpp``) or ``native-tiles`` (``attention_tiles.cpp``), whichever was
    timed fastest: read from this process's answers or the cache, or timed once (the fastest of nine interleaved rounds)
    and cached. ``$AIAYN_TRAINING_ATTENTION``: ``measure`` (the default), ``rule`` (never ours), ``native`` or
    ``native-tiles`` (refused where it cannot run)."""
    key = (dtype, shape, causal, rule)
    if key in _TRAINING_CHOSEN:
        return _TRAINING_CHOSEN[key]
    mode = _native_mode(TRAINING_ATTENTION_ENV_VAR, TRAINING_ATTENTION, "training attention kernel")
    ours = training_attention_candidates(dtype)
    if mode == "native-tiles" and dtype == torch.bfloat16 and "native-tiles" not in ours:
        raise ValueError(f"${TRAINING_ATTENTION_ENV_VAR}=native-tiles: torch cannot pack bf16 operands for its small-matrix "
                         "kernel on this CPU; use measure, rule or native")
    if mode != "measure" or not ours:
        choice = rule if mode == "rule" or not ours else mode
    else:
        names = (rule, *ours)

        def timed(item: tuple[torch.dtype, tuple[int, ...], bool, str]) -> tuple[str, str]:
            times = _time_training_attention(*item, names=ours)
            best = min(names, key=lambda name: times[name])
            return best, ", ".join(f"{name} {times[name]:.3f}" for name in names) + f" ms (forward and backward) -> {best}"

        # "8-row blocks": our loops' products 8 rows at a time, their softmax tails masked, since 2026-12-07 (timed again)
        name = (f"training attention {'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')}{' causal' if causal else ''} "
                f"({'/'.join(names)}, 8-row blocks)")
        (choice,) = _cached([name], [key], names, timed, "training attention", TRAINING_ATTENTION_ENV_VAR)
    _TRAINING_CHOSEN[key] = choice
    return choice


def _time_training_attention(dtype: torch.dtype, shape: tuple[int, ...], causal: bool, rule: str,
                             rounds: int = 9, names: tuple[str, ...] = ("native",)) -> dict[str, float]:
    """Milliseconds of self-attention's forward and backward at queries, keys and values of ``shape`` by ``rule``'s
    backend and by each of our kernels in ``names``: the fastest of ``rounds`` interleaved rounds, after a warm-up round (nine: at nanoGPT's
    shape the two differ by a tenth of a millisecond)."""
    import math

    from aiayn.nn.attention import NativeAttention, scaled_dot_product_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(shape, generator=generator).to(dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    scale = 1.0 / math.sqrt(shape[-1])
    runs: dict[str, Callable[[], object]] = {
        rule: lambda: torch.autograd.grad(scaled_dot_product_attention(q, k, v, causal=causal, backend=rule)[0], (q, k, v), grad),
    }
    for name in names:  # ours: in fp32 arithmetic, or on matrix tiles
        runs[name] = functools.partial(lambda tiles: torch.autograd.grad(NativeAttention.apply(q, k, v, causal and shape[2] > 1, scale, tiles),
                                                                          (q, k, v), grad), name == "native-tiles")
    return _fastest_rounds(runs, rounds)


def choose_model_attention(model: nn.Module) -> dict[tuple[torch.dtype, int, int], str]:
    """Time (or read) the backend of one query and, for a model that decodes over a cache, of a check's few for each
    attention shape of ``model`` at its dtype, and register them in :data:`aiayn.nn.attention.ONE_QUERY` and
    :data:`~aiayn.nn.attention.FEW_QUERY`, where the ``auto`` backend reads them; returns the one-query choices. A model
    on another device than the CPU registers nothing."""
    from aiayn.nn import attention
    from aiayn.nn.multihead import MultiHeadAttention

    floats = [p for p in model.parameters() if p.is_floating_point()]
    if not floats or floats[0].device.type != "cpu":
        return {}
    dtype = floats[0].dtype  # the activations' (int8 and int4 layers keep float embeddings and norms)
    shapes = sorted({(dtype, m.n_heads, m.head_dim) for m in model.modules() if isinstance(m, MultiHeadAttention)}, key=str)
    chosen = dict(zip(shapes, choose_attention(shapes)))
    attention.ONE_QUERY.update(chosen)
    if hasattr(model, "new_cache"):  # a model that decodes over a cache: speculative checks may run (an encoder's never do)
        attention.FEW_QUERY.update(zip(shapes, choose_attention(shapes, queries=attention.FEW_QUERIES)))
    return chosen


def _time_attention(dtype: torch.dtype, heads: int, head_dim: int, rounds: int = 5,
                    names: tuple[str, ...] = ATTENTION, queries: int = 1) -> dict[str, float]:
    """Milliseconds of one query (or of ``queries`` causal ones) through each backend of ``names``, summed over
    :data:`ATTENTION_KEYS` keys: at each
    length the mean call of a round, one call on each of several copies of the keys and values (together larger than
    the last-level cache, as in decoding, where a layer's weights evict its cache between steps: timed hot, torch's
    fused bf16 kernel beat ours from 256 keys on an AMX Xeon, timed cold it lost at every length, as in the decoding
    step; 2026-12-05), in the fastest of ``rounds`` interleaved rounds, after a warm-up call."""
    from aiayn.nn.attention import scaled_dot_product_attention

    total = dict.fromkeys(names, 0.0)
    with torch.no_grad():
        for length in ATTENTION_KEYS:
            q = torch.randn(1, heads, queries, head_dim).to(dtype)
            copies = [(torch.randn(1, heads, length, head_dim).to(dtype), torch.randn(1, heads, length, head_dim).to(dtype))
                      for _ in range(_cold_copies(2 * heads * length * head_dim * q.element_size()))]

            def attend(name: str, q: Tensor = q, copies: list[tuple[Tensor, Tensor]] = copies) -> Callable[[], None]:
                def run() -> None:
                    for k, v in copies:
                        scaled_dot_product_attention(q, k, v, causal=queries > 1, backend=name)
                return run

            best = _fastest_rounds({name: attend(name) for name in names}, rounds, per=len(copies))
            for name in names:
                total[name] += best[name]
    return total


_HUGE_PAGES_CHOSEN: list[bool] = []  # this process's answer, once


def _pages() -> str:
    """What an inference kernel's cached choice adds to its shape: the weights' pages where they are huge."""
    return ", huge pages" if choose_huge_pages() else ""


def choose_huge_pages() -> bool:
    """Whether a loaded model's weights go on transparent huge pages here (:mod:`aiayn.inference.huge_pages`): never
    where the system has none; else read from the cache, or timed once (one row through cold copies of a GPT-2 768 ->
    3072 fp32 weight, on 4 KiB pages and on huge pages, the fastest of five interleaved rounds; huge pages kept where
    they are 2% faster) and cached beside the kernel choices. ``$AIAYN_HUGE_PAGES``: ``measure`` (the default), ``on``
    (refused where the system has none) or ``off``."""
    if _HUGE_PAGES_CHOSEN:
        return _HUGE_PAGES_CHOSEN[0]
    mode, reason = env_choice(HUGE_PAGES_ENV_VAR, HUGE_PAGES_MODES), huge_pages_reason()
    if mode == "on" and reason is not None:
        raise ValueError(f"${HUGE_PAGES_ENV_VAR}=on: {reason}; use measure or off")
    if mode != "measure" or reason is not None:
        chosen = mode == "on"
    else:
        def timed(_: None) -> tuple[str, str]:
            times = _time_huge_pages()
            if times is None:
                raise _NoHugePages
            choice = "on" if times["huge pages"] < HUGE_PAGE_MARGIN * times["4 KiB pages"] else "off"
            return choice, ", ".join(f"{name} {t:.3f}" for name, t in times.items()) + f" ms (one row, 768 -> 3072 fp32; the fastest kernel on each) -> {choice}"

        try:
            (answer,) = _cached([HUGE_PAGES_SHAPE], [None], ("on", "off"), timed, "weight placement", HUGE_PAGES_ENV_VAR)
            chosen = answer == "on"
        except _NoHugePages:
            log.info("weight placement: the system gave the timing no huge pages now (memory fragmented?): the weights stay on 4 KiB "
                     "pages, timed again at the next load ($%s overrides)", HUGE_PAGES_ENV_VAR)
            chosen = False
    _HUGE_PAGES_CHOSEN.append(chosen)
    return chosen


HUGE_PAGE_MARGIN = 0.98  # huge pages must be 2% faster to be kept: they round each model up to 2 MiB
# the choice's name in the cache (choices cached under the old name, timed with MKL alone, are timed again once)
HUGE_PAGES_SHAPE = "weights on huge pages (one row, 768->3072 float32, cold, fastest kernel)"


class _NoHugePages(Exception):
    """The system gave the timing's copies no huge pages: nothing to compare, nothing to cache."""


def huge_page_kernels() -> tuple[str, ...]:
    """The one-row kernels the placement is timed with: those that read the weight where it lies (MKL through
    ``F.linear``, and ours where it builds; oneDNN's packed copy and the split weight are copies of their own)."""
    return tuple(name for name in one_row_kernels(torch.float32) if name not in ("packed", "split"))


def _time_huge_pages(rounds: int = 5) -> dict[str, float] | None:
    """Milliseconds of one row through a 768 -> 3072 fp32 weight, its copies (together past the last-level cache) on
    4 KiB pages and on huge pages, by each of :func:`huge_page_kernels`: the mean call of the fastest of ``rounds``
    interleaved rounds, for each placement its fastest kernel's (``"4 KiB pages"``, ``"huge pages"``), then each
    kernel's (``"<placement>, <kernel>"``). Timed with the kernels a load chooses from, not MKL's alone: at 9-13 GB/s
    (Zen 4 EPYC, 2026-12-06) MKL hid what huge pages give our kernel, which streams at two to three times that. ``None`` where the
    system gave the copies no huge pages (:func:`~aiayn.inference.huge_pages.huge_page_bytes`)."""
    w = torch.randn(3072, 768)
    copies = _cold_copies(w.numel() * w.element_size())
    small = [w.clone() for _ in range(copies)]
    huge = huge_page_copies(small)
    if huge_page_bytes(huge[0]) == 0:
        return None
    x = torch.randn(1, 768)

    runs: dict[str, Callable[[], object]] = {f"{where}, {kernel}": _on_every_copy(kernel, weights, x) for kernel in huge_page_kernels()
                                             for where, weights in (("4 KiB pages", small), ("huge pages", huge))}
    with torch.no_grad():
        times = _fastest_rounds(runs, rounds, per=copies)
    best = {where: min(t for name, t in times.items() if name.startswith(where + ",")) for where in ("4 KiB pages", "huge pages")}
    return best | times


ACTIVATION_ENV_VAR = "AIAYN_ACTIVATION_KERNEL"
LOSS_ENV_VAR = "AIAYN_LOSS_KERNEL"
NORM_ENV_VAR = "AIAYN_NORM_KERNEL"
DROPOUT_ENV_VAR = "AIAYN_DROPOUT_KERNEL"
NATIVE_OPS = ("torch", "native")  # each operator below: torch's kernels, or ours (aiayn.inference.gemv)
ACTIVATION = NATIVE_OPS  # GPT-2's tanh-approximated GELU (aiayn.inference.gemv.gelu_tanh)
ACTIVATION_ELEMENTS = 1 << 20  # elements the activation is timed on: a (1024, 1024) block of a batch's hidden units
LOSS_ROWS, LOSS_VOCAB = 32, 32768  # the cross-entropy is timed on 2^20 logits: rows of a large vocabulary, as GPT-2's
NORM_ROWS, NORM_WIDTH = 4, 768  # the inference norms are timed on a few rows of GPT-2 small's width, as decoding calls them


class NativeOp(NamedTuple):
    """One operator that our library may compute in place of torch's: its override variable, its name in words and in
    the cache, and what times the two (milliseconds by kernel, for a dtype)."""

    env: str
    what: str
    timer: str  # the name of this module's timing function (looked up at the call: tests replace it)
    timed: str = "forward and backward"  # what the timer times, in words


OPERATORS = {
    "gelu_tanh": NativeOp(ACTIVATION_ENV_VAR, "GELU kernel", "_time_gelu_tanh"),
    "cross_entropy": NativeOp(LOSS_ENV_VAR, "cross-entropy kernel", "_time_cross_entropy"),
    "norm": NativeOp(NORM_ENV_VAR, "norm kernel", "_time_norm", "LayerNorm and RMSNorm forwards, inference only"),
    "dropout": NativeOp(DROPOUT_ENV_VAR, "dropout kernel", "_time_dropout"),
}
_NATIVE_CHOSEN: dict[tuple[str, torch.dtype], str] = {}  # this process's answers, so that a forward reads a dict


def choose_native(op: str, dtype: torch.dtype) -> str:
    """Which of :data:`NATIVE_OPS` computes operator ``op`` (one of :data:`OPERATORS`) and its gradient in ``dtype`` here:
    ``torch`` without our native library; else read from the cache or timed once (forward and backward, the fastest
    of five interleaved rounds) and cached beside the other choices. The operator's variable (``$AIAYN_ACTIVATION_KERNEL``
    for GPT-2's GELU, ``$AIAYN_LOSS_KERNEL`` for the cross-entropy): ``measure`` (the default), ``torch`` or ``native``."""
    if (op, dtype) in _NATIVE_CHOSEN:
        return _NATIVE_CHOSEN[op, dtype]
    spec = OPERATORS[op]
    mode = _native_mode(spec.env, NATIVE_OPS, spec.what)
    if mode != "measure" or not gemv_available():
        choice = "torch" if mode == "measure" else mode
    else:
        def timed(dt: torch.dtype) -> tuple[str, str]:
            times = globals()[spec.timer](dt)
            best = min(NATIVE_OPS, key=lambda name: times[name])
            return best, ", ".join(f"{name} {times[name]:.3f}" for name in NATIVE_OPS) + f" ms ({spec.timed}) -> {best}"

        (choice,) = _cached([f"{op} {str(dtype).removeprefix('torch.')} ({'/'.join(NATIVE_OPS)})"], [dtype], NATIVE_OPS, timed,
                            spec.what, spec.env)
    _NATIVE_CHOSEN[op, dtype] = choice
    return choice


def adopt_native(op: str, dtype: torch.dtype, choice: str) -> None:
    """Take ``choice`` (one of :data:`NATIVE_OPS`, made elsewhere: distributed training's rank 0) for operator ``op`` in
    ``dtype`` in this process, without timing; ``native`` loads our library here first (torch's where it cannot)."""
    if choice not in NATIVE_OPS:
        raise ValueError(f"choice must be one of {', '.join(NATIVE_OPS)}, got {choice!r}")
    _NATIVE_CHOSEN[op, dtype] = choice if choice == "torch" or gemv_available() else "torch"


def choose_gelu_tanh(dtype: torch.dtype) -> str:
    """:func:`choose_native` for GPT-2's GELU: torch's took 4.4x its exact GELU's time on an AMX Xeon."""
    return choose_native("gelu_tanh", dtype)


def choose_norm(dtype: torch.dtype) -> str:
    """:func:`choose_native` for inference's LayerNorm and RMSNorm (:func:`aiayn.nn.norm.use_native_norms`): torch's
    composite RMSNorm took 38 us a call in decoding a small model on a Zen 4 EPYC, 45% of its step."""
    return choose_native("norm", dtype)


def choose_dropout(dtype: torch.dtype) -> str:
    """:func:`choose_native` for training's dropout (:func:`aiayn.nn.dropout.dropout`): torch's CPU dropout took 6 ms a
    million elements on a Zen 4 EPYC, 15% of the Multi30k speedrun's step."""
    return choose_native("dropout", dtype)


def _time_dropout(dtype: torch.dtype, rounds: int = 5) -> dict[str, float]:
    """Milliseconds of dropout (p = 0.1) over :data:`ACTIVATION_ELEMENTS` elements, forward and backward, by each of
    :data:`NATIVE_OPS`: the fastest of ``rounds`` interleaved rounds, after a warm-up call."""
    from aiayn.inference.gemv import dropout

    x = torch.randn(ACTIVATION_ELEMENTS).to(dtype)
    grad = torch.randn(ACTIVATION_ELEMENTS).to(dtype)

    def torch_dropout() -> None:
        _, mask = torch.native_dropout(x, 0.1, True)
        torch.ops.aten.native_dropout_backward(grad, mask, 1 / 0.9)

    runs: dict[str, Callable[[], object]] = {"torch": torch_dropout, "native": lambda: (dropout(x, 0.1, 1), dropout(grad, 0.1, 1))}
    with torch.no_grad():
        return _fastest_rounds(runs, rounds)


def _time_norm(dtype: torch.dtype, rounds: int = 5) -> dict[str, float]:
    """Milliseconds of a LayerNorm and an RMSNorm of :data:`NORM_ROWS` rows of :data:`NORM_WIDTH` by each of
    :data:`NATIVE_OPS` (a call is mostly its overhead at these sizes, as in decoding): the fastest of ``rounds``
    interleaved rounds of 64 calls each, after a warm-up round."""
    from aiayn.inference.gemv import norm

    x = torch.randn(NORM_ROWS, NORM_WIDTH).to(dtype)
    weight, bias = torch.randn(NORM_WIDTH).to(dtype), torch.randn(NORM_WIDTH).to(dtype)
    calls = 64

    def torch_norms() -> None:
        for _ in range(calls):
            F.layer_norm(x, (NORM_WIDTH,), weight, bias, 1e-5)
            F.rms_norm(x, (NORM_WIDTH,), weight, 1e-5)

    def native_norms() -> None:
        for _ in range(calls):
            norm(x, weight, bias, 1e-5, False)
            norm(x, weight, None, 1e-5, True)

    with torch.no_grad():
        return _fastest_rounds({"torch": torch_norms, "native": native_norms}, rounds, per=calls)


def _time_gelu_tanh(dtype: torch.dtype, rounds: int = 5) -> dict[str, float]:
    """Milliseconds of the tanh-approximated GELU's forward and backward over :data:`ACTIVATION_ELEMENTS` elements by
    each of :data:`NATIVE_OPS`: the fastest of ``rounds`` interleaved rounds, after a warm-up call."""
    from aiayn.inference.gemv import gelu_tanh, gelu_tanh_backward

    x = torch.randn(ACTIVATION_ELEMENTS).to(dtype)
    grad = torch.randn(ACTIVATION_ELEMENTS).to(dtype)
    runs: dict[str, Callable[[], object]] = {
        "torch": lambda: (F.gelu(x, approximate="tanh"), torch.ops.aten.gelu_backward(grad, x, approximate="tanh")),
        "native": lambda: (gelu_tanh(x), gelu_tanh_backward(grad, x)),
    }
    return _fastest_rounds(runs, rounds)


def _time_cross_entropy(dtype: torch.dtype, rounds: int = 5) -> dict[str, float]:
    """Milliseconds of the training loss's forward and backward (:class:`aiayn.training.losses.ChunkedCrossEntropy`) over
    :data:`LOSS_ROWS` rows of :data:`LOSS_VOCAB` logits, by torch's operators a chunk at a time and by our kernel: the
    fastest of ``rounds`` interleaved rounds, after a warm-up call."""
    from aiayn.training.losses import cross_entropy_by

    x = torch.randn(LOSS_ROWS, LOSS_VOCAB, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
    targets = torch.randint(LOSS_VOCAB, (LOSS_ROWS,), generator=torch.Generator().manual_seed(1))
    def run(kernel: str) -> Callable[[], object]:
        return lambda: torch.autograd.grad(cross_entropy_by(kernel, x, targets, -100, 0.1), x)

    return _fastest_rounds({name: run(name) for name in NATIVE_OPS}, rounds)


def _fastest_rounds(runs: dict[str, Callable[[], object]], rounds: int, *, per: int = 1,
                    after: Callable[[], None] | None = None) -> dict[str, float]:
    """Milliseconds of each of ``runs``, one call of it divided by ``per`` (the calls it makes inside): the fastest of
    ``rounds`` interleaved rounds, each run first in turn, after a warm-up round (another process taking the core only
    ever adds time). ``after`` runs untimed after each call."""
    names = tuple(runs)
    best = dict.fromkeys(names, float("inf"))
    for r in range(rounds + 1):  # round 0 warms up
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            runs[name]()
            elapsed = (time.perf_counter() - start) * 1e3 / per
            if r:
                best[name] = min(best[name], elapsed)
            if after is not None:
                after()
    return best


Item = TypeVar("Item")


def _cached(shapes: list[str], items: Sequence[Item], valid: tuple[str, ...], timed: Callable[[Item], tuple[str, str]],
            what: str, env: str = ENV_VAR) -> list[str]:
    """The choice for each of ``shapes`` (one of ``valid``): pinned (:func:`pin_choices`), else from the cache, else
    ``timed(item)`` -> (choice, the timings in words), each distinct shape once; new choices logged in one INFO line
    (naming ``env``, the override) and written back. Every answer is kept for :func:`choices_made`."""
    known = cached_choices(valid)
    pinned = {shape: choice for shape, choice in _PINNED.items() if choice in valid}
    lines: list[str] = []
    start = cpu_seconds()
    for shape, item in zip(shapes, items):
        if shape not in known and shape not in pinned:
            known[shape], words = timed(item)
            lines.append(f"{shape}: {words}")
    remember_choices(known, lines, start, what, env)
    chosen = [pinned[shape] if shape in pinned else known[shape] for shape in shapes]
    _MADE.update(zip(shapes, chosen))
    return chosen


# Every choice this process made or read (:func:`_cached`), by its cache name; and those a resumed training run took
# from its checkpoint (:func:`pin_choices`), obeyed over the cache and timing.
_MADE: dict[str, str] = {}
_PINNED: dict[str, str] = {}


def choices_made() -> dict[str, Any]:
    """The kernel choices this process made, for a checkpoint (``{"machine": machine_key(), "choices": {name: choice}}``):
    a resumed run takes them back (:func:`pin_choices`), so that it computes with the kernels the run began with. Timed
    again in the new process they could differ (a choice timed while other work ran is not cached), and two kernels
    sum in different orders: the resumed run would not be the uninterrupted one bit for bit."""
    return {"machine": machine_key(), "choices": dict(sorted(_MADE.items()))}


def check_choice_record(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it has :func:`choices_made`'s form, else ``ValueError`` naming ``where``."""
    if not (isinstance(record, dict) and isinstance(record.get("machine"), str) and isinstance(record.get("choices"), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in record["choices"].items())):
        raise ValueError(f"{where}: kernels must be {{'machine': str, 'choices': {{name: kernel}}}}, got {record!r}")
    return record


def pin_choices(record: Any, where: str = "the checkpoint") -> bool:
    """Obey ``record`` (a :func:`choices_made` result) over the cache and timing in this process, in place of what was
    pinned before, where it was made on this machine (:func:`machine_key`); elsewhere the kernels are this machine's
    own, with a warning (a run resumed on another CPU is not bit for bit anyway). ``None`` unpins (a run that does not
    resume). Returns whether ``record`` was taken. ``ValueError`` for a record of another form."""
    _PINNED.clear()
    if record is None:
        return False
    check_choice_record(record, where)
    if record["machine"] != machine_key():
        log.warning("%s chose its kernels on another machine (%s); this one (%s) chooses its own: the resumed run is not "
                    "bit for bit with an uninterrupted one", where, record["machine"], machine_key())
        return False
    _PINNED.update(record["choices"])
    _NATIVE_CHOSEN.clear()  # this process's answers so far give way to the record's
    _TRAINING_CHOSEN.clear()
    if record["choices"]:
        log.info("kernels as %s chose them: %s", where, "; ".join(f"{k}: {v}" for k, v in record["choices"].items()))
    return True


def cached_choices(valid: tuple[str, ...]) -> dict[str, str]:
    """This machine's cached choices (:func:`machine_key`) that name one of ``valid``, by shape."""
    return {shape: str(choice) for shape, choice in _read(cache_path()).get(machine_key(), {}).items() if choice in valid}


def remember_choices(known: dict[str, str], lines: list[str], start: tuple[float, float, float] | None, what: str,
                     env: str) -> None:
    """Cache ``known`` (shape -> choice) for this machine, with ``lines`` (the timings in words, one per new choice,
    made since ``start``, a :func:`cpu_seconds` reading) logged in one INFO line naming ``env``, the override; not
    cached, with a warning, when other work took more than :data:`BUSY_SHARE` of a core meanwhile."""
    if not lines:
        return
    path, key = cache_path(), machine_key()
    others = _others_share(start, cpu_seconds())
    if others > BUSY_SHARE:  # a kernel of several threads loses to one of one thread when a core is taken
        log.warning("%s timed while other work took %.0f%% of a core (%s): used now, not cached, timed again at the next "
                    "load: %s", what, 100 * others, key, "; ".join(lines))
        return
    log.info("%s timed on this machine (%s), cached in %s ($%s overrides): %s", what, key, path, env, "; ".join(lines))
    table = _read(path)  # another process may have written meanwhile
    table[key] = {**table.get(key, {}), **known}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(table, indent=1, sort_keys=True).encode())
    except OSError as err:  # a read-only home: choose again next time
        log.warning("could not cache the kernel choice in %s: %s", path, err)


BUSY_SHARE = 0.1  # other work above a tenth of a core during the timings: the machine was not quiet


def cpu_seconds() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds of every process and of the hypervisor's steal, this process's CPU seconds) now,
    from ``/proc/stat``; ``None`` where there is none (not Linux)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait: user, nice, system, irq, softirq, steal
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), time.process_time()


def _others_share(start: tuple[float, float, float] | None, end: tuple[float, float, float] | None) -> float:
    """The cores' worth of CPU time that other processes (or the hypervisor) took between ``start`` and ``end``,
    less a tick of ``/proc/stat``'s granularity per core; 0.0 without ``/proc/stat``."""
    if start is None or end is None or end[0] <= start[0]:
        return 0.0
    wall, busy, own = (b - a for a, b in zip(start, end))
    tick = (os.cpu_count() or 1) / os.sysconf("SC_CLK_TCK")
    return max(0.0, busy - own - tick) / wall


def _fastest(times: dict[str, float]) -> str:
    """The kernel of least time, oneDNN's counted :data:`MARGIN` slower (it costs a second copy of the weight), ours
    without prefetching too where ours with it was timed (:data:`PREFETCH_FIRST`), and torch's weight-only int8 and
    int4 kernels where ours was timed (:data:`OURS_FIRST`)."""
    def counted(name: str) -> float:
        slower = name == "packed" or (name in ("native", "torch") and "native-prefetch" in times)
        return times[name] / (MARGIN if slower else 1.0)
    return min(times, key=counted)


# Ours without prefetching is kept only where timed 3% faster than with it. One weight timed alone, the two are within
# the host's noise of each other (on a Zen 4 EPYC the ratio of the two ranged 0.81-1.14 from one timing to the next), where a token's
# weight reads in decoding order ran as fast or faster with prefetching on both CPUs measured (`python
# benchmarks/generation.py --token-chain`: AMX Xeon fp32 1.12-1.13x, bf16 1.29x, int8 1.63-1.76x; Zen 4 EPYC fp32
# 0.99-1.00x, bf16 1.16-1.22x, int8 1.12-1.17x; docs/benchmarks.md). In the cache keys, so choices made before are timed again.
PREFETCH_FIRST = ", prefetch first"
# Likewise torch's weight-only kernels against ours: kept only where timed 3% faster. One int4 weight timed alone, the
# two were within the host's noise for GPT-2's 768 -> 768 (torch's 21-39 us a call, ours 20-33 us), where a token's
# weight reads in decoding order ran 1.09-1.22x faster through ours (`--token-chain`, Zen 4 EPYC, 2026-12-06; int8:
# ours 1.9-2.1x) and torch's int4 kernel took about twice its timed time a call inside a decoding step (torch.profiler,
# `--profile ours-int4`: the step's 768 -> 768 calls, about 40 us each).
OURS_FIRST = ", ours first"
# What changed in our int4 kernel's speed, in the int4 keys, so the choices made before are timed again: it quantises
# each row of inputs to 8 bits by vectors since 2026-12-07 (a scalar loop before, a tenth of the speed: 3 us of a
# 768-input row, paid once a row of x, so 8 rows cost ours 24 us more than they do now), and makes each group's step in
# registers since 2026-12-07 (768 -> 3072, one row on one thread, 0.095 -> 0.078 ms in `--linears`: gemv_int4.h).
INT4_KERNEL_REVISION = ", vector inputs, steps in registers"


def _read(path: Path) -> dict:
    """The cache, or ``{}`` when absent; a corrupt one (or one over 1 MiB) is ignored with a warning (and rewritten)."""
    if not path.exists():
        return {}
    try:
        table = read_json_file(path, what="kernel-choice cache", max_bytes=1 << 20, expect=dict)
        if not all(isinstance(v, dict) for v in table.values()):
            raise ValueError("not an object of objects")
        return table
    except (OSError, ValueError) as err:
        log.warning("ignoring the corrupt kernel-choice cache %s (%s); it will be rebuilt", path, err)
        return {}


COLD_BYTES = 96 << 20  # more than a server CPU's last-level cache (32 MiB on the EPYC here): each call reads from memory
MAX_COPIES = 64


def _cold_copies(size: int) -> int:
    """How many copies of ``size`` bytes together pass :data:`COLD_BYTES` (at most :data:`MAX_COPIES`, at least one)."""
    return max(1, min(MAX_COPIES, -(-COLD_BYTES // size)))


def _time_kernels(weight: Tensor, rows: int, names: tuple[str, ...], rounds: int = 7, group: int = 0) -> dict[str, float]:
    """Milliseconds a call of ``rows`` rows through each kernel of ``names``: the mean call of a round, one call on
    each copy of the weight, in the fastest of ``rounds`` interleaved rounds (another process taking the core only
    ever adds time, so the fastest round is the kernel's own).

    Each call reads another copy of the weight, the copies together larger than the last-level cache, as in
    a model whose other layers evict this one between tokens: a weight timed hot in the cache favours the
    kernel that computes faster over the one that streams memory faster (a bf16 768 -> 3072 layer timed hot
    chose F.linear, which then took 209 us a token in decoding against oneDNN's 65 us). The mean of a round, not
    the fastest single call: a call that finds its copy still in a cache is not the model's case (on an AMX Xeon
    the fastest fp32 768 -> 768 call through MKL took 31 us, at 76 GB/s, against 51 us for its mean; 2026-12-05).
    ``group``: int4 codes (uint8, two to a byte) in groups of that many inputs; 0 for other weights."""
    w = weight.detach()
    size = w.numel() * w.element_size()
    copies = _cold_copies(size)
    # on the pages the model's weights will have (huge pages can change the winner: MKL and ours tied on 4 KiB pages)
    weights = huge_page_copies([w] * copies) if choose_huge_pages() else [w.clone() for _ in range(copies)]
    in_features = 2 * w.shape[1] if group else w.shape[1]
    x = torch.randn(rows, in_features, dtype=w.dtype if w.is_floating_point() else torch.float32)  # int8, int4: fp32 inputs
    with torch.no_grad():  # the warm-up round also makes first-call allocations and oneDNN's primitives
        return _fastest_rounds({name: _on_every_copy(name, weights, x, group) for name in names}, rounds, per=copies)


def _on_every_copy(name: str, weights: list[Tensor], x: Tensor, group: int = 0) -> Callable[[], None]:
    """A run of ``x`` through each of ``weights`` (copies of one weight) by the kernel ``name``, one after another."""
    calls = [_kernel(name, weight, x, group) for weight in weights]

    def run() -> None:
        for call in calls:
            call()
    return run


TRAINING_ROWS = 512  # rows a training shape is timed at: a batch's tokens, capped (the winner is settled by then)


def _time_training(weight: Tensor, rows: int, rounds: int = 3) -> dict[str, float]:
    """Milliseconds of one forward and backward of ``rows`` rows through ``weight`` by each of :data:`TRAINING`:
    the fastest of ``rounds`` interleaved rounds, after a warm-up call of each."""
    from aiayn.nn.onednn_linear import OneDNNLinearFunction

    w = weight.detach().clone().requires_grad_(True)
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, requires_grad=True)
    grad = torch.randn(rows, w.shape[0], dtype=w.dtype)
    runs: dict[str, Callable[[], object]] = {
        "plain": lambda: F.linear(x, w).backward(grad),
        "onednn": lambda: OneDNNLinearFunction.apply(x, w, None).backward(grad),
    }

    def clear() -> None:
        x.grad = w.grad = None

    return _fastest_rounds(runs, rounds, after=clear)


def _kernel(name: str, weight: Tensor, x: Tensor, group: int = 0) -> Callable[[], Tensor]:
    """A call of ``x`` through ``weight`` by the kernel ``name`` (oneDNN's weight packed here, once); an int8 weight, or
    int4 codes in groups of ``group``, by :data:`WEIGHT_ONLY_ONE_ROW`'s (torch's computes in bf16, as
    :class:`~aiayn.inference.quantization.Int8Linear` and :class:`~aiayn.inference.int4.Int4Linear` do). The int4 codes
    serve as torch's packed layout too (the same bytes a row: its time, not its values, is what counts here)."""
    if group:
        out, groups = weight.shape[0], 2 * weight.shape[1] // group
        scale_least = torch.rand(out, 2, groups).bfloat16()  # the scales and least values ours and the widened codes read
        if name == "dequant":
            xb = x.bfloat16()
            return lambda: dequantized_int4_mm(xb, weight, scale_least)
        if name in GEMV_KERNELS:
            return lambda: gemv_int4(x, weight, scale_least, None, GEMV_KERNELS[name])
        padded = F.pad(weight, (0, 0, 0, -out % KERNEL_N_MULTIPLE))  # torch's kernel's blocks of outputs, as Int4Linear pads
        scale_zeros, xb = torch.rand(groups, padded.shape[0], 2).bfloat16(), x.bfloat16()
        return lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, padded, group, scale_zeros)
    if weight.dtype == torch.int8:
        scale = torch.ones(weight.shape[0])
        if name in GEMV_KERNELS:
            return lambda: gemv_int8(x, weight, scale, None, GEMV_KERNELS[name])
        xb, sb = x.bfloat16(), scale.bfloat16()
        if name == "dequant":
            return lambda: dequantized_mm(xb, weight, sb)
        return lambda: torch.ops.aten._weight_int8pack_mm(xb, weight, sb)
    if name == "packed":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        return lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    if name == "split":
        parts = split_parts()
        return lambda: split_linear(x, weight, None, parts)
    if name in GEMV_KERNELS:
        return lambda: gemv_linear(x, weight, None, GEMV_KERNELS[name])
    return lambda: F.linear(x, weight)
