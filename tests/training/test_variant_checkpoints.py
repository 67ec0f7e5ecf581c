"""A model with each attention variant trains, saves, loads and resumes like any other."""

import dataclasses

import pytest
import torch
from loop_fixtures import lm_config

from aiayn.checkpoint.weights import read_safetensors
from aiayn.pretrained import load_pretrained
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics

VARIANTS = {"local": dict(attention="local", window=4), "linear": dict(attention="linear"), "ssm": dict(mixer="ssm")}


def config(tmp, name, variant, **loop):
    base = lm_config(tmp / name, steps=4)
    model = base.model.replace(**VARIANTS[variant])
    return dataclasses.replace(base, model=model, train=dataclasses.replace(base.train, save_every=2, eval_every=2, **loop))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trains_saves_loads_and_resumes_exactly(tmp_path, variant):
    straight = train(config(tmp_path, "a", variant))
    train(config(tmp_path, "b", variant, stop_after=2))
    resumed = train(config(tmp_path, "b", variant))  # same run_dir: resumes from step 2
    losses = [{r["step"]: r["loss"] for r in read_metrics(run.run_dir) if "loss" in r} for run in (straight, resumed)]
    assert sorted(losses[0]) == [1, 2, 3, 4] and losses[0] == losses[1]
    a, _ = read_safetensors(straight.last_checkpoint / "model.safetensors")
    b, _ = read_safetensors(resumed.last_checkpoint / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loaded = load_pretrained(straight.last_checkpoint)
    for key, value in VARIANTS[variant].items():
        assert getattr(loaded.model.config, key) == value
