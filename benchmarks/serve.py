"""Does request batching pay, and what does the server cost? ``aiayn serve`` run as a user runs it (a
subprocess on 127.0.0.1), driven by asyncio ``httpx`` clients from this process, against its peer:
``generate`` called in this process on the same model.

* throughput: aggregate completion tokens/s of 8 concurrent clients vs 1 client (64 tokens each:
  every request bans EOS with ``logit_bias``, so each generates exactly its ``max_tokens``);
* time to first token: a 32-token prompt, streamed, while 8 other clients stream (p50, p90), and alone;
* overhead: one client, one request at a time, the server's latency vs ``generate`` in process.

Rounds are interleaved (server, peer, server, ...) and the medians reported, with ``uptime``'s load.

    python benchmarks/serve.py --checkpoint /work/runs/shakespeare-char
    python benchmarks/serve.py --gpt2-shaped --work-dir /work/runs/17-serve-bench --no-ttft   # random weights, GPT-2-small shapes
    python benchmarks/serve.py --checkpoint DIR --quick                             # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.generation import generate
from aiayn.decoding.sampling import GenerationConfig
from aiayn.serve.loading import ServedModel, load_served_model
from aiayn.tokenization.special import EOS_ID

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    model: str
    load_avg: str
    single_tok_s: list[float] = field(default_factory=list)
    batched_tok_s: list[float] = field(default_factory=list)
    ttft_loaded_s: list[float] = field(default_factory=list)
    ttft_alone_s: list[float] = field(default_factory=list)
    server_latency_s: list[float] = field(default_factory=list)
    in_process_latency_s: list[float] = field(default_factory=list)
    tokens_per_request: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        med = statistics.median
        out = {"speedup_8_vs_1": med(self.batched_tok_s) / med(self.single_tok_s),
               "single_tok_s": med(self.single_tok_s), "batched_tok_s": med(self.batched_tok_s)}
        if self.ttft_loaded_s:
            q = statistics.quantiles(self.ttft_loaded_s, n=10) if len(self.ttft_loaded_s) > 1 else [self.ttft_loaded_s[0]] * 9
            out |= {"ttft_p50_loaded_ms": 1000 * med(self.ttft_loaded_s), "ttft_p90_loaded_ms": 1000 * q[8],
                    "ttft_p50_alone_ms": 1000 * med(self.ttft_alone_s)}
        if self.server_latency_s:
            out |= {"server_ms": 1000 * med(self.server_latency_s), "in_process_ms": 1000 * med(self.in_process_latency_s),
                    "overhead": med(self.server_latency_s) / med(self.in_process_latency_s) - 1}
        return out


def start_server(checkpoint: str, max_batch: int, threads: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--checkpoint", checkpoint, "--port", "0", "--max-batch", str(max_batch),
                             "--model-name", "bench", "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    found = re.search(r"listening on (http://\S+) ", proc.stdout.readline())  # type: ignore[union-attr]
    if not found:
        proc.kill()
        raise RuntimeError("the server did not start")
    url = found.group(1)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not load the model in 300 s")


async def request(client: httpx.AsyncClient, prompt: str, max_tokens: int, seed: int, *, stream: bool = False) -> tuple[float, float, int]:
    """One completion: (time to first token, total time, completion tokens)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": stream, "logit_bias": {str(EOS_ID): -100}}  # exactly max_tokens each
    start = time.perf_counter()
    if not stream:
        r = await client.post("/v1/completions", json=body)
        r.raise_for_status()
        total = time.perf_counter() - start
        return total, total, r.json()["usage"]["completion_tokens"]
    first = None
    async with client.stream("POST", "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        tokens = 0
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.perf_counter() - start
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - start
    return first if first is not None else total, total, tokens


async def throughput(url: str, n_clients: int, per_client: int, prompt: str, max_tokens: int, seed: int) -> float:
    """Aggregate completion tokens/s of ``n_clients`` each sending ``per_client`` requests one after another."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(c: int) -> int:
            return sum([(await request(client, prompt, max_tokens, seed + 1000 * c + j))[2] for j in range(per_client)])

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(c) for c in range(n_clients))))
        return tokens / (time.perf_counter() - start)


async def ttft_under_load(url: str, probe_prompt: str, probes: int, background: int, bg_prompt: str, max_tokens: int) -> list[float]:
    """Times to first token of ``probes`` streamed requests while ``background`` clients stream without pause."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        stop = asyncio.Event()

        async def busy(c: int) -> None:
            j = 0
            while not stop.is_set():
                await request(client, bg_prompt, max_tokens, 10_000 * c + j, stream=True)
                j += 1

        tasks = [asyncio.create_task(busy(c)) for c in range(background)]
        await asyncio.sleep(1.0)  # let every background stream get going
        times = []
        for i in range(probes):
            times.append((await request(client, probe_prompt, 4, 7 + i, stream=True))[0])
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        return times


class WritableOnly:
    """The decoder the server effectively runs: logits cut to the ids the tokenizer can write (the
    server never samples past them) and EOS biased by -100 (the requests' ``logit_bias``), so the
    peer draws exactly the server's tokens for a seed."""

    def __init__(self, decoder: CausalLMDecoder, writable: int) -> None:
        self.decoder, self.writable = decoder, writable

    @property
    def vocab_size(self) -> int:
        return self.writable

    def start(self, ids, mask=None, *, max_new_tokens=None):  # type: ignore[no-untyped-def]
        state, logits = self.decoder.start(ids, mask, max_new_tokens=max_new_tokens)
        return state, self._cut(logits)

    def step(self, tokens, state):  # type: ignore[no-untyped-def]
        return self._cut(self.decoder.step(tokens, state))

    def _cut(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits[:, : self.writable].float().clone()
        logits[:, EOS_ID] -= 100  # the requests' logit_bias
        return logits

    def reorder(self, state, index):  # type: ignore[no-untyped-def]
        self.decoder.reorder(state, index)


def in_process_latency(served: ServedModel, prompt: str, max_tokens: int, seed: int) -> tuple[float, int]:
    """``generate`` in this process, one request: (seconds, tokens generated)."""
    ids = torch.tensor([served.src_tokenizer.encode(prompt)])
    decoder = WritableOnly(CausalLMDecoder(served.model), served.tgt_tokenizer.vocab_size)  # type: ignore[arg-type]
    start = time.perf_counter()
    out = generate(decoder, ids, None, GenerationConfig(max_new_tokens=max_tokens), generator=torch.Generator().manual_seed(seed))
    served.tgt_tokenizer.decode(out.sequences()[0])
    return time.perf_counter() - start, int(out.lengths[0])


def gpt2_shaped(work_dir: Path, reference: str) -> str:
    """GPT-2 small's shapes (124M parameters, vocabulary 50257), random weights, the Shakespeare character tokenizer."""
    from aiayn import build_model
    from aiayn.pretrained import load_pretrained, save_pretrained

    target = work_dir / "gpt2-shaped"
    if not (target / "model.safetensors").is_file():
        tokenizer = load_pretrained(reference).tgt_tokenizer
        torch.manual_seed(0)
        save_pretrained(target, build_model("gpt2-small").eval(), tokenizer, overwrite=True)
    return str(target)


def load_avg() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip().split("load average:")[-1].strip()


def run(checkpoint: str, name: str, args: argparse.Namespace) -> Result:
    result = Result(name, load_avg())
    served = load_served_model(checkpoint)
    context = served.config.max_len
    long_prompt = "ROMEO:\nBut soft, what light through yon window breaks? It is the east"
    probe = long_prompt[: min(32, context - 4)]
    assert len(served.src_tokenizer.encode(probe)) == len(probe)
    max_tokens = min(args.max_tokens, context)  # the prompt is one token
    proc, url = start_server(checkpoint, args.max_batch, args.threads)
    try:
        asyncio.run(throughput(url, 1, 1, "\n", 4, 0))  # warm up
        for r in range(args.rounds):
            result.single_tok_s.append(asyncio.run(throughput(url, 1, args.per_client, "\n", max_tokens, r)))
            result.batched_tok_s.append(asyncio.run(throughput(url, args.clients, args.per_client, "\n", max_tokens, r)))
            print(f"  round {r}: 1 client {result.single_tok_s[-1]:.1f} tok/s, {args.clients} clients {result.batched_tok_s[-1]:.1f} tok/s", flush=True)
        for r in range(args.rounds):
            seconds, tokens = in_process_latency(served, "\n", max_tokens, r)
            result.in_process_latency_s.append(seconds)
            seconds, served_tokens = asyncio.run(_single(url, "\n", max_tokens, r))
            result.server_latency_s.append(seconds)
            if served_tokens != tokens:
                raise RuntimeError(f"the server generated {served_tokens} tokens, generate {tokens}: the latencies are not comparable")
            result.tokens_per_request.append(tokens)
    finally:
        proc.terminate()
        proc.wait(60)
    if args.ttft:
        proc, url = start_server(checkpoint, 2 * args.clients, args.threads)  # room for the probe beside the 8 streams
        try:
            result.ttft_alone_s = asyncio.run(ttft_under_load(url, probe, args.probes, 0, "\n", max_tokens))
            result.ttft_loaded_s = asyncio.run(ttft_under_load(url, probe, args.probes, args.clients, "\n", max_tokens))
        finally:
            proc.terminate()
            proc.wait(60)
    return result


async def _single(url: str, prompt: str, max_tokens: int, seed: int) -> tuple[float, int]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        _, total, tokens = await request(client, prompt, max_tokens, seed)
        return total, tokens


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="/work/runs/shakespeare-char", help="a decoder-only model to serve")
    parser.add_argument("--gpt2-shaped", action="store_true", help="serve a GPT-2-small-shaped model (random weights, the checkpoint's tokenizer) instead of the checkpoint")
    parser.add_argument("--work-dir", type=Path, default=Path("runs/serve-bench"), help="where the GPT-2-shaped model is saved")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=2, help="requests each client sends, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads, in the server and in process (default: 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probes", type=int, default=20, help="time-to-first-token samples")
    parser.add_argument("--no-ttft", dest="ttft", action="store_false")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 2 clients, 8 tokens, 3 probes")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.clients, args.per_client, args.max_tokens, args.probes = 1, 2, 1, 8, 3
    models = [(args.checkpoint, Path(args.checkpoint).name)]
    if args.gpt2_shaped:  # instead of the checkpoint, whose tokenizer it borrows
        models = [(gpt2_shaped(args.work_dir, args.checkpoint), "gpt2-small-shaped")]
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    results = []
    for checkpoint, name in models:
        print(f"{name}: load average {load_avg()}", flush=True)
        results.append(run(checkpoint, name, args))
        summary = results[-1].summary()
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()) + f" (load average after: {load_avg()})", flush=True)
    torch.set_num_threads(threads)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.out, json.dumps([{**asdict(r), "summary": r.summary()} for r in results], indent=1).encode())
    return results


if __name__ == "__main__":
    main()
