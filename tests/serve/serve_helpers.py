"""What several serve tests share: the in-process reference a server's output must equal, a slowed
or faulty model, and reading server-sent events."""

from __future__ import annotations

import json
import time

import torch

from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.generation import STOP_EOS, generate
from aiayn.decoding.text import generation_config, prompt_ids
from aiayn.serve.loading import ServedModel


def reference_completion(served: ServedModel, prompt: str, max_tokens: int, seed: int, temperature: float = 1.0, top_p: float = 1.0,
                         top_k: int | None = None) -> tuple[str, str]:
    """``generate`` in process, alone, as ``aiayn.load(...).generate`` runs it (the tokenizer's EOS): the
    text and finish reason the server must return for this request."""
    ids = torch.tensor([prompt_ids(served.src_tokenizer, prompt)])
    greedy = temperature == 0
    config = generation_config(served.tgt_tokenizer, max_new_tokens=max_tokens, greedy=greedy, temperature=1.0 if greedy else temperature,
                               top_p=None if top_p == 1 else top_p, top_k=top_k)
    out = generate(CausalLMDecoder(served.model), ids, None, config, generator=torch.Generator().manual_seed(seed))
    tokens = out.sequences()[0]
    eos = out.stop_reasons[0] == STOP_EOS
    return served.tgt_tokenizer.decode(tokens[:-1] if eos else tokens), "stop" if eos else "length"


def slow_down(served: ServedModel, seconds: float) -> None:
    """Make every forward pass of ``served.model`` take at least ``seconds`` (to hold a batch busy)."""
    forward = served.model.forward

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    served.model.forward = slow  # type: ignore[method-assign]


def fail_at_position(served: ServedModel, position: int) -> None:
    """Make a decode step raise when any row feeds the token at ``position`` (a fault in one request)."""
    forward = served.model.forward

    def faulty(ids, pad_mask=None, *, cache=None, offset=None, **options):
        if ids.shape[1] == 1 and offset is not None and bool((torch.as_tensor(offset) == position).any()):
            raise RuntimeError(f"injected fault at position {position}")
        return forward(ids, pad_mask, cache=cache, offset=offset, **options)

    served.model.forward = faulty  # type: ignore[method-assign]


def sse_events(lines) -> list[dict | str]:
    """The ``data:`` payloads of a server-sent-event stream, JSON-decoded (``"[DONE]"`` kept as a string)."""
    out: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
