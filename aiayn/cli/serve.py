"""``aiayn serve``: an OpenAI-compatible HTTP server for a checkpoint (needs ``pip install aiayn[serve]``)."""

from __future__ import annotations

import argparse
import socket
import sys

from aiayn.cli.args import device, finite_float
from aiayn.cli.inference import add_kv_cache_argument, add_pack_argument, add_quantize_argument
from aiayn.decoding.speculative import DEFAULT_DRAFT_TOKENS, DEFAULT_NGRAM
from aiayn.inference.precision import DTYPE_CHOICES, parse_kv_dtype

HEADER_TIMEOUT = 10.0  # seconds for a request line and headers: real clients send them in one packet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="a saved model directory, a training checkpoint, or a run directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="weights' dtype; bf16 means bfloat16 (default: float32)")
    parser.add_argument("--device", default="cpu", type=device, help="device to run on, checked before listening (default: cpu)")
    add_quantize_argument(parser)
    add_pack_argument(parser)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's choice)")
    parser.add_argument("--max-batch", type=int, default=8, help="sequences decoded together in one step (default: 8)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a slot; more get 429 (default: 64)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body; larger gets 413 (default: 1 MiB)")
    parser.add_argument("--body-timeout", type=finite_float, default=30.0,
                        help="seconds a request's whole body may take to arrive; later gets 408 and the connection closes (default: 30)")
    parser.add_argument("--header-timeout", type=finite_float, default=HEADER_TIMEOUT,
                        help="seconds a connection may take to send a request's line and headers, after it opens or after "
                             f"its last response; later it is closed (default: {HEADER_TIMEOUT:g})")
    parser.add_argument("--max-connections", type=int, default=512,
                        help="connections open at once; a request past it gets 503 (default: 512)")
    parser.add_argument("--model-name", default=None, help="the model's id in the API (default: the checkpoint directory's name)")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="on SIGTERM/Ctrl-C, seconds to let running requests finish before cancelling them (default: 10)")
    parser.add_argument("--speculative", choices=("prompt-lookup",), default=None,
                        help="decoder-only: speculative decoding with prompt-lookup drafts, one sequence at a time "
                             "(--max-batch becomes 1); the same tokens as without (default: off)")
    parser.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, metavar="K",
                        help=f"--speculative: draft tokens checked per forward, >= 1 (default: {DEFAULT_DRAFT_TOKENS})")
    parser.add_argument("--ngram", type=int, default=DEFAULT_NGRAM, metavar="N",
                        help=f"--speculative: the longest n-gram looked up, >= 1 (default: {DEFAULT_NGRAM})")
    add_kv_cache_argument(parser)


def run(args: argparse.Namespace) -> int:
    for name in ("max_batch", "max_queue", "max_body_bytes", "max_connections", "draft_tokens", "ngram",
                 *(("threads",) if args.threads is not None else ())):
        if getattr(args, name) < 1:
            raise SystemExit(f"aiayn serve: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"aiayn serve: --port must be in [0, 65535], got {args.port}")
    if args.shutdown_timeout < 0:
        raise SystemExit(f"aiayn serve: --shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    for name in ("body_timeout", "header_timeout"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"aiayn serve: --{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    try:
        from aiayn.serve.app import create_app
        from aiayn.serve.loading import load_served_model
        from aiayn.serve.server import Server as _Server
        from aiayn.serve.server import server_config
    except ImportError as e:
        raise SystemExit(f"aiayn serve: needs the serve extra ({e}): pip install 'aiayn[serve]'") from None

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        raise SystemExit(f"aiayn serve: cannot listen on --host {args.host} --port {args.port}: {e}") from None
    sock.listen(2048)  # listen before saying so: a client that connects at once waits in the backlog, not refused
    failed: list[BaseException] = []
    server: _Server | None = None

    def load_failed(error: BaseException) -> None:
        failed.append(error)
        print(f"aiayn serve: error: --checkpoint {args.checkpoint}: {error}", file=sys.stderr, flush=True)
        if server is not None:
            server.should_exit = True

    app = create_app(
        lambda: load_served_model(args.checkpoint, dtype=args.dtype, device=args.device, name=args.model_name, pack=args.pack,
                                  quantize=args.quantize),
        max_batch=args.max_batch, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes, on_load_error=load_failed,
        body_timeout=args.body_timeout,
        speculative=None if args.speculative is None else {"speculative": args.speculative, "draft_tokens": args.draft_tokens, "ngram": args.ngram},
        kv_dtype=parse_kv_dtype(args.kv_cache_dtype, name="--kv-cache-dtype"),
    )
    server = _Server(server_config(app, header_timeout=args.header_timeout, max_connections=args.max_connections,
                                   log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout, access_log=False))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"aiayn serve: listening on http://{shown}:{port} (loading {args.checkpoint}; /health says when it is ready)", flush=True)
    server.run(sockets=[sock])
    print("aiayn serve: stopped", flush=True)
    return 1 if failed else 0
