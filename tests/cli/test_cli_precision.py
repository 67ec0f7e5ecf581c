"""--dtype, --quantize and --compile on the inference commands, and aiayn quantize: the flags reach the
model, a quantised directory loads back, and bad values are named with the accepted choices."""

import pytest
import torch

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.inference import Int8Linear
from aiayn.pretrained import QUANTIZATION_FILE, load_pretrained, save_pretrained
from aiayn.tokenization import CharTokenizer

TEXTS = ["a cat sat", "the dog", "hello world."]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tokenizer = CharTokenizer.train(TEXTS)
    out = {}
    for preset, extra in (("tiny-decoder-only", {}), ("tiny-encoder-decoder", {}), ("tiny-encoder-only", {"n_classes": 2})):
        torch.manual_seed(0)
        model = build_model(preset, vocab_size=tokenizer.vocab_size, **extra).eval()
        out[preset] = str(save_pretrained(tmp_path_factory.mktemp(preset) / "model", model, tokenizer))
    return out


COMMANDS = {
    "generate": ("tiny-decoder-only", ["--prompt", "a", "--max-new-tokens", "4", "--greedy"]),
    "translate": ("tiny-encoder-decoder", ["--max-new-tokens", "4", "a cat"]),
    "fill-mask": ("tiny-encoder-only", ["a <mask>at"]),
    "classify": ("tiny-encoder-only", ["a cat"]),
}


@pytest.mark.parametrize("flags", [["--dtype", "float16"], ["--dtype", "bfloat16"], ["--quantize", "int8"], ["--quantize", "int8-dynamic"]])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_inference_command_takes_dtype_and_quantize(capsys, models, command, flags):
    preset, argv = COMMANDS[command]
    assert main([command, "--checkpoint", models[preset], *flags, *argv]) == 0
    assert capsys.readouterr().out.endswith("\n")  # printed (a random tiny translator may print an empty line)


@pytest.mark.parametrize(("flag", "value", "choices"), [
    ("--dtype", "float64", "'float32', 'bfloat16', 'float16'"), ("--quantize", "int3", "'none', 'int8', 'int8-dynamic', 'int4', 'int4-g64', 'int4-g128'"),
])
@pytest.mark.parametrize("command", [*COMMANDS, "evaluate"])
def test_unknown_values_name_the_flag_and_the_choices(capsys, models, command, flag, value, choices):
    with pytest.raises(SystemExit):
        main([command, "--checkpoint", models["tiny-decoder-only"], flag, value, "--split", "val"])
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid choice: '{value}'" in err and choices in err


def test_compile_where_torch_cannot_compile(capsys, models, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(SystemExit, match=r"aiayn generate: --compile: torch .* cannot compile here \(no C\+\+ compiler found\)"):
        main(["generate", "--checkpoint", models["tiny-decoder-only"], "--compile", *COMMANDS["generate"][1]])
    assert capsys.readouterr().out == ""  # refused before anything is generated


def test_kv_cache_dtype_keeps_the_static_cache_in_bf16(capsys, models, monkeypatch):
    """--kv-cache-dtype reaches the decoder's static cache (its buffers are bf16; by default, auto, bf16 for int8 and int4
    weights only), and is refused with --compile and for a dtype the cache does not keep, naming the flag."""
    from aiayn.nn.cache import StaticLayerCache

    allocated = []
    allocate = StaticLayerCache.allocate
    monkeypatch.setattr(StaticLayerCache, "allocate", lambda self, *a: allocate(self, *a) or allocated.append(self.k.dtype))
    assert main(["generate", "--checkpoint", models["tiny-decoder-only"], "--kv-cache-dtype", "bf16", *COMMANDS["generate"][1]]) == 0
    assert allocated and set(allocated) == {torch.bfloat16} and capsys.readouterr().out.startswith("a")
    for flags, want in (([], torch.float32), (["--quantize", "int8"], torch.bfloat16), (["--quantize", "int4"], torch.bfloat16),
                        (["--quantize", "int8", "--kv-cache-dtype", "fp32"], torch.float32)):  # the default, auto
        allocated.clear()
        assert main(["generate", "--checkpoint", models["tiny-decoder-only"], *flags, *COMMANDS["generate"][1]]) == 0
        assert allocated and set(allocated) == {want}, flags
    with pytest.raises(SystemExit, match=r"aiayn generate: --kv-cache-dtype bfloat16 is the C\+\+ and eager steps' KV cache, not --compile's"):
        main(["generate", "--checkpoint", models["tiny-decoder-only"], "--kv-cache-dtype", "bfloat16", "--compile", *COMMANDS["generate"][1]])
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", models["tiny-decoder-only"], "--kv-cache-dtype", "float16", *COMMANDS["generate"][1]])
    assert "argument --kv-cache-dtype: invalid choice: 'float16' (choose from 'auto', 'float32', 'bfloat16', 'fp32', 'bf16')" in capsys.readouterr().err


def test_compile_says_it_is_compiling_before_the_wait(capsys, models, monkeypatch):
    """The first decode step waits for the compiler: stderr says so (stdout stays the text). torch.compile is
    replaced by the identity here: what is tested is the message and that the run goes through."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    assert main(["generate", "--checkpoint", models["tiny-decoder-only"], "--compile", *COMMANDS["generate"][1]]) == 0
    out, err = capsys.readouterr()
    assert "--compile: compiling the one-token step" in err and "compiling" not in out and out.startswith("a")


def test_quantize_command_writes_int8_safetensors_that_load_back(capsys, models, tmp_path):
    out = tmp_path / "int8"
    assert main(["quantize", "--checkpoint", models["tiny-decoder-only"], "--to", str(out)]) == 0
    assert "MB ->" in capsys.readouterr().out and (out / QUANTIZATION_FILE).is_file()
    loaded = load_pretrained(out)
    assert any(isinstance(m, Int8Linear) for m in loaded.model.modules()) and loaded.src_tokenizer is not None
    assert main(["generate", "--checkpoint", str(out), *COMMANDS["generate"][1]]) == 0
    with pytest.raises(SystemExit, match="--to .* exists; pass --overwrite"):
        main(["quantize", "--checkpoint", models["tiny-decoder-only"], "--to", str(out)])


def test_quantize_a_model_without_kernel_names_the_flag(models, tmp_path, monkeypatch):
    from aiayn.inference import quantization

    monkeypatch.setattr(quantization, "_kernel", lambda: None)
    with pytest.raises(SystemExit, match=r"--checkpoint .*: quantize='int8' needs torch.ops.aten._weight_int8pack_mm"):
        main(["generate", "--checkpoint", models["tiny-decoder-only"], "--quantize", "int8", *COMMANDS["generate"][1]])


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_pack_reaches_the_loader(capsys, models, monkeypatch, command):
    """``--no-pack`` loads plain Linear layers: with packing made to fail, the command still runs."""
    import aiayn.pretrained as pretrained

    def refuse(model):
        raise AssertionError("packed although --no-pack was given")

    monkeypatch.setattr(pretrained, "pack_linears", refuse)
    preset, argv = COMMANDS[command]
    assert main([command, "--checkpoint", models[preset], "--no-pack", *argv]) == 0
    with pytest.raises(AssertionError, match="packed although"):  # and without the flag, it packs
        main([command, "--checkpoint", models[preset], *argv])
