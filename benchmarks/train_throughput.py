"""Is our decoder-only model as fast to train as Hugging Face's GPT-2? Tokens/s of a full training step
(forward, cross-entropy, backward, AdamW), ours against ``GPT2LMHeadModel`` of the same shape and the
same weights, in one process, interleaved, in fp32 and in bf16 (``torch.autocast`` on the CPU), and ours
also with bf16 parameters and fp32 master weights (``bf16-master``, the library's ``MasterWeights``: cast once
per step) against the peer's autocast.

Shapes: ``small`` is nanoGPT's CPU recipe (4 layers, 4 heads, d_model 128, batch 12 x 64, 65
characters); ``gpt2`` is GPT-2 small (12 layers, 12 heads, d_model 768, batch 4 x 256, 50257 ids).
Both models start from random weights with dropout 0 (no download): the peer is built from
``GPT2Config`` and its weights are copied into ours with our GPT-2 key map, so the first loss of the
two must agree (checked). Each training step is timed the same way on both sides: a shared loss
(float32 cross-entropy over every position) on the model's logits and ``torch.optim.AdamW`` with the
same settings (foreach/fused left to torch).

Rounds interleave the two models (ours then peer, peer then ours, ...); each side's median tokens/s
is reported, and ours/peer is the median of the rounds' own ratios (a round's two sides run back to
back, so a change of the host's speed between rounds moves both). Model FLOPs per token are ``6 N + 12 L d T`` (PaLM appendix B, nanoGPT's
``estimate_mfu``): ``N`` parameters without the position table (the tied embedding counted once,
as the output projection's matmul), ``L`` layers, ``d`` d_model, ``T`` sequence length. Utilisation
is model FLOP/s over a peak measured here: the best of several large square matmuls in fp32 and bf16, by each of
torch's two matmul libraries (``torch.mm``, which is MKL in fp32, and oneDNN), the faster library's: on a Zen 5
EPYC MKL's fp32 ran at half of oneDNN's. Ours trains its fp32 Linear layers with whichever library was timed
faster per shape, its bf16 products in the layout timed faster per shape at the batch's rows (rows in one call or two,
transposes written out or not: ``aiayn.nn.onednn_linear``), and its tied table's gradient as rows
(``aiayn.nn.embedding.use_row_gradients``), as ``aiayn train`` does; the peer keeps torch's default. Both run
under the ``aiayn`` command's allocator (:mod:`aiayn.allocator`: mimalloc where installed, holding freed memory for
ten steps' time as training does; ``AIAYN_ALLOCATOR=system`` for glibc's malloc).
``bf16-master-torch`` steps the same master weights through torch's fused AdamW (the bf16 gradients widened into
fp32 ones first, the masters cast into the copies after) instead of the library's one pass (``MasterWeights.step``).
With both ``bf16`` and ``bf16-master`` timed for a shape, the script prints which was faster and whether
``train.precision=auto``'s rule (``MASTER_MIN_PARAMS``, aiayn/training/precision.py) picks it there.
``--loss own`` gives ours the library's chunked cross-entropy instead of the shared fp32 one.

    python benchmarks/train_throughput.py                          # both shapes, fp32 and bf16, 5 rounds
    python benchmarks/train_throughput.py --shapes small --rounds 3 --threads 1
    python benchmarks/train_throughput.py --shapes gpt2 --dtypes bf16 --profile
    python benchmarks/train_throughput.py --shapes small,gpt2 --dtypes bf16,bf16-master --adamw own --loss own
    python benchmarks/train_throughput.py --quick                  # a tiny shape in seconds (smoke test)
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn import build_model
from aiayn.allocator import describe, hold_freed_memory, reexec_with_allocator
from aiayn.cpu import cpu_summary
from aiayn.inference.precision import native_bf16
from aiayn.nn.embedding import use_row_gradients
from aiayn.nn.onednn_linear import OneDNNLinear, RowSplitLinear, use_training_kernels
from aiayn.training.config import LoopSection
from aiayn.training.losses import IGNORE_INDEX, label_smoothed_cross_entropy
from aiayn.training.master_weights import MasterWeights
from aiayn.training.precision import MASTER_MIN_PARAMS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/paired.py, however this script is loaded
from paired import paired_ratio  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    n_heads: int
    d_model: int
    batch: int
    seq_len: int
    vocab_size: int
    n_positions: int  # the learned position table (the same on both sides)


SHAPES = {
    "small": Shape("small", n_layers=4, n_heads=4, d_model=128, batch=12, seq_len=64, vocab_size=65, n_positions=64),
    "gpt2": Shape("gpt2", n_layers=12, n_heads=12, d_model=768, batch=4, seq_len=256, vocab_size=50257, n_positions=1024),
}
QUICK_SHAPE = Shape("tiny", n_layers=2, n_heads=2, d_model=32, batch=2, seq_len=16, vocab_size=65, n_positions=16)
DTYPES = ("fp32", "bf16", "bf16-master", "bf16-master-torch")  # the --dtypes choices
PEAKS = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the matmul peaks measured
PEER_DTYPE = {"fp32": "fp32", "bf16": "bf16", "bf16-master": "bf16", "bf16-master-torch": "bf16"}  # the peer's autocast beside our master weights


@dataclass(frozen=True)
class Row:
    """The medians of one (shape, dtype) cell."""

    shape: str
    dtype: str
    ours_tokens_per_s: float
    peer_tokens_per_s: float
    flops_per_token: float
    steps_per_round: int
    rounds: int
    ours_rates: tuple[float, ...]  # tokens/s of every round, in order
    peer_rates: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """Ours over the peer: the median of each round's ratio (the two sides of a round ran back to back, so a change
        of the host's speed between rounds moves both), which the table and the targets read."""
        return paired_ratio(self.ours_rates, self.peer_rates)

    @property
    def ratio_of_medians(self) -> float:
        return self.ours_tokens_per_s / self.peer_tokens_per_s


