"""``aiayn explain``: every stage of one forward pass as a table (shapes, parameters, FLOPs, memory)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", metavar="NAME", help="a preset name (paper-base, gpt2-small, ...)")
    model.add_argument("--config", type=Path, metavar="FILE", help="a model config JSON file (as written by config.to_json())")
    parser.add_argument("--vocab-size", type=int, help="override vocab_size")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override any config field (repeatable)")
    parser.add_argument("--batch", type=int, default=2, help="batch size B (default: 2)")
    parser.add_argument("--src-len", type=int, default=10, help="encoder input length S (encoder-decoder, encoder-only; default: 10)")
    parser.add_argument("--tgt-len", type=int, default=9, help="decoder input length T (encoder-decoder, decoder-only; default: 9)")
    parser.add_argument("--depth", type=int, default=3, help="how many calls deep to show stages (1 = the model's children; default: 3)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument("--out", type=Path, help="write the output to this file instead of standard output")


def run(args: argparse.Namespace) -> int:
    from aiayn.config_io import parse_yaml_value
    from aiayn.models.config import config_from_json
    from aiayn.models.presets import PRESETS, preset
    from aiayn.viz.explain import explain_config, format_table

    overrides = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise SystemExit(f"aiayn explain: --set needs FIELD=VALUE, got {item!r}")
        overrides[field.strip()] = parse_yaml_value(value)
    if args.vocab_size is not None:
        overrides["vocab_size"] = args.vocab_size
    try:
        if args.preset is not None:
            if args.preset not in PRESETS:
                raise SystemExit(f"aiayn explain: unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
            config = preset(args.preset, **overrides)
        else:
            config = config_from_json(args.config.read_text(encoding="utf-8"))
            if overrides:
                config = config.replace(**overrides)
        trace = explain_config(config, batch=args.batch, src_len=args.src_len, tgt_len=args.tgt_len, depth=args.depth)
    except (ValueError, OSError) as e:
        raise SystemExit(f"aiayn explain: {e}") from None
    text = trace.to_json() if args.format == "json" else format_table(trace)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0 if trace.total_params == trace.model_params else 1
