#!/usr/bin/env bash
# llama.cpp as the peer of benchmarks/generation.py: build its llama-bench and llama-quantize from the
# tree that the llama-cpp-python sdist vendors (PyPI is the only registry these machines reach), and
# convert a Hugging Face GPT-2 directory to GGUF in F32, BF16, Q8_0 and Q4_0 with llama.cpp's own
# convert_hf_to_gguf.py.
#
#   benchmarks/llama_cpp.sh build                 # ~15 min on 2 cores; prints the llama-bench path
#   benchmarks/llama_cpp.sh convert HF_DIR OUT    # OUT/model-{f32,bf16,q8_0,q4_0}.gguf
#
# Where it builds: $AIAYN_LLAMA_CPP, else ~/.cache/aiayn/llama.cpp. benchmarks/generation.py finds
# llama-bench there (or via --llama-bench PATH) and skips the llama.cpp column, saying how to build,
# when it is absent. Never run by make test.
set -euo pipefail

HOME_DIR="${AIAYN_LLAMA_CPP:-$HOME/.cache/aiayn/llama.cpp}"
PY="${PYTHON:-python3}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"  # the sdist whose vendored llama.cpp was measured

src_dir() { echo "$HOME_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"; }

build() {
  mkdir -p "$HOME_DIR"
  if [ ! -d "$(src_dir)" ]; then
    "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$HOME_DIR"
    tar -xzf "$HOME_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$HOME_DIR"
  fi
  local src; src="$(src_dir)"
  # GGML_NATIVE: the kernels of the CPU that builds (AVX2, AVX-512, AVX512-BF16, AMX as it has them),
  # which is also the CPU the benchmark runs on.
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$src/build" --target llama-bench llama-quantize -j "$(nproc)"
  echo "$src/build/bin/llama-bench"
}

convert() {
  local hf="$1" out="$2" src; src="$(src_dir)"
  [ -x "$src/build/bin/llama-quantize" ] || { echo "llama.cpp is not built: run $0 build" >&2; exit 2; }
  mkdir -p "$out"
  # Two things the converter needs that a Hugging Face GPT-2 directory lacks:
  # - config.json's n_ctx (older GPT-2 configs had it; transformers writes n_positions only);
  # - a pre-tokenizer it knows: it refuses a BPE tokenizer whose hash is not in its table, so the
  #   wrapper below declares GPT-2's ("gpt-2"), which is what the benchmark's byte-level BPE is.
  "$PY" - "$hf" "$out" "$src" <<'EOF'
import json, runpy, sys
from pathlib import Path
hf, out, src = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
config = json.loads((hf / "config.json").read_text())
if "n_ctx" not in config:
    config["n_ctx"] = config["n_positions"]
    (hf / "config.json").write_text(json.dumps(config, indent=2))
sys.path.insert(0, str(src / "gguf-py"))
sys.path.insert(0, str(src))
import convert_hf_to_gguf as conv
try:  # where the vendored tree defines TextModel (its layout moved between releases)
    from conversion.base import TextModel
except ImportError:
    TextModel = conv.TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for outtype in ("f32", "bf16", "q8_0"):
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", outtype, "--outfile", str(out / f"model-{outtype}.gguf")]
    conv.main()
EOF
  "$src/build/bin/llama-quantize" "$out/model-f32.gguf" "$out/model-q4_0.gguf" Q4_0 >"$out/quantize.log" 2>&1 \
    || { cat "$out/quantize.log" >&2; exit 1; }
  ls "$out"/model-*.gguf
}

case "${1:-}" in
  build) build ;;
  convert) [ $# -eq 3 ] || { echo "usage: $0 convert HF_DIR OUT_DIR" >&2; exit 2; }; convert "$2" "$3" ;;
  *) echo "usage: $0 build | convert HF_DIR OUT_DIR" >&2; exit 2 ;;
esac