# --------------------------------------------------------------------------- the two models


def build_pair(
    shape: Shape, *, peer_activation: str = "gelu_new", ours_attention: str = "sdpa", seed: int = 0
) -> tuple[nn.Module, nn.Module]:
    """(ours, peer) with the same shape and the same weights, in training mode, dropout 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from aiayn.interop.hf import load_hf

    torch.manual_seed(seed)
    peer_config = GPT2Config(
        n_layer=shape.n_layers, n_head=shape.n_heads, n_embd=shape.d_model, n_positions=shape.n_positions,
        vocab_size=shape.vocab_size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        activation_function=peer_activation, use_cache=False,
        bos_token_id=shape.vocab_size - 1, eos_token_id=shape.vocab_size - 1,  # GPT-2's 50256, inside small vocabularies
    )
    peer = GPT2LMHeadModel(peer_config)
    ours = build_model(
        "gpt2-small", n_layers=shape.n_layers, n_heads=shape.n_heads, d_model=shape.d_model, d_ff=4 * shape.d_model,
        vocab_size=shape.vocab_size, max_len=shape.n_positions, dropout=0.0, attention_backend=ours_attention,
    )
    ours.load_state_dict(load_hf(peer).model.state_dict())  # the same weights, through our GPT-2 key map
    return ours.train(), peer.train()


def ours_logits(model: nn.Module, ids: Tensor) -> Tensor:
    return model(ids)


def peer_logits(model: nn.Module, ids: Tensor) -> Tensor:
    return model(input_ids=ids, use_cache=False).logits


def shared_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy over every position, in float32 (as HF's own loss upcasts)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def own_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The same mean as :func:`shared_loss`, by the library's chunked cross-entropy (no fp32 logits of the batch)."""
    loss = label_smoothed_cross_entropy(logits, targets, pad_id=IGNORE_INDEX, smoothing=0.0)
    return loss.sum / loss.count


