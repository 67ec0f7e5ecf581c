"""Our matrix-vector product for one row through an fp32, bf16, weight-only int8 or int4 Linear layer (batch-1
decoding), or a few rows (up to :data:`FEW_ROWS`: a small batch, speculative decoding's check), built on this machine
(int4: ``gemv_int4.cpp``).

A one-token step reads every weight once for two flops each: its speed is how fast the weights stream from memory.
oneDNN's packed kernel and MKL's sgemm are general matrix products asked to do a matrix-vector one; the kernel in
``gemv.cpp`` does only that (each output is one contiguous weight row dotted with the input, the rows in blocks
over torch's threads), as llama.cpp does. Decoding GPT-2 small on a Zen 5 EPYC it took our fp32 speed from 0.81 to
0.85-0.93 of llama.cpp's F32 and weight-only int8 from 0.71 to 0.95 of its Q8_0; on an AMX Xeon, asking for the
weights :data:`PREFETCH` bytes ahead (``native-prefetch``) took bf16 from 0.98 to 1.16 of llama.cpp's BF16 and
weight-only int8 to 1.79 of its Q8_0 (``docs/benchmarks.md``). Whether each wins is timed per shape, beside the
others, on each machine (:mod:`aiayn.inference.kernel_choice`).

The sources (:data:`SOURCES`) are compiled once per CPU, compiler flags and torch version (``-march=native``: this CPU's vector width)
into the user cache, ``$XDG_CACHE_HOME/aiayn/native/`` (10-20 seconds; logged), and loaded as the torch operator
``aiayn_native::gemv``, which ``torch.compile`` graphs call as they are (where Inductor writes AVX-512 code:
:data:`IN_GRAPHS`). The same library holds ``aiayn_native::attend_one``, one query's attention over a key/value cache
(:func:`attend_one`), a candidate of the one-query attention choice, and GPT-2's tanh-approximated GELU with its
gradient (:func:`gelu_tanh`). Without a C++ compiler, or where the build fails, :func:`available` says so once in a
warning and none of them is a candidate.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.checkpoint.atomic_io import temporary_sibling
from aiayn.cpu import cpu_key
from aiayn.environment import user_cache_dir

__all__ = ["DTYPES", "FEW_ROWS", "IN_GRAPHS", "KERNELS", "NativeCall", "PREFETCH", "allow_in_graphs", "argmax_last", "attend_one", "available", "dropout", "few_rows", "gelu_tanh", "gelu_tanh_backward", "gemv_int4", "gemv_int8", "loaded", "norm",
           "gemv_linear", "may_run", "quantized_kernel", "tiles_available", "unavailable_reason", "HEADERS", "SOURCE", "SOURCES"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gemv.cpp")
# The library's sources, built together into one operator library: the matrix-vector product, one query's attention,
# GPT-2's GELU, the vector pieces they share (a header), the one-token decoding step that calls them
# (aiayn.decoding.native_step), greedy's pick (argmax), and training's loss, attention (our loops, and oneDNN's
# small-matrix kernel), transposes written out, master-weight optimizer step, and dropout.
SOURCES = (SOURCE, SOURCE.with_name("gemv_int4.cpp"), SOURCE.with_name("attend_one.cpp"), SOURCE.with_name("gelu_tanh.cpp"), SOURCE.with_name("cross_entropy.cpp"),
           SOURCE.with_name("attention_train.cpp"), SOURCE.with_name("attention_tiles.cpp"), SOURCE.with_name("decode_step.cpp"), SOURCE.with_name("transpose.cpp"),
           SOURCE.with_name("adamw.cpp"), SOURCE.with_name("argmax.cpp"), SOURCE.with_name("norm.cpp"),
           SOURCE.with_name("dropout.cpp"))
HEADERS = (SOURCE.with_name("simd.h"), SOURCE.with_name("gemv_int4.h"), SOURCE.with_name("attention_tiles.h"), SOURCE.with_name("gelu_tanh.h"))
BUILD_TIMEOUT_S = 600


DTYPES = (torch.float32, torch.bfloat16)  # the floating-point weights it takes (x of the same dtype)
# How far ahead of its reads the kernel asks for the weights' cache lines, into L2. On an AMX Xeon (2 cores, 2026-12-05)
# the hardware prefetchers alone kept too few lines in flight: 16 KiB ahead read one GPT-2-small token's bf16 weights
# 1.3x faster, int8 1.6-1.8x, fp32 1.1x (docs/benchmarks.md, --token-chain; shorter distances and L1 did less in
# throw-away sweeps). Other CPUs may lose by it, so both are candidates.
PREFETCH = 16 << 10
KERNELS = {"native": 0, "native-prefetch": PREFETCH}  # the kernel's names in the timed choice: bytes prefetched ahead
# The most rows a call takes through the kernel where it was timed faster for several (a small batch, speculative
# checks: each weight row read once for all of them); more rows (a prompt) take a matrix product's kernel.
FEW_ROWS = 8


class NativeCall(NamedTuple):
    """How a Linear layer computes a call at inference, as the C++ decoding step (``decode_step.cpp``) takes it: each
    layer class writes its own (``native_call``, beside its ``forward``). ``kind``: ``plain`` (``at::linear``), ``gemv``
    (our matrix-vector product, ``param`` bytes prefetched), ``few`` (several rows: ours up to :data:`FEW_ROWS`, the
    call ``beyond`` for more), ``packed`` (oneDNN's packed ``weight``), ``int8`` or ``int4`` (torch's kernels;
    ``param``: int8's rows above which it widens its weight instead, int4's group size), ``int4-widened`` (int4 codes
    widened for more rows than ``param``, the call ``beyond`` for fewer); ``scale``: int8's per row, int4's scales and
    zeros (``int4-widened``, ``gemv``: scales and least values)."""

    kind: str
    param: int
    weight: Tensor
    scale: Tensor | None
    beyond: NativeCall | None = None
# Whether compiled graphs call it: set before a decode step compiles (allow_in_graphs), where Inductor writes AVX-512
# code. Under its AVX2 code (checked with ATEN_CPU_CAPABILITY=avx2 on a Zen 5 EPYC, 2026-12-04) a compiled decode step
# around it gave NaN or wrong logits, frozen or not, while the kernel alone and a small compiled graph were right:
# there a graph takes the layer's other kernel (aiayn.inference.quantization.avx512_graphs has the same story for int4
# and int8). Not asked at load: Inductor's answer imports Dynamo (70 MB, 0.9 s) into every eager process.
IN_GRAPHS = False


def may_run() -> bool:
    """Whether a call made now may take the kernel: always eagerly; in a graph being compiled only where
    :data:`IN_GRAPHS` (the layers' one rule; Dynamo reads it as a constant)."""
    return not torch.compiler.is_compiling() or IN_GRAPHS


def allow_in_graphs() -> bool:
    """Set :data:`IN_GRAPHS` for this machine (before a graph that may call the kernel is traced) and return it."""
    from aiayn.inference.quantization import avx512_graphs  # here: quantization imports this module

    global IN_GRAPHS
    IN_GRAPHS = available() and avx512_graphs()
    return IN_GRAPHS


def gemv_linear(x: Tensor, weight: Tensor, bias: Tensor | None, prefetch: int = 0) -> Tensor:
    """``F.linear(x, weight, bias)`` for one row ``x (..., in)`` of fp32 or bf16 (the weight's dtype), through
    ``aiayn_native::gemv`` (call only where :func:`available`), the weights prefetched ``prefetch`` bytes ahead (0:
    not); other dtypes and a non-contiguous weight take ``F.linear``."""
    if x.dtype != weight.dtype or weight.dtype not in DTYPES or not weight.is_contiguous():
        return F.linear(x, weight, bias)
    return torch.ops.aiayn_native.gemv(x, weight, None, bias, prefetch)


def few_rows(x: Tensor, in_features: int) -> bool:
    """Whether ``x (..., in_features)`` holds at most :data:`FEW_ROWS` rows: what a layer sends to this kernel when it
    was timed faster for several (``decode_step.cpp``'s ``few`` Linear kind asks the same of its calls)."""
    return x.numel() <= FEW_ROWS * in_features


def quantized_kernel(x: Tensor, in_features: int, one: str, many: str) -> str | None:
    """The kernel a weight-only int8 or int4 layer timed for a call of ``x (..., in_features)``: ``one`` for one row,
    ``many`` for a few (:func:`few_rows`), ``None`` for more (a prompt: always torch's)."""
    return one if x.numel() == in_features else many if few_rows(x, in_features) else None


def gemv_int8(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, prefetch: int = 0) -> Tensor:
    """One row or a few ``x (..., in)`` (fp32 or bf16) through int8 ``weight (out, in)`` times its fp32 ``scale (out,)``, plus
    ``bias``: ``x (W * scale)^T + b`` in ``x``'s dtype, the sums in fp32 (call only where :func:`available`), the
    weights prefetched ``prefetch`` bytes ahead (0: not)."""
    return torch.ops.aiayn_native.gemv(x, weight, scale, bias, prefetch)


def gemv_int4(x: Tensor, codes: Tensor, scale_least: Tensor, bias: Tensor | None, prefetch: int = 0) -> Tensor:
    """One row or a few ``x (..., in)`` (fp32 or bf16) through 4-bit ``codes (out, in / 2)`` (uint8, two to a byte) with
    their groups' bf16 ``scale_least (out, 2, groups)``, plus ``bias``, in ``x``'s dtype (``gemv_int4.cpp``: the inputs
    quantised to 8 bits a group; call only where :func:`available`), the codes prefetched ``prefetch`` bytes ahead."""
    return torch.ops.aiayn_native.gemv(x, codes, scale_least, bias, prefetch)


def attend_one(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    """``softmax(q k^T / sqrt(d)) v`` for one query ``q (B, H, 1, D)``, or a few ``(B, H, T, D)``, over ``k, v (B, Hkv, S, D)``
    (fp32 or bf16, the last dimension contiguous), ``mask`` None or bool ``(B|1, 1, 1, S)``, True = may attend; ``causal``:
    query t sees the first ``S - T + t + 1`` keys only, computed as one query over those keys would be; a row with every
    key masked gives zeros (call only where :func:`available`)."""
    return torch.ops.aiayn_native.attend_one(q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]), causal)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU with tanh's approximation (GPT-2's), ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, of an fp32 or bf16
    CPU tensor, computed in fp32 (call only where :func:`available`)."""
    return torch.ops.aiayn_native.gelu_tanh(x)


def gelu_tanh_backward(grad: Tensor, x: Tensor) -> Tensor:
    """``grad`` times the derivative of :func:`gelu_tanh` at ``x`` (the same shape and dtype)."""
    return torch.ops.aiayn_native.gelu_tanh_backward(grad, x)


def argmax_last(scores: Tensor) -> Tensor:
    """The index of the largest of each row of ``scores (B, V)`` (fp32 or bf16), the first on ties, NaN largest: torch's
    ``argmax(dim=-1)`` (``argmax.cpp``; call only where :func:`loaded`)."""
    return torch.ops.aiayn_native.argmax_last(scores)


def norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, rms: bool) -> Tensor:
    """LayerNorm (``rms=False``) or RMSNorm of an fp32 or bf16 CPU tensor over its last dimension, in fp32, each row
    alike whatever the rows around it (``norm.cpp``; inference only: no gradient; call only where :func:`available`)."""
    return torch.ops.aiayn_native.norm(x, weight, bias, eps, rms)


def dropout(x: Tensor, p: float, seed: int) -> Tensor:
    """``x`` (fp32 or bf16, CPU) with each element kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``, else
    0, by the random bits of Philox4x32-10 at ``seed`` and the element's index (``dropout.cpp``): the same seed gives the
    same mask, so the gradient is this same call on ``grad`` (call only where :func:`available`)."""
    return torch.ops.aiayn_native.dropout(x, p, seed)


def loaded() -> bool:
    """Whether the library is already loaded in this process: never builds it, for callers that must not wait on a build
    (greedy's pick takes torch's kernel until something else has loaded it)."""
    return _load.cache_info().currsize > 0 and _load() is None


def available() -> bool:
    """Whether ``aiayn_native::gemv`` is loaded here, building it first if it was never built for this machine."""
    return _load() is None


def tiles_available() -> bool:
    """Whether bf16 training attention by oneDNN's small-matrix kernel (``attention_tiles.cpp``) runs here: the library
    loaded, and torch packs bf16 operands for that kernel on this CPU in the layout ours writes (fp32 runs wherever the
    library loaded)."""
    return available() and bool(torch.ops.aiayn_native.attention_tiles_available())


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here (no compiler, a failed build), or ``None`` when it can."""
    return _load()


