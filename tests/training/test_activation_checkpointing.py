"""``train.activation_checkpointing``: the same gradients (dropout included), the same parameter names, less memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from loop_fixtures import lm_config
from torch import nn

from aiayn.models.presets import model_class, preset
from aiayn.training.activation_checkpointing import apply_activation_checkpointing
from aiayn.training.loop import train


@pytest.mark.parametrize("name", ["tiny-decoder-only", "tiny-encoder-decoder", "tiny-encoder-only"])
def test_activation_checkpointing_changes_no_gradient(name):
    config = preset(name, vocab_size=40, dropout=0.2)  # dropout: the recomputation must replay the same masks

    def gradients(checkpointed: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = model_class(config)(config).double().train()
        if checkpointed:
            layers = config.n_encoder_layers + config.n_decoder_layers if name == "tiny-encoder-decoder" else config.n_layers
            assert apply_activation_checkpointing(model) == layers
        ids = torch.randint(4, 40, (3, 9), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(2)
        out = model(ids, ids) if name == "tiny-encoder-decoder" else model(ids)
        (out.double() ** 2).mean().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys() and plain
    for n in plain:
        torch.testing.assert_close(checkpointed[n], plain[n], atol=1e-6, rtol=1e-6, msg=n)


def test_parameter_names_do_not_change():
    config = preset("tiny-decoder-only", vocab_size=40)
    model = model_class(config)(config)
    names = list(model.state_dict())
    apply_activation_checkpointing(model)
    assert list(model.state_dict()) == names


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="train.activation_checkpointing=true needs a model with Transformer blocks; Sequential"):
        apply_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)))


def test_training_with_activation_checkpointing_equals_without(tmp_path):
    plain = train(lm_config(tmp_path / "a", steps=3))
    config = lm_config(tmp_path / "b", steps=3)
    checkpointed = train(dataclasses.replace(config, train=dataclasses.replace(config.train, activation_checkpointing=True)))
    for name, tensor in plain.model.state_dict().items():
        torch.testing.assert_close(checkpointed.model.state_dict()[name], tensor, atol=1e-6, rtol=1e-6, msg=name)
