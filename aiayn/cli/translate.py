"""``aiayn translate``: translate text with an encoder-decoder checkpoint (beam search, section 6.1)."""

from __future__ import annotations

import argparse
import sys

from aiayn.cli.args import finite_float
from aiayn.cli.inference import add_checkpoint_arguments, check_at_least, load_ensemble, read_texts
from aiayn.decoding.beam import BeamConfig
from aiayn.decoding.translate import translate_sentences
from aiayn.models.encoder_decoder import EncoderDecoder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser, ensemble=True)
    parser.add_argument("text", nargs="*", metavar="TEXT", help="sentences to translate (default: one per line of stdin)")
    parser.add_argument("--beam-size", type=int, default=None,
                        help="beam size; 1 = greedy (default: the model's decode.beam_size, else 4 as in section 6.1)")
    parser.add_argument("--length-penalty", type=finite_float, default=None,
                        help="alpha of the GNMT length penalty ((5 + len) / 6)^alpha (default: the model's decode.length_penalty, else 0.6)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="longest output in tokens (default: source length + 50, section 6.1)")
    parser.add_argument("--n-best", type=int, default=1,
                        help="hypotheses to print per sentence, as INDEX<TAB>SCORE<TAB>TEXT (default: 1, text only)")
    parser.add_argument("--batch-size", type=int, default=16, help="sentences decoded together, grouped by length (default: 16)")


def run(args: argparse.Namespace) -> int:
    for name in ("beam_size", "n_best", "batch_size", "max_new_tokens"):
        check_at_least("translate", args, name, 1)
    if args.beam_size is not None and args.n_best > args.beam_size:
        raise SystemExit(f"aiayn translate: --n-best must be <= --beam-size={args.beam_size}, got {args.n_best}")
    members = load_ensemble("translate", args, EncoderDecoder, "an encoder-decoder model")
    beam = members[0].decode.beam(args.beam_size, args.length_penalty)
    if args.n_best > beam["beam_size"]:
        raise SystemExit(f"aiayn translate: --n-best must be <= the beam size, {beam['beam_size']} (the model's "
                         f"decode.beam_size; give --beam-size), got {args.n_best}")
    config = BeamConfig(**beam, max_new_tokens=args.max_new_tokens, n_best=args.n_best)
    texts = read_texts("translate", args.text)
    empty = [i + 1 for i, text in enumerate(texts) if not text.strip()]
    if empty and len(empty) == len(texts):
        raise SystemExit("aiayn translate: the input is empty: nothing to translate")
    if empty:
        print(f"aiayn translate: warning: input {', '.join(map(str, empty))} is empty; its translation is left empty",
              file=sys.stderr)
    src_tok, tgt_tok = members[0].src_tokenizer, members[0].tgt_tokenizer
    assert src_tok is not None and tgt_tok is not None  # load_ensemble checked
    try:
        results = translate_sentences([m.model for m in members], members[0].src_tokenizer, texts, config,  # type: ignore[misc,arg-type]
                                      tgt_tokenizer=members[0].tgt_tokenizer, batch_size=args.batch_size,
                                      progress=len(texts) > args.batch_size)
    except ValueError as e:
        raise SystemExit(f"aiayn translate: {e}") from None
    for index, hypotheses in enumerate(results):
        if args.n_best == 1:
            print(tgt_tok.decode(hypotheses[0].tokens) if hypotheses else "")
        else:
            for hyp in hypotheses:
                print(f"{index}\t{hyp.score:.4f}\t{tgt_tok.decode(hyp.tokens)}")
    return 0
