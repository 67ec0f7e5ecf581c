"""Is the data pipeline the bottleneck of training? Batches/s of the pipeline alone vs steps/s of a
training step, in the same process, on Multi30k de-en with a shared BPE and token-budget batches.

The model is a small stand-in built from ``torch.nn.Transformer`` (embeddings + output projection),
so the script does not depend on the library's own model. The ratio printed at the end is
pipeline batches/s divided by training steps/s: above 1, the pipeline keeps up.

    python benchmarks/data_pipeline.py --data-dir ../shared/data
    python benchmarks/data_pipeline.py --data-dir ../shared/data --max-tokens 4000 --workers 2
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from aiayn.cpu import cpu_summary
from aiayn.data import (
    ResumableLoader,
    TokenBudgetBatchSampler,
    TranslationBatch,
    TranslationDataset,
    collate_translation,
    load_multi30k,
)
from aiayn.tokenization import PAD_ID, BPETokenizer


class StandIn(nn.Module):
    """Shared embeddings -> torch.nn.Transformer -> vocabulary logits (no positions: timing only)."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.transformer = nn.Transformer(
            d_model, n_heads, n_layers, n_layers, d_ff, dropout=0.1, batch_first=True
        )
        self.out = nn.Linear(d_model, vocab_size)

    def forward(self, batch: TranslationBatch) -> torch.Tensor:
        T = batch.tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.bool)  # True = blocked
        h = self.transformer(
            self.embed(batch.src),
            self.embed(batch.tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=~batch.src_mask,  # torch.nn uses True = padding: flip our convention
            tgt_key_padding_mask=~batch.tgt_mask,
            memory_key_padding_mask=~batch.src_mask,
        )
        return self.out(h)  # (B, T, V)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="data root (default: $AIAYN_DATA_DIR, cache, download)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=25000, help="token budget per side (paper: 25000)")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2, help="pipeline epochs to time")
    p.add_argument("--model-steps", type=int, default=3, help="timed training steps (after one warm-up)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=512)
    args = p.parse_args()
    torch.manual_seed(0)

    pairs = load_multi30k("train", data_dir=args.data_dir)
    t0 = time.perf_counter()
    tok = BPETokenizer.train([*pairs.src, *pairs.tgt], args.vocab_size, length=2 * len(pairs))
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    dataset = TranslationDataset.encode(pairs, tok, tok, max_len=args.max_len, too_long="drop")
    t_encode = time.perf_counter() - t0
    plan = TokenBudgetBatchSampler([dataset.src_lengths, dataset.tgt_lengths], args.max_tokens, seed=0)
    loader = ResumableLoader(dataset, plan, collate_translation, num_workers=args.workers)

    n_batches = n_tokens = 0
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        for batch in loader:
            n_batches += 1
            n_tokens += batch.src.numel() + batch.tgt_in.numel()
    t_pipe = time.perf_counter() - t0
    pipe_rate = n_batches / t_pipe

    model = StandIn(tok.vocab_size, args.d_model, args.n_heads, args.n_layers, args.d_ff)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_ID)
    batches = iter(_forever(loader))
    t_steps = 0.0
    for step in range(args.model_steps + 1):
        batch = next(batches)
        t0 = time.perf_counter()
        logits = model(batch)
        loss = loss_fn(logits.flatten(0, 1), batch.tgt_out.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step > 0:  # the first step is warm-up
            t_steps += time.perf_counter() - t0
    step_rate = args.model_steps / t_steps

    n_params = sum(p.numel() for p in model.parameters())
    print(f"CPU: {cpu_summary()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"multi30k train: {len(pairs)} pairs, {len(dataset)} kept (max_len={args.max_len}), "
          f"shared BPE {tok.vocab_size} ids trained in {t_train:.2f} s, encoded in {t_encode:.2f} s")
    print(f"budget {args.max_tokens} tokens/side: {len(loader)} batches/epoch, "
          f"{len(dataset) / len(loader):.0f} pairs/batch on average")
    print(f"pipeline ({args.workers} workers): {n_batches} batches in {t_pipe:.3f} s = {pipe_rate:.1f} batches/s "
          f"({n_tokens / t_pipe:,.0f} padded tokens/s)")
    print(f"stand-in nn.Transformer ({n_params / 1e6:.1f} M params, d_model={args.d_model}, "
          f"{args.n_layers}+{args.n_layers} layers): {args.model_steps} steps in {t_steps:.2f} s = {step_rate:.3f} steps/s")
    print(f"ratio pipeline/training = {pipe_rate / step_rate:.0f}x (above 1: the pipeline is not the bottleneck)")


def _forever(loader: ResumableLoader):
    while True:
        yield from loader


if __name__ == "__main__":
    main()
