"""Tiny Hugging Face models built locally with random weights (no download), and comparison helpers."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip("transformers")  # a test-only dependency

VOCAB = 61
ATOL = 1e-4  # fp32 logits

# Token ids for the tiny models (inside the vocabulary).
BOS, EOS, PAD = 1, 2, 60


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Replace the (small) default init by weights large enough that a wrong mapping shows.

    Norm gains near 1, everything else normal(0, 0.3). Marian's sinusoid "embedding" is left alone:
    it is a function of the shape, not a weight.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(param.shape, generator=generator)
            is_norm_gain = ("LayerNorm" in name or "ln_" in name or "layer_norm" in name) and name.endswith("weight")
            param.copy_(1.0 + 0.1 * noise if is_norm_gain else 0.3 * noise)
    return model.eval()


def gpt2(seed: int = 0, **overrides) -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=40, n_embd=24, n_layer=3, n_head=4, n_inner=40, bos_token_id=BOS,
        eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides,
    )
    torch.manual_seed(seed)
    return randomize(transformers.GPT2LMHeadModel(config), seed)


def bert(cls_name: str = "BertForMaskedLM", seed: int = 0, **overrides) -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=24, num_hidden_layers=3, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=0, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, **overrides,
    )
    torch.manual_seed(seed)
    return randomize(getattr(transformers, cls_name)(config), seed)


def marian(seed: int = 0, **overrides) -> nn.Module:
    settings = dict(
        vocab_size=VOCAB, d_model=24, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=64,
        activation_function="gelu", scale_embedding=True, pad_token_id=PAD, decoder_start_token_id=PAD,
        eos_token_id=EOS, forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    return randomize(transformers.MarianMTModel(transformers.MarianConfig(**settings)), seed)


def bart(seed: int = 0, **overrides) -> nn.Module:
    """A tiny random BART, its learned positions and embedding norms randomized too."""
    settings = dict(
        vocab_size=VOCAB, d_model=24, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=64,
        activation_function="gelu", pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
        decoder_start_token_id=EOS, forced_bos_token_id=None, forced_eos_token_id=None,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = randomize(transformers.BartForConditionalGeneration(transformers.BartConfig(**settings)), seed)
    with torch.no_grad():
        for stack in (model.model.encoder, model.model.decoder):
            stack.embed_positions.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
    return model


def token_ids(batch: int, length: int, seed: int, low: int = 3, high: int = VOCAB - 1) -> Tensor:
    """Random ids avoiding the special ids 0..2 and PAD, so no mask is derived by accident."""
    return torch.randint(low, high, (batch, length), generator=torch.Generator().manual_seed(seed))


def right_padded(ids: Tensor, lengths: list[int], pad: int) -> tuple[Tensor, Tensor]:
    """``ids`` with positions past each row's length set to ``pad``; the mask (True = real)."""
    mask = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, pad), mask


def left_padded(ids: Tensor, lengths: list[int], pad: int) -> tuple[Tensor, Tensor]:
    mask = torch.arange(ids.shape[1])[None, :] >= (ids.shape[1] - torch.tensor(lengths))[:, None]
    return ids.masked_fill(~mask, pad), mask


def assert_close_where(
    ours: Tensor, theirs: Tensor, mask: Tensor | None = None, atol: float = ATOL, what: str = "output"
) -> None:
    """Whole-tensor comparison of ``(B, T, ...)`` outputs, at the positions ``mask (B, T)`` marks real."""
    assert ours.shape == theirs.shape, f"{what}: shapes {tuple(ours.shape)} != {tuple(theirs.shape)}"
    if mask is not None:
        ours, theirs = ours[mask], theirs[mask]
    diff = (ours - theirs).abs().max().item()
    assert diff <= atol, f"{what}: max abs difference {diff:.3g} > {atol}"


def record_layer_outputs(layers: nn.ModuleList) -> tuple[list[Tensor], list]:
    """Forward hooks that store each of our layers' output ``(B, T, D)``; returns (store, handles)."""
    store: list[Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _i, out: store.append(out[0].detach())) for layer in layers]
    return store, handles


