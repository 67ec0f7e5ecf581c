"""Dropout acts in training only (section 5.4): a layer's sublayer dropout and the FFN's activation dropout change
the output in training, and in eval the layer gives exactly what the same weights give without dropout (the layers
skip the identity module outside training, to save a call per sublayer at every decoding step)."""

import copy

import torch

from aiayn.nn.blocks import LayerSpec, TransformerLayer
from aiayn.nn.feedforward import PositionwiseFeedForward


def test_a_layers_dropout_acts_in_training_and_nowhere_else():
    torch.manual_seed(0)
    layer = TransformerLayer(LayerSpec(d_model=16, n_heads=2, d_ff=32, dropout=0.5, activation_dropout=0.5), causal=True,
                             cross_attention=False)
    plain = copy.deepcopy(layer)
    plain.dropout.p, plain.ffn.dropout.p = 0.0, 0.0
    x = torch.randn(2, 5, 16)
    layer.train()
    first, _ = layer(x)
    second, _ = layer(x)
    assert not torch.equal(first, second)  # a new mask each call
    layer.eval()
    plain.eval()
    assert torch.equal(layer(x)[0], plain(x)[0])


def test_the_ffns_activation_dropout_acts_in_training_only():
    torch.manual_seed(0)
    for activation in ("relu", "swiglu"):
        ffn = PositionwiseFeedForward(8, 16, activation=activation, activation_dropout=0.5)
        x = torch.randn(3, 8)
        ffn.train()
        assert not torch.equal(ffn(x), ffn(x))
        ffn.eval()
        ffn.dropout.p = 0.0
        reference = ffn(x)
        ffn.dropout.p = 0.5
        assert torch.equal(ffn(x), reference)
