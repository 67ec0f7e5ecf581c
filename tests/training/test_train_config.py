"""The training config: the model section (a preset plus overrides, where null means null), the
retention block, and the YAML / --set forms meaning the same."""

from __future__ import annotations

import pytest

from aiayn.checkpoint.retention import RetentionConfig
from aiayn.config_io import apply_overrides, from_dict, load_yaml, to_dict
from aiayn.models.presets import preset
from aiayn.training.config import LoopSection, ModelSection, TrainConfig


@pytest.mark.parametrize(
    ("name", "field", "preset_value"),
    [
        ("tiny-decoder-only", "pad_id", 0),
        ("tiny-decoder-only", "init_std", 0.02),
        ("bert-base", "pooler", None),  # set to True first below, then back to null
        ("tiny-encoder-decoder", "final_norm", None),
        ("tiny-encoder-decoder", "n_kv_heads", None),
    ],
)
def test_an_explicit_null_overrides_the_preset(name, field, preset_value):
    """The bug of the generated dataclass: None meant "unset", so `pad_id: null` kept the preset's 0."""
    assert getattr(preset(name), field) == preset_value
    non_null = {"pooler": True, "final_norm": True, "n_kv_heads": 2}.get(field)
    if non_null is not None:
        assert getattr(ModelSection(preset=name, **{field: non_null}).build(vocab_size=100), field) == non_null
    assert getattr(ModelSection(preset=name, **{field: None}).build(vocab_size=100), field) is None
    yaml_form = from_dict(TrainConfig, {"model": {"preset": name, field: None}})
    assert getattr(yaml_form.model.build(vocab_size=100), field) is None
    via_set = apply_overrides(TrainConfig(model=ModelSection(preset=name)), [f"model.{field}=null"])
    assert via_set.model == yaml_form.model


def test_absent_keys_keep_the_preset_and_the_section_round_trips():
    section = ModelSection(preset="tiny-decoder-only", d_model=64, n_heads=2)
    config = section.build(vocab_size=50)
    assert (config.d_model, config.n_heads, config.n_layers, config.vocab_size) == (64, 2, 2, 50)
    assert ModelSection(preset="tiny-decoder-only", vocab_size=80).build(vocab_size=50).vocab_size == 80
    train = TrainConfig(model=section)
    assert to_dict(train)["model"] == {"preset": "tiny-decoder-only", "d_model": 64, "n_heads": 2}
    assert from_dict(TrainConfig, to_dict(train)) == train


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"preset": "tiny-decoder-only", "n_layer": 2}, ValueError, r"unknown key 'model.n_layer' for ModelSection \(did you mean 'model.n_layers'\?\); valid keys: preset, family, "),
        ({"preset": "tiny-decoder-only", "n_encoder_layers": 2}, ValueError, "unknown key 'n_encoder_layers' for DecoderOnlyConfig"),
        ({"family": "decoder-only", "d_model": 30, "n_heads": 4}, ValueError, "d_model=30 must be divisible by n_heads=4"),
        ({"preset": "nope"}, ValueError, "unknown preset 'nope'"),
    ],
)
def test_a_bad_model_section_fails_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        ModelSection(**kwargs)


def test_a_wrong_type_in_yaml_names_the_key():
    with pytest.raises(TypeError, match=r"model.d_model: expected int, got 'abc'"):
        from_dict(TrainConfig, {"model": {"preset": "tiny-decoder-only", "d_model": "abc"}})


def test_a_partial_retention_block_keeps_best_tracking(tmp_path):
    """YAML `retention: {keep_last: 6}` and `--set train.retention.keep_last=6` mean the same."""
    path = tmp_path / "c.yaml"
    path.write_text("model: {preset: tiny-decoder-only}\ntrain:\n  retention:\n    keep_last: 6\n")
    from_yaml = load_yaml(path, TrainConfig).train.retention
    via_set = apply_overrides(TrainConfig(), ["train.retention.keep_last=6"]).train.retention
    assert from_yaml == via_set == RetentionConfig(keep_last=6, metric="val_loss", mode="min")


def test_a_train_config_saved_before_null_meant_none_reads_as_it_was_trained(tmp_path):
    """Older runs wrote every model field, None for "unset", with both preset and family keys."""
    import dataclasses

    from aiayn.models.config import FAMILIES

    old = {"preset": None, "family": "decoder-only", "d_model": 64, "n_layers": 3, "pad_id": None, "init_std": 0.02}
    old |= {f.name: None for cls in FAMILIES.values() for f in dataclasses.fields(cls) if f.name not in old}
    section = from_dict(TrainConfig, {"model": old}).model
    assert section == ModelSection(family="decoder-only", d_model=64, n_layers=3, init_std=0.02)
    assert section.build(vocab_size=10).pad_id == 0  # as trained: the old null was ignored


def test_a_model_section_without_preset_or_family_needs_init_from():
    """Neither preset nor family: the section changes train.init_from's model, so init_from must be set."""
    with pytest.raises(ValueError, match="give model.preset or model.family"):
        TrainConfig(model=ModelSection())
    config = TrainConfig(model=ModelSection(dropout=0.1), train=LoopSection(init_from="runs/some-model"))
    assert config.model.from_checkpoint and config.model.overrides == {"dropout": 0.1}


def test_replace_gives_a_validated_copy():
    section = ModelSection(preset="tiny-decoder-only", d_model=64)
    assert section.replace(d_ff=48) == ModelSection(preset="tiny-decoder-only", d_model=64, d_ff=48)
    assert section.replace(family="decoder-only").family == "decoder-only"
    with pytest.raises(ValueError, match="unknown key 'model.d_f'"):
        section.replace(d_f=48)