def assert_state_dicts_equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    """Bit for bit: same keys, same dtypes, same values."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


@torch.no_grad()
def greedy(model: nn.Module, src, src_mask, start: int, eos: int, pad: int, max_new_tokens: int):
    """Greedy decoding with our encoder output computed once and the decoder's KV cache.

    Returns the tokens ``(B, L)`` and each step's logits ``(B, L, V)``.
    """
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache()
    token = torch.full((src.shape[0], 1), start)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    steps, scores = [], []
    for _ in range(max_new_tokens):
        logits = model.decode(token, memory, src_mask=src_mask, cache=cache)  # (B, 1, V)
        scores.append(logits[:, -1])
        token = logits[:, -1].argmax(-1).masked_fill(finished, pad)[:, None]
        steps.append(token)
        finished |= token[:, 0] == eos
        if bool(finished.all()):
            break
    return torch.cat(steps, dim=1), torch.stack(scores, dim=1)



def assert_translations_equal_generate(directory, hf: nn.Module, texts: list[str], max_new_tokens: int = 10) -> None:
    """``aiayn.load(directory)`` translates ``texts`` as ``hf.generate`` does on the same weights and text:
    the HF tokenizer's source ids, greedy and beam 4 (length penalty 0 on both sides: raw log-probability),
    token for token, through ``LoadedModel.translate``, ``aiayn translate`` and ``POST /v1/translations`` in process."""
    import aiayn
    from aiayn.cli.main import main
    from aiayn.decoding.text import beam_config, source_ids
    from aiayn.decoding.translate import translate_sentences

    loaded = aiayn.load(directory)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    sources = tok(texts)["input_ids"]
    assert [source_ids(loaded.src_tokenizer, t) for t in texts] == sources  # BART <s> x </s>, Marian x </s>
    assert loaded.special_ids.bos == hf.config.decoder_start_token_id
    eos = hf.config.eos_token_id
    with _translation_server(loaded) as server:
        assert server.post("/tokenize", json={"prompt": texts[0]}).json()["tokens"] == sources[0]
        for beams in (1, 4):
            with torch.no_grad():
                out = hf.generate(**tok(texts, return_tensors="pt", padding=True), num_beams=beams, do_sample=False,
                                  max_new_tokens=max_new_tokens, length_penalty=0.0, early_stopping=True)
            assert out[:, 0].tolist() == [hf.config.decoder_start_token_id] * len(texts)
            theirs = [row[: row.index(eos) + 1] if eos in row else row for row in out[:, 1:].tolist()]
            config = beam_config(loaded.tgt_tokenizer, beam_size=beams, length_penalty=0.0, max_new_tokens=max_new_tokens)
            ours = translate_sentences([loaded.model], loaded.src_tokenizer, texts, config, tgt_tokenizer=loaded.tgt_tokenizer)
            assert [h[0].tokens for h in ours] == theirs, f"num_beams={beams}"
            text = [tok.decode(row, skip_special_tokens=True) for row in theirs]
            assert loaded.translate(texts, beam_size=beams, length_penalty=0.0, max_new_tokens=max_new_tokens) == text
            with redirect_stdout(io.StringIO()) as printed:  # aiayn translate (and evaluate): the same translate_sentences
                argv = ["--beam-size", str(beams), "--length-penalty", "0", "--max-new-tokens", str(max_new_tokens), *texts]
                assert main(["translate", "--checkpoint", str(directory), *argv]) == 0
            assert printed.getvalue().splitlines() == text
            r = server.post("/v1/translations", json={"text": texts, "beam_size": beams, "length_penalty": 0.0, "max_tokens": max_new_tokens})
            assert r.status_code == 200, r.text
            assert [c["text"] for c in r.json()["choices"]] == text, f"server, beam_size={beams}"
            usage = r.json()["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (sum(map(len, sources)), sum(map(len, theirs)))


@contextmanager
def _translation_server(loaded) -> Iterator:
    """A started in-process app serving ``loaded``, stopped on exit."""
    import time

    fastapi_testclient = pytest.importorskip("fastapi.testclient", reason="needs the serve extra (pip install aiayn[serve])")
    from aiayn.serve.app import create_app
    from aiayn.serve.loading import ServedModel

    served = ServedModel(loaded.model, loaded.config, loaded.src_tokenizer, loaded.tgt_tokenizer, "m", loaded.labels)
    with fastapi_testclient.TestClient(create_app(lambda: served, max_batch=4)) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").text
            time.sleep(0.02)
        yield client
