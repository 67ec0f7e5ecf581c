"""llama.cpp as a peer of benchmarks/generation.py: a Hugging Face GPT-2 directory llama.cpp's converter
accepts, and llama-bench's tokens/s for each GGUF format.

llama-bench and the GGUF files come from ``benchmarks/llama_cpp.sh`` (build, convert); this module
only finds and runs them, so the benchmark prints how to build when they are absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from torch import nn

SCRIPT = Path(__file__).resolve().parent / "llama_cpp.sh"
HOME = Path(os.environ.get("AIAYN_LLAMA_CPP", Path.home() / ".cache" / "aiayn" / "llama.cpp"))
# GGUF type -> the variants of ours it is compared with (the best of them counts)
FORMATS = {  # -kvbf16, -kvfp32: the static cache's keys and values in bf16 (llama.cpp keeps its cache in fp16 by
    # default) or fp32; the first of each, the default load, takes "auto" (bf16 for int8 and int4, fp32 for fp32 weights)
    "f32": ("ours-fp32", "ours-fp32-unpacked", "ours-fp32-compiled", "ours-fp32-small-pages", "ours-fp32-kvbf16"),
    "bf16": ("ours-bf16", "ours-bf16-compiled", "ours-bf16-small-pages"),
    "q8_0": ("ours-int8", "ours-int8-compiled", "ours-int8dyn", "ours-int8dyn-compiled", "ours-int8-small-pages",  # Q8_0 quantises activations too
             "ours-int8-kvbf16", "ours-int8-kvfp32"),
    "q4_0": ("ours-int4", "ours-int4-compiled", "ours-int4-small-pages", "ours-int4-kvbf16", "ours-int4-kvfp32"),
}
TARGETS = {"f32": 1.0, "bf16": 1.1, "q8_0": 1.2, "q4_0": 1.0}
def find_llama_bench(explicit: str | None = None) -> Path | None:
    """llama-bench from ``--llama-bench``, $PATH, or what ``llama_cpp.sh build`` made; ``None`` if none."""
    if explicit:
        return Path(explicit)
    on_path = shutil.which("llama-bench")
    if on_path:
        return Path(on_path)
    built = sorted(HOME.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-bench"))
    return built[-1] if built else None


def byte_level_bpe(vocab_size: int, seed: int = 0):  # -> tokenizers.Tokenizer
    """A GPT-2-style byte-level BPE of exactly ``vocab_size`` ids, the last ``<|endoftext|>``: random but
    valid merges (llama.cpp's speed depends on the vocabulary's size, not on its words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    alphabet.sort()
    tokens = list(alphabet)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    rng = random.Random(seed)
    while len(tokens) < vocab_size - 1:
        a, b = tokens[rng.randrange(len(tokens))], tokens[rng.randrange(len(alphabet))]
        if a + b in vocab or len(a + b) > 12:
            continue
        merges.append((a, b))
        vocab[a + b] = len(tokens)
        tokens.append(a + b)
    vocab["<|endoftext|>"] = len(tokens)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def save_gpt2_dir(peer: nn.Module, path: Path) -> Path:
    """``peer`` (a ``GPT2LMHeadModel``) with a byte-level BPE of its vocabulary size, as a Hugging Face directory."""
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    peer.save_pretrained(path)
    tok = byte_level_bpe(peer.config.vocab_size)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>").save_pretrained(path)
    return path


def gguf_files(peer: nn.Module, cache: Path = HOME / "models") -> dict[str, Path]:
    """GGUF type -> file of ``peer``'s weights, converted once per weights (cached by their hash)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(peer.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().flatten()[:4096].numpy().tobytes())  # enough to tell seeds and shapes apart
    out = cache / digest.hexdigest()[:16]
    files = {fmt: out / f"model-{fmt}.gguf" for fmt in FORMATS}
    if not all(f.exists() for f in files.values()):
        hf = save_gpt2_dir(peer, out / "hf")
        env = {**os.environ, "PYTHON": sys.executable}  # the converter needs this interpreter's torch and numpy
        log = out / "convert.log"  # the converter's per-tensor lines: kept, shown only if it fails
        with open(log, "w") as f:
            done = subprocess.run(["bash", str(SCRIPT), "convert", str(hf), str(out)], stdout=f, stderr=subprocess.STDOUT, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"llama.cpp's conversion failed (exit {done.returncode}); its log, {log}:\n{log.read_text()[-3000:]}")
    return files


def llama_bench_tokens_per_s(bench: Path, gguf: Path, threads: int, prompt: int, new_tokens: int, repetitions: int) -> float:
    """llama-bench's mean generation rate (``-n``) for ``gguf`` on ``threads`` threads, tokens/s, after ``prompt`` tokens
    in its cache (``-d``, as ours generates after its prompt: without it llama-bench generates from an empty cache)."""
    return _llama_bench_rate(bench, gguf, threads, ["-p", "0", "-d", str(prompt), "-n", str(new_tokens)], repetitions, "n_gen")


def llama_bench_prompt_tokens_per_s(bench: Path, gguf: Path, threads: int, prompt: int, repetitions: int) -> float:
    """llama-bench's mean prompt-processing rate (``-p``) for ``gguf``: ``prompt`` tokens into an empty cache, tokens/s
    (a prompt's forward, as our prefill is)."""
    return _llama_bench_rate(bench, gguf, threads, ["-p", str(prompt), "-n", "0"], repetitions, "n_prompt")


def _llama_bench_rate(bench: Path, gguf: Path, threads: int, test: list[str], repetitions: int, kind: str) -> float:
    """The ``avg_ts`` of the one test llama-bench runs with ``test`` (its -p, -n, -d), whose ``kind`` (n_gen or n_prompt)
    is the only count above 0. ``--repack 0``: llama.cpp's Q8_0 repacking crashed on the Intel machine (issue 27)."""
    cmd = [str(bench), "-m", str(gguf), "-t", str(threads), *test, "-r", str(repetitions), "--repack", "0", "-o", "json"]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    other = "n_prompt" if kind == "n_gen" else "n_gen"
    rows = [r for r in json.loads(result.stdout) if r.get(kind, 0) > 0 and r.get(other, 0) == 0]
    if not rows:
        raise RuntimeError(f"llama-bench printed no {kind} row: {result.stdout[:500]}")
    return float(rows[0]["avg_ts"])