@functools.cache
def _load() -> str | None:
    """Build (once per machine) and load the operator; ``None`` on success, else the reason, warned once."""
    if sys.platform != "linux":
        return _unavailable(f"built on Linux only (this is {sys.platform})")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return _unavailable("no C++ compiler (c++ or g++, or $CXX) on PATH")
    flags = _flags()
    texts = [path.read_text() for path in (*SOURCES, *HEADERS)]
    digest = hashlib.sha256("\n".join([*texts, torch.__version__, cpu_key(), compiler, *flags]).encode()).hexdigest()[:16]
    library = user_cache_dir() / "native" / f"gemv-{digest}.so"
    try:
        with _one_builder(library):  # processes started together (torchrun's ranks, test workers) build it once
            if not library.exists():
                _build(compiler, flags, library)
    except (OSError, subprocess.SubprocessError) as err:
        return _unavailable(f"building {', '.join(path.name for path in SOURCES)} with {compiler} failed: {_last_lines(err)}")
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as err:
        return _unavailable(f"loading {library} failed: {err}")
    torch.library.register_fake("aiayn_native::gemv")(_fake)
    torch.library.register_fake("aiayn_native::attend_one")(_fake_attend)
    torch.library.register_fake("aiayn_native::gelu_tanh")(lambda x: torch.empty_like(x))
    torch.library.register_fake("aiayn_native::norm")(lambda x, weight, bias, eps, rms: torch.empty_like(x))
    torch.library.register_fake("aiayn_native::argmax_last")(lambda scores: scores.new_empty(scores.shape[:1], dtype=torch.long))
    torch.library.register_fake("aiayn_native::gelu_tanh_backward")(lambda grad, x: torch.empty_like(x))
    torch.library.register_fake("aiayn_native::cross_entropy_rows")(_fake_cross_entropy)
    torch.library.register_fake("aiayn_native::cross_entropy_backward")(lambda grad, logits, *rest: torch.empty_like(logits))
    torch.library.register_fake("aiayn_native::attention_forward")(
        lambda q, k, v, causal, scale, tiles=False: (_heads_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)))
    torch.library.register_fake("aiayn_native::attention_backward")(lambda grad, q, k, v, *rest: (_heads_like(q), _heads_like(k), _heads_like(v)))
    return None


