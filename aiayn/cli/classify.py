"""``aiayn classify``: the class of each text, with an encoder-only checkpoint that has a classifier."""

from __future__ import annotations

import argparse

from aiayn.cli.inference import add_checkpoint_arguments, batches, check_at_least, load_model_for, read_texts, saved_train_config
from aiayn.decoding.text import classify_texts
from aiayn.models.encoder_only import EncoderOnly


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to classify (default: one per line of stdin)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts classified together (default: 32)")


def run(args: argparse.Namespace) -> int:
    check_at_least("classify", args, "batch_size", 1)
    loaded, tokenizer, _ = load_model_for("classify", args, EncoderOnly, "an encoder-only model")
    trained = saved_train_config(loaded.path)
    if trained is not None and trained.data.task == "mlm":
        raise SystemExit(f"aiayn classify: --checkpoint {args.checkpoint} was trained only as a masked LM: its classifier head "
                         f"was never trained, so its labels would be noise. Fine-tune it first (aiayn train sst2), "
                         f"or use fill-mask")
    texts = read_texts("classify", args.text)
    for chunk in batches(texts, args.batch_size):
        try:
            result = classify_texts(loaded.model, tokenizer, chunk, batch_size=args.batch_size, device=args.device)  # type: ignore[arg-type]
        except ValueError as e:
            raise SystemExit(f"aiayn classify: {e}") from None
        names = loaded.labels or [str(i) for i in range(result.probs.shape[1])]  # names where the checkpoint knows them
        for text, label, probs in zip(chunk, result.labels.tolist(), result.probs.tolist()):
            print(f"{names[label]}\t{probs[label]:.4f}\t{text}")
    return 0
