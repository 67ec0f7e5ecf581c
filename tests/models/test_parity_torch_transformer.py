"""The Post-LN encoder-decoder against torch.nn.Transformer with copied weights (ReLU, dropout 0)."""

import pytest
import torch
from torch import nn

from aiayn.models import EncoderDecoder, EncoderDecoderConfig
from aiayn.nn.masks import padding_mask_from_lengths

D_MODEL, HEADS, D_FF = 32, 4, 64


def copy_attention(ours, ref):
    w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
    b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
    for lin, w, b in ((ours.w_q, w_q, b_q), (ours.w_k, w_k, b_k), (ours.w_v, w_v, b_v), (ours.w_o, ref.out_proj.weight, ref.out_proj.bias)):
        lin.weight.copy_(w)
        lin.bias.copy_(b)


def copy_norm(ours, ref):
    ours.weight.copy_(ref.weight)
    ours.bias.copy_(ref.bias)


def copy_ffn(ours, ref_layer):
    ours.w_1.weight.copy_(ref_layer.linear1.weight)
    ours.w_1.bias.copy_(ref_layer.linear1.bias)
    ours.w_2.weight.copy_(ref_layer.linear2.weight)
    ours.w_2.bias.copy_(ref_layer.linear2.bias)


@torch.no_grad()
def copy_transformer(model: EncoderDecoder, ref: nn.Transformer) -> None:
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_ffn(ours.ffn, theirs)
        copy_norm(ours.self_attn_norm, theirs.norm1)
        copy_norm(ours.ffn_norm, theirs.norm2)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        copy_ffn(ours.ffn, theirs)
        copy_norm(ours.self_attn_norm, theirs.norm1)
        copy_norm(ours.cross_attn_norm, theirs.norm2)
        copy_norm(ours.ffn_norm, theirs.norm3)
    copy_norm(model.encoder.norm, ref.encoder.norm)
    copy_norm(model.decoder.norm, ref.decoder.norm)


def build_pair():
    torch.manual_seed(0)
    ref = nn.Transformer(D_MODEL, HEADS, 2, 2, D_FF, dropout=0.0, batch_first=True)
    for p in ref.parameters():  # random everything, biases and norm gains included
        nn.init.normal_(p, std=0.3)
    # torch.nn.Transformer ends each stack with a LayerNorm even in Post-LN mode: final_norm=True.
    config = EncoderDecoderConfig(
        vocab_size=50, d_model=D_MODEL, n_heads=HEADS, d_ff=D_FF, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, final_norm=True,
    )
    model = EncoderDecoder(config)
    copy_transformer(model, ref)
    # train mode keeps torch off its nested-tensor fast path (which zeroes padded rows); dropout is 0
    return model.train(), ref.train()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_stacks_match_torch_transformer(backend):
    model, ref = build_pair()
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        for attn in (layer.self_attn, layer.cross_attn):
            if attn is not None:
                attn.backend = backend
    src, tgt = torch.randn(3, 7, D_MODEL), torch.randn(3, 5, D_MODEL)
    src_pad = padding_mask_from_lengths(torch.tensor([7, 5, 2]), 7)
    tgt_pad = padding_mask_from_lengths(torch.tensor([5, 5, 3]), 5)
    expected = ref(
        src, tgt, tgt_mask=~torch.ones(5, 5, dtype=torch.bool).tril(),
        src_key_padding_mask=~src_pad, tgt_key_padding_mask=~tgt_pad, memory_key_padding_mask=~src_pad,
    )  # torch.nn: True = blocked, the opposite of ours
    memory, _ = model.encoder(src, mask=src_pad[:, None, None, :])
    out, _ = model.decoder(tgt, mask=tgt_pad[:, None, None, :], memory=memory, memory_mask=src_pad[:, None, None, :])
    expected_memory = ref.encoder(src, src_key_padding_mask=~src_pad)
    real_src = src_pad[:, :, None]
    torch.testing.assert_close(memory * real_src, expected_memory * real_src, atol=1e-5, rtol=1e-5)
    real_tgt = tgt_pad[:, :, None]
    torch.testing.assert_close(out * real_tgt, expected * real_tgt, atol=1e-5, rtol=1e-5)


def test_full_model_uses_the_same_stacks():
    """The embedding path: scaled embeddings + sinusoids into the stacks, tied output projection."""
    model, _ = build_pair()
    model.eval()
    src, tgt = torch.randint(1, 50, (2, 6)), torch.randint(1, 50, (2, 4))
    from aiayn.nn.positional import sinusoid_table

    x_src = model.src_embed.weight[src] * D_MODEL**0.5 + sinusoid_table(6, D_MODEL)
    x_tgt = model.tgt_embed.weight[tgt] * D_MODEL**0.5 + sinusoid_table(4, D_MODEL)
    memory, _ = model.encoder(x_src)
    hidden, _ = model.decoder(x_tgt, memory=memory)
    expected = hidden @ model.src_embed.weight.T  # three-way tying: one table
    torch.testing.assert_close(model(src, tgt), expected, atol=1e-5, rtol=1e-5)