def flops_per_token(model: nn.Module, shape: Shape) -> float:
    """``6 N + 12 L d T``: N counts each parameter once (tied ones too) and leaves out the position table."""
    n_params = sum(p.numel() for p in model.parameters())  # .parameters() yields a tied tensor once
    n_params -= shape.n_positions * shape.d_model
    return 6.0 * n_params + 12.0 * shape.n_layers * shape.d_model * shape.seq_len


class Trainer:
    """One model, its AdamW and its forward; ``step()`` runs one full training step."""

    def __init__(
        self, model: nn.Module, forward: Callable[[nn.Module, Tensor], Tensor], dtype: str, adamw: str = "default",
        loss: Callable[[Tensor, Tensor], Tensor] = shared_loss,
    ) -> None:
        self.model = model
        self.forward = forward
        self.dtype, self.loss = dtype, loss
        impl = {} if adamw == "default" else {adamw: True}  # "default": torch's choice (a for-loop on the CPU)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **impl)
        self.master = MasterWeights(model) if dtype.startswith("bf16-master") else None  # the optimizer steps the fp32 masters
        # as aiayn train steps them: in one pass from the copies' gradients where MasterWeights.step can
        # ("bf16-master-torch": the four passes through torch's optimizer that pass replaced, for comparison)
        self.fused = dtype == "bf16-master" and self.master is not None and self.master.fused_blocker(self.optimizer) is None

    def step(self, ids: Tensor, targets: Tensor) -> float:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.dtype == "bf16" else nullcontext()
        with self.master.swapped() if self.master is not None else nullcontext():  # bf16-master: on the copies
            with autocast:
                loss = self.loss(self.forward(self.model, ids), targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if self.fused:
            self.master.step(self.optimizer)  # type: ignore[union-attr]
            return loss.item()
        if self.master is not None:
            self.master.accumulate_grads()
        self.optimizer.step()
        if self.master is not None:
            self.master.update_copies()
        return loss.item()


# --------------------------------------------------------------------------- timing


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of the best of ``repeats`` matmuls of two ``n x n`` matrices (after one warm-up), by ``torch.mm``
    and, where this torch has it, by oneDNN directly (the library our fp32 training may choose)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    calls = {"torch.mm": lambda: torch.mm(a, b)}
    if torch.backends.mkldnn.is_available():
        calls["oneDNN"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    flops = {}
    for name, call in calls.items():
        call()
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        flops[name] = 2.0 * n**3 / best
    return flops


def _timed(trainer: Trainer, ids: Tensor, targets: Tensor, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step(ids, targets)
    return time.perf_counter() - start


def matmul_kernels(model: nn.Module, rows: int, dtype_name: str) -> int:
    """Give ``model``'s Linear layers the training kernels ``aiayn train`` times for ``dtype_name``'s products (fp32: oneDNN
    or MKL; bf16: rows in one call or two), after taking back any given for another dtype; returns how many changed."""
    for module in model.modules():
        if isinstance(module, (OneDNNLinear, RowSplitLinear)):
            module.__class__ = nn.Linear
    return use_training_kernels(model, rows, dtype=torch.float32 if dtype_name == "fp32" else torch.bfloat16)


def compare(
    shape: Shape, dtype_name: str, ours: nn.Module, peer: nn.Module, *, rounds: int, steps: int | None, target_s: float,
    adamw: str = "default", seed: int = 0, loss: str = "shared",
) -> Row:
    """Median tokens/s of both models over ``rounds`` interleaved rounds of ``steps`` steps each
    (``None``: as many as take about ``target_s`` seconds, the same number on both sides)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=generator)
    ids, targets = data[:, :-1], data[:, 1:]
    own = adamw == "own"  # each side its library's choice: fused for ours (build_optimizer), torch's default for the peer
    pair = (Trainer(ours, ours_logits, dtype_name, "fused" if own else adamw, own_loss if loss == "own" else shared_loss),
            Trainer(peer, peer_logits, PEER_DTYPE[dtype_name], "default" if own else adamw))
    warm = [min(_timed(t, ids, targets, 1) for _ in range(2)) for t in pair]  # allocator, kernel (and compile) warm-up
    hold_freed_memory(LoopSection().hold_freed_steps * max(warm))  # as `aiayn train` does by default
    if steps is None:  # from each side's faster warm-up step: the first one of a compiled model includes compiling
        steps = max(1, round(target_s / statistics.mean(warm)))
    tokens = shape.batch * shape.seq_len * steps
    rates: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)  # alternate who goes first
        for side in order:
            rates[side].append(tokens / _timed(pair[side], ids, targets, steps))
    return Row(shape.name, dtype_name, statistics.median(rates[0]), statistics.median(rates[1]),
               flops_per_token(ours, shape), steps, rounds, tuple(rates[0]), tuple(rates[1]))


def check_same_loss(shape: Shape, ours: nn.Module, peer: nn.Module) -> tuple[float, float]:
    """The fp32 loss of both models on one batch: equal weights must give an equal loss."""
    data = torch.randint(shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = shared_loss(ours_logits(ours, data[:, :-1]), data[:, 1:]).item()
        b = shared_loss(peer_logits(peer, data[:, :-1]), data[:, 1:]).item()
    if not math.isclose(a, b, rel_tol=1e-4):
        raise RuntimeError(f"{shape.name}: the models differ: loss {a:.6f} (ours) vs {b:.6f} (peer) with the same weights")
    return a, b


def profile_steps(
    shape: Shape, dtype_name: str, ours: nn.Module, peer: nn.Module, *, adamw: str = "default", row_limit: int = 25,
    loss: str = "shared",
) -> None:
    """Print torch.profiler's table (by self CPU time) of two training steps of each model."""
    from torch.profiler import ProfilerActivity, profile

    data = torch.randint(shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=torch.Generator().manual_seed(2))
    own = adamw == "own"
    trainers = (("ours", Trainer(ours, ours_logits, dtype_name, "fused" if own else adamw, own_loss if loss == "own" else shared_loss)),
                ("peer", Trainer(peer, peer_logits, PEER_DTYPE[dtype_name], "default" if own else adamw)))
    for name, trainer in trainers:
        trainer.step(data[:, :-1], data[:, 1:])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                trainer.step(data[:, :-1], data[:, 1:])
        print(f"\n--- profile: {name}, {shape.name}, {dtype_name}, 2 steps ---")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit))


# --------------------------------------------------------------------------- report


def format_table(rows: Sequence[Row], peaks: dict[str, float]) -> str:
    lines = [
        "| shape | dtype | ours tok/s | peer tok/s | ours/peer | ours model TFLOP/s | ours % fp32 peak | ours % bf16 peak | peer % bf16 peak |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    def percent(flops: float, peak: str) -> str:
        return f"{100 * flops / peaks[peak]:.1f}" if peak in peaks else "n/a"

    for r in rows:
        ours_flops = r.flops_per_token * r.ours_tokens_per_s
        peer_flops = r.flops_per_token * r.peer_tokens_per_s
        lines.append(
            f"| {r.shape} | {r.dtype} | {r.ours_tokens_per_s:,.0f} | {r.peer_tokens_per_s:,.0f} | {r.ratio:.2f} | "
            f"{ours_flops / 1e12:.3f} | {percent(ours_flops, 'fp32')} | {percent(ours_flops, 'bf16')} | "
            f"{percent(peer_flops, 'bf16')} |"
        )
    return "\n".join(lines)


def auto_rule_check(rows: Sequence[Row], shape: Shape, n_params: int) -> str:
    """Whether ``train.precision=auto``'s rule picks the faster of bf16 autocast and bf16-master at this shape."""
    rates = {r.dtype: r.ours_tokens_per_s for r in rows if r.shape == shape.name and r.dtype in ("bf16", "bf16-master")}
    if len(rates) < 2:
        return "  auto rule: not checked (time both bf16 and bf16-master)"
    picked = "bf16-master" if n_params >= MASTER_MIN_PARAMS else "bf16"
    faster = max(rates, key=rates.__getitem__)
    return (f"  auto rule ({n_params / 1e6:.1f} M parameters vs MASTER_MIN_PARAMS {MASTER_MIN_PARAMS / 1e6:.0f} M): picks {picked}; "
            f"faster here: {faster} (bf16-master / bf16 = {rates['bf16-master'] / rates['bf16']:.2f}); "
            f"rule {'holds' if picked == faster else 'WRONG here'}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="small,gpt2", help=f"comma-separated, from {', '.join(SHAPES)} (default: small,gpt2)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, from fp32, bf16, bf16-master (ours: bf16 "
                   "parameters, fp32 masters; the peer: autocast), bf16-master-torch (the same, stepped through torch's "
                   "optimizer in four passes) (default: fp32,bf16)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds, the median is reported (default: 5)")
    p.add_argument("--steps", type=int, default=None, help="training steps per model per round (default: about --target-s seconds)")
    p.add_argument("--target-s", type=float, default=1.0, help="seconds per model per round when --steps is not given (default: 1)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1, steadier on a shared "
                   "machine: threads that wait on a busy core stall every parallel op; 0 = torch's choice)")
    p.add_argument("--peer-activation", default="gelu_new", help="GPT2Config.activation_function of the peer "
                   "(default: gelu_new, GPT-2's; gelu_pytorch_tanh is the same function as one fused kernel)")
    p.add_argument("--ours-attention", choices=("auto", "sdpa", "math"), default="auto",
                   help="our config's attention_backend (default: auto, the library default; the peer always uses its default)")
    p.add_argument("--adamw", choices=("default", "foreach", "fused", "own"), default="default",
                   help="AdamW implementation on both sides (default: torch's choice, a for-loop on the CPU; "
                   "own: each side its library's choice, fused for ours as aiayn's build_optimizer takes, torch's default for the peer)")
    p.add_argument("--loss", choices=("shared", "own"), default="shared", help="ours: the shared fp32 cross-entropy "
                   "(default) or own, the library's chunked one (no fp32 logits of the whole batch); the peer keeps the shared one")
    p.add_argument("--compile", action="store_true", help="torch.compile both models (forward and backward)")
    p.add_argument("--peak-n", type=int, default=2048, help="size of the square matmul that measures the peak (default: 2048)")
    p.add_argument("--profile", action="store_true", help="also print torch.profiler tables of two steps of each model")
    p.add_argument("--quick", action="store_true", help="a tiny shape, 2 rounds of 1 step (a smoke test in seconds)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    args.shape_list = [QUICK_SHAPE] if args.quick else [SHAPES[name] for name in _names(p, "--shapes", args.shapes, SHAPES)]
    args.dtype_list = _names(p, "--dtypes", args.dtypes, DTYPES)
    if args.quick:
        args.rounds, args.steps, args.peak_n = 2, 1, 256
    return args


def _names(p: argparse.ArgumentParser, flag: str, value: str, table: Collection[str]) -> list[str]:
    names = value.split(",")
    for name in names:
        if name not in table:
            p.error(f"{flag}: unknown {name!r}; choose from {', '.join(table)}")
    return names


def main(argv: Sequence[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    interop_log = logging.getLogger("aiayn.interop")
    log_level = interop_log.level
    interop_log.setLevel(logging.ERROR)  # the in-memory import says it has no tokenizer
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test) gets its settings back
        interop_log.setLevel(log_level)


def _run(args: argparse.Namespace) -> list[Row]:
    print(f"CPU: {cpu_summary()}; torch {torch.__version__}, {torch.get_num_threads()} threads; allocator: {describe()}")
    if not native_bf16(torch.device("cpu")):
        print("NOTE: this CPU has no AMX or AVX512-BF16: its bf16 matmuls are a slow generic loop, so bf16 rows measure that")
    # fp32's peak always (a percentage column); bf16's only when a bf16 row asks for it: without native bf16 the
    # generic loop takes minutes at 2048 x 2048 (and one thread only), for a number no fp32 row needs.
    wanted = {PEER_DTYPE[name] for name in args.dtype_list}
    measured = {name: matmul_peak(dtype, args.peak_n) for name, dtype in PEAKS.items() if name == "fp32" or name in wanted}
    peaks = {name: max(by_library.values()) for name, by_library in measured.items()}  # the faster library's
    print(f"matmul peak ({args.peak_n}x{args.peak_n}, best of 5; the faster library's is the peak): " + "; ".join(
        f"{name} " + ", ".join(f"{lib} {flops / 1e12:.3f}" for lib, flops in by_library.items()) + " TFLOP/s"
        for name, by_library in measured.items()))
    rows = []
    for shape in args.shape_list:
        ours, peer = build_pair(shape, peer_activation=args.peer_activation, ours_attention=args.ours_attention)
        a, b = check_same_loss(shape, ours, peer)
        onednn = matmul_kernels(ours, shape.batch * shape.seq_len, "fp32")  # as `aiayn train` does in fp32
        use_row_gradients(ours)  # as `aiayn train` does for language models: the tied table's gradient from its rows
        if args.compile:
            ours, peer = torch.compile(ours), torch.compile(peer)
        n_params = sum(p.numel() for p in ours.parameters())
        print(f"\n{shape.name}: {shape.n_layers} layers, {shape.n_heads} heads, d_model {shape.d_model}, batch "
              f"{shape.batch} x {shape.seq_len}, vocab {shape.vocab_size}: {n_params / 1e6:.2f} M parameters "
              f"(peer: {sum(p.numel() for p in peer.parameters()) / 1e6:.2f} M); attention: ours {args.ours_attention!r}, peer "
              f"{peer.config._attn_implementation!r}; compiled {args.compile}; peer activation {args.peer_activation!r}; AdamW {args.adamw}; "
              f"loss {args.loss}; same-weights loss {a:.5f} vs {b:.5f}; ours' fp32 Linear layers on oneDNN: {onednn}")
        for dtype_name in args.dtype_list:
            # each dtype's kernels (choices cached), whatever ran before: bf16's rows in one call or two, as `aiayn train`
            # does for LM batches; fp32's library
            changed = matmul_kernels(ours, shape.batch * shape.seq_len, dtype_name)
            if dtype_name != "fp32":
                print(f"{shape.name} {dtype_name}: ours' Linear layers with a product's rows split in two calls or a transpose written out: {changed}")
            row = compare(
                shape, dtype_name, ours, peer, rounds=args.rounds, steps=args.steps, target_s=args.target_s, adamw=args.adamw,
                loss=args.loss,
            )
            rows.append(row)
            paired = [o / p for o, p in zip(row.ours_rates, row.peer_rates)]
            print(f"  {dtype_name}: ours {row.ours_tokens_per_s:,.0f} tok/s, peer {row.peer_tokens_per_s:,.0f} tok/s, "
                  f"ours/peer {row.ratio:.2f} (the median of {row.rounds} rounds' ratios, {row.steps_per_round} steps a round: "
                  f"{min(paired):.2f}..{max(paired):.2f}; the ratio of the medians {row.ratio_of_medians:.2f}; rounds ranged "
                  f"{min(row.ours_rates):,.0f}..{max(row.ours_rates):,.0f} and {min(row.peer_rates):,.0f}..{max(row.peer_rates):,.0f})",
                  flush=True)
            if args.profile:
                profile_steps(shape, dtype_name, ours, peer, adamw=args.adamw, loss=args.loss)
        print(auto_rule_check(rows, shape, n_params))
        del ours, peer
    print("\nmodel FLOPs per token = 6 N + 12 L d T (PaLM appendix B; N without the position table)")
    print(format_table(rows, peaks))
    return rows


if __name__ == "__main__":
    reexec_with_allocator()  # the aiayn command's allocator (mimalloc where installed; $AIAYN_ALLOCATOR=system: glibc's)
    main()
