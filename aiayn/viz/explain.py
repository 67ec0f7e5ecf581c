"""Trace one forward pass of a real model, stage by stage: shapes, parameters, FLOPs, activation memory.

Nothing here is a hand-written model of the model: forward hooks on the real modules record every
call (and a wrapper records each position module's ``embed``, which is a method, not a call), and
three counters run through the whole pass:

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matrix products, 2 per multiply-add; softmax,
  norms and additions are not counted). Attention runs on the ``math`` backend for the trace,
  because the counter cannot look inside the fused CPU ``sdpa`` kernel; both do the same matmuls.
* Activation memory: the bytes of the tensors autograd saves for the backward pass (a
  ``saved_tensors_hooks`` pack hook), each storage counted once, parameters and buffers excluded.
  The model is in eval mode, so dropout saves no masks.
* Parameters: each parameter is counted once, at the first stage that uses it (tied tables are
  noted as shared); parameters that the pass never touched get a row of their own, so the total
  always equals the model's real count.

A stage is a module call at most ``depth`` calls deep (1 = the model's direct children), or a
shallower call with no sub-calls; work a parent does itself (attention's ``QK^T`` and ``AV`` when
its projections are shown separately) gets an "(own ops)" row, so the rows add up to the totals.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from aiayn.models.config import DecoderOnlyConfig, EncoderDecoderConfig, EncoderOnlyConfig, TransformerConfig
from aiayn.models.encoder_only import EncoderOnly
from aiayn.models.presets import model_class
from aiayn.nn.positional import PositionalEncoding
from aiayn.tokenization.base import N_SPECIAL

__all__ = ["Stage", "Trace", "trace_model", "explain_config", "format_table"]


@dataclass
class Stage:
    """One row: a module call (or a parent's own work, or unused parameters)."""

    name: str
    module: str
    depth: int
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    params: int
    flops: int
    activation_bytes: int
    note: str = ""


@dataclass
class Trace:
    model: str
    inputs: dict[str, list[int]]
    stages: list[Stage]
    total_params: int
    model_params: int  # sum(p.numel() for p in model.parameters()): the real count
    total_flops: int
    total_activation_bytes: int
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class _Call:
    name: str
    module: nn.Module
    depth: int
    inputs: list[list[int]]
    flops_in: int
    act_in: int
    outputs: list[list[int]] = field(default_factory=list)
    flops_out: int = 0
    act_out: int = 0
    children: list[_Call] = field(default_factory=list)


class _Recorder:
    """Hooks that build the call tree and read the two running counters on entry and exit."""

    def __init__(self, model: nn.Module, flops: FlopCounterMode) -> None:
        self.model, self.flops = model, flops
        self.aliases: dict[int, list[str]] = {}
        for name, module in model.named_modules(remove_duplicate=False):
            self.aliases.setdefault(id(module), []).append(name)
        self.seen_calls: Counter[int] = Counter()
        self.root = _Call(type(model).__name__, model, 0, [], 0, 0)
        self.stack = [self.root]
        self.activation_bytes = 0
        self._saved: set[int] = set()
        self._static = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}

    def enter(self, module: nn.Module, tensors: list[Any]) -> None:
        if module is self.model:
            return  # the model's own call is the root
        k = self.seen_calls[id(module)]
        self.seen_calls[id(module)] += 1
        names = self.aliases.get(id(module), [type(module).__name__])
        name = names[k] if k < len(names) else f"{names[-1]}#{k}"
        parent = self.stack[-1]
        call = _Call(name, module, parent.depth + 1, _shapes(tensors), self.flops.get_total_flops(), self.activation_bytes)
        parent.children.append(call)
        self.stack.append(call)

    def exit(self, module: nn.Module, output: Any) -> None:
        if module is self.model:
            return
        call = self.stack.pop()
        call.outputs = _shapes(list(output) if isinstance(output, (tuple, list)) else [output])
        call.flops_out, call.act_out = self.flops.get_total_flops(), self.activation_bytes

    def pack(self, tensor: Tensor) -> Tensor:
        """saved_tensors_hooks pack: count each saved activation storage once."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._saved and key not in self._static:
            self._saved.add(key)
            self.activation_bytes += storage.nbytes()
        return tensor


def _shapes(values: list[Any]) -> list[list[int]]:
    """Shapes of the non-bool tensors in ``values`` (masks are left out)."""
    return [list(v.shape) for v in values if isinstance(v, Tensor) and v.dtype != torch.bool]


def trace_model(model: nn.Module, inputs: dict[str, Tensor], *, depth: int = 3) -> Trace:
    """Run ``model`` once on ``inputs`` (keyword arguments of its ``forward``) and trace it.

    An encoder-only model also runs its masked-LM and classification heads, so every stage shows.
    Raises ``ValueError`` if ``depth < 1``.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    model.eval()
    flop_mode = FlopCounterMode(display=False)
    rec = _Recorder(model, flop_mode)
    handles, wrapped = [], []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda m, args, kwargs: rec.enter(m, [*args, *kwargs.values()]), with_kwargs=True))
        handles.append(module.register_forward_hook(lambda m, args, kwargs, out: rec.exit(m, out), with_kwargs=True))
        if isinstance(module, PositionalEncoding) and "embed" not in vars(module):
            module.embed = _traced_embed(module, rec)  # type: ignore[method-assign]  # removed below
            wrapped.append(module)
    try:
        with flop_mode, torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), torch.enable_grad():
            out = model(**inputs)
            if isinstance(model, EncoderOnly):
                if model.config.mlm_head:
                    model.masked_lm_logits(out)
                if model.config.n_classes:
                    model.classification_logits(out)
    finally:
        for h in handles:
            h.remove()
        for module in wrapped:
            del module.embed
    stages = _stages(rec, depth)
    model_params = sum(p.numel() for p in model.parameters())
    return Trace(
        model=type(model).__name__,
        inputs={k: list(v.shape) for k, v in inputs.items()},
        stages=stages,
        total_params=sum(s.params for s in stages),
        model_params=model_params,
        total_flops=int(flop_mode.get_total_flops()),
        total_activation_bytes=rec.activation_bytes,
        notes=[
            "FLOPs: matrix products counted by torch.utils.flop_counter.FlopCounterMode (2 per multiply-add), forward pass only",
            "attention traced with the math backend (the fused CPU sdpa kernel does the same matmuls, but the counter cannot see inside it)",
            "activation memory: bytes of the tensors autograd saves for backward (each storage once; parameters excluded; eval mode, so no dropout masks)",
            "params: each parameter counted once, at its first use; the total equals the model's parameter count",
        ],
    )