def _fake(x: Tensor, weight: Tensor, scale: Tensor | None, bias: Tensor | None, prefetch: int = 0) -> Tensor:
    """The operator's output shape and dtype without running it (what ``torch.compile`` traces)."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _fake_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, smoothing: float) -> tuple[Tensor, Tensor]:
    rows = logits.new_empty(logits.shape[:1], dtype=torch.float32)
    return rows, torch.empty_like(rows)


def _heads_like(x: Tensor) -> Tensor:
    """``(B, H, n, D)`` laid out as ``(B, n, H, D)``, as ``attention_train.cpp`` returns its outputs."""
    return x.new_empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3])).transpose(1, 2)


def _fake_attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool = False) -> Tensor:
    return q.new_empty(q.shape)


def _flags() -> list[str]:
    """The compiler's flags: optimised for this CPU, OpenMP (torch's threads), and the ABI and headers of this torch.
    ``-ffp-contract=off``: the arithmetic as written (the vector loops' fused multiply-adds are explicit). GCC's default
    fuses ``a * b + c`` where inlining lets it, which gave a row's scalar tail other bits when paired with another row
    than alone (widths 17 and 777, 2026-12-05), and an int8 row's ``scale * d + bias`` bits that changed with the code
    around it."""
    from torch.utils.cpp_extension import include_paths, library_paths

    arch = ["-march=native"] if platform.machine().lower() in ("x86_64", "amd64") else ["-mcpu=native"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-O3", *arch, "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in include_paths()), *(f"-L{p}" for p in library_paths()),
            *(f"-Wl,-rpath,{p}" for p in library_paths())]


@contextlib.contextmanager
def _one_builder(library: Path) -> Iterator[None]:
    """Hold an exclusive lock beside ``library`` (``fcntl.flock``, released if the process dies): a process that
    finds another building waits for it, then loads what it built."""
    import fcntl  # here: Linux only, as the build (checked before)

    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(compiler: str, flags: list[str], library: Path) -> None:
    """Compile :data:`SOURCES` into ``library``, atomically (a build that fails or is killed leaves nothing behind):
    each source into an object file at once, one per core (7-10 s each here, against 38 s for all in one call), then
    one link. Called under :func:`_one_builder`, which made the folder."""
    tmp = temporary_sibling(library)
    log.info("building aiayn's matrix-vector kernel for this CPU (%s), once, into %s", cpu_key(), library)
    start = time.perf_counter()

    def run(command: list[str]) -> None:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)

    try:
        with tempfile.TemporaryDirectory(dir=library.parent) as folder:
            objects = [str(Path(folder) / f"{source.stem}.o") for source in SOURCES]
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                list(pool.map(run, [[compiler, "-c", str(source), "-o", obj, *flags] for source, obj in zip(SOURCES, objects)]))
            run([compiler, *objects, "-o", str(tmp), *flags, "-ltorch", "-ltorch_cpu", "-lc10"])
        os.replace(tmp, library)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("built %s in %.1f s", library.name, time.perf_counter() - start)


def _last_lines(err: BaseException, lines: int = 5) -> str:
    text = getattr(err, "stderr", None) or str(err)
    return " | ".join(str(text).strip().splitlines()[-lines:])


def _unavailable(reason: str) -> str:
    log.warning("aiayn's native matrix-vector kernel is not used here: %s (oneDNN and MKL are timed without it, and decoding steps run through the model's modules)", reason)
    return reason