def _traced_embed(module: PositionalEncoding, rec: _Recorder):
    method = type(module).embed

    def embed(x: Tensor, offset: int | Tensor = 0) -> Tensor:
        rec.enter(module, [x])
        out = method(module, x, offset)
        rec.exit(module, out)
        return out

    return embed


def _stages(rec: _Recorder, depth: int) -> list[Stage]:
    counted: dict[int, str] = {}  # id(param) -> the stage that counted it

    def params_of(params: list[nn.Parameter], name: str) -> tuple[int, str]:
        total, shared = 0, []
        for p in params:
            if id(p) in counted:
                shared.append(counted[id(p)])
            else:
                counted[id(p)] = name
                total += p.numel()
        note = f"holds parameters counted at {', '.join(sorted(set(shared)))}" if shared else ""
        return total, note

    rows: list[Stage] = []

    def visit(node: _Call) -> None:
        for call in node.children:
            if call.depth >= depth or not call.children:
                n, note = params_of(list(call.module.parameters()), call.name)
                rows.append(Stage(call.name, type(call.module).__name__, call.depth, call.inputs, call.outputs, n,
                                  call.flops_out - call.flops_in, call.act_out - call.act_in, note))
            else:
                visit(call)
                own_row(call)

    def own_row(call: _Call) -> None:
        flops = call.flops_out - call.flops_in - sum(c.flops_out - c.flops_in for c in call.children)
        act = call.act_out - call.act_in - sum(c.act_out - c.act_in for c in call.children)
        n, note = params_of(list(call.module.parameters(recurse=False)), call.name)
        if flops or act or n:
            rows.append(Stage(f"{call.name} (own ops)", type(call.module).__name__, call.depth, call.inputs,
                              call.outputs, n, flops, act, note))

    visit(rec.root)
    root_flops = rec.flops.get_total_flops() - sum(c.flops_out - c.flops_in for c in rec.root.children)
    root_act = rec.activation_bytes - sum(c.act_out - c.act_in for c in rec.root.children)
    if root_flops or root_act:
        rows.append(Stage(f"{rec.root.name} (own ops)", rec.root.name, 0, [], [], 0, root_flops, root_act))
    unused = [p for p in rec.model.parameters() if id(p) not in counted]
    if unused:
        names = [n for n, p in rec.model.named_parameters() if id(p) not in counted]
        rows.append(Stage("(not used by this pass)", "-", 0, [], [], sum(p.numel() for p in unused), 0, 0, ", ".join(names)))
    return rows


def explain_config(config: TransformerConfig, *, batch: int = 2, src_len: int = 10, tgt_len: int = 9, depth: int = 3, seed: int = 0) -> Trace:
    """Build the model of ``config`` (attention on the ``math`` backend) and trace it on random ids.

    ``src_len``: encoder input length (encoder-decoder, encoder-only); ``tgt_len``: decoder input
    length (encoder-decoder, decoder-only). Ids avoid the special tokens, so nothing is padding.
    Raises ``ValueError`` for a size below 1.
    """
    for name, value in (("batch", batch), ("src_len", src_len), ("tgt_len", tgt_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    config = config.replace(attention_backend="math")
    torch.manual_seed(seed)
    model = model_class(config)(config)
    generator = torch.Generator().manual_seed(seed)
    low = N_SPECIAL if config.vocab_size > N_SPECIAL else 0

    def ids(vocab: int, length: int) -> Tensor:
        return torch.randint(min(low, vocab - 1), vocab, (batch, length), generator=generator)

    if isinstance(config, EncoderDecoderConfig):
        inputs = {"src": ids(config.vocab_size, src_len), "tgt": ids(config.target_vocab_size, tgt_len)}
    elif isinstance(config, DecoderOnlyConfig):
        inputs = {"ids": ids(config.vocab_size, tgt_len)}
    elif isinstance(config, EncoderOnlyConfig):
        inputs = {"ids": ids(config.vocab_size, src_len)}
    else:
        raise ValueError(f"config must be one of the three families, got {type(config).__name__}")
    trace = trace_model(model, inputs, depth=depth)
    trace.config = config.to_dict()
    return trace


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def _bytes(value: int) -> str:
    for factor, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= factor:
            return f"{value / factor:.2f} {name}"
    return f"{value} B"


def _shape_text(shapes: list[list[int]]) -> str:
    return ", ".join("(" + ", ".join(map(str, s)) + ")" for s in shapes) or "-"


def format_table(trace: Trace) -> str:
    """The trace as a fixed-width text table with totals and notes."""
    header = ("module", "input shape", "output shape", "params", "FLOPs", "act. memory")
    body = [
        (
            "  " * max(0, s.depth - 1) + s.name,
            _shape_text(s.input_shapes),
            _shape_text(s.output_shapes),
            f"{s.params:,}",
            _si(s.flops),
            _bytes(s.activation_bytes),
        )
        for s in trace.stages
    ]
    total = ("total", "", "", f"{trace.total_params:,}", _si(trace.total_flops), _bytes(trace.total_activation_bytes))
    widths = [max(len(r[i]) for r in [header, *body, total]) for i in range(len(header))]
    right = {3, 4, 5}

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    inputs = ", ".join(f"{k} {tuple(v)}" for k, v in trace.inputs.items())
    out = [f"{trace.model} on {inputs}", "", line(header), rule, *(line(r) for r in body), rule, line(total), ""]
    check = "equals" if trace.total_params == trace.model_params else "DOES NOT equal"
    out.append(f"parameters: {trace.total_params:,} ({check} the model's count, {trace.model_params:,})")
    out.append(f"forward FLOPs: {trace.total_flops:,} ({_si(trace.total_flops, 'FLOP')})")
    out.append(f"activations saved for backward: {trace.total_activation_bytes:,} bytes ({_bytes(trace.total_activation_bytes)})")
    notes = [s for s in trace.stages if s.note]
    if notes:
        out.append("shared or unused parameters:")
        out.extend(f"  {s.name}: {s.note}" for s in notes)
    out.append("notes:")
    out.extend(f"  - {n}" for n in trace.notes)
    return "\n".join(out)
