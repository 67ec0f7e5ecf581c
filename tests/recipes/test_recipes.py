"""Every recipe loads as a typed config and trains a couple of steps on the real data (when present)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.config_io import apply_overrides, load_yaml
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
RECIPES = sorted((ROOT / "aiayn" / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    names = {p.stem for p in RECIPES}
    assert {"multi30k-de-en", "multi30k-de-en-speedrun", "multi30k-en-de", "shakespeare-char", "shakespeare-char-gpu", "sst2-mlm", "sst2"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_loads(recipe):
    config = load_yaml(recipe, TrainConfig)
    assert config.run_dir.startswith("runs/")


@pytest.mark.data
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the real data sets in ../shared/data")
@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_trains_two_steps(recipe, tmp_path):
    overrides = [
        f"run_dir={tmp_path / 'run'}", f"data.data_dir={SHARED_DATA}", "train.max_steps=2", "train.eval_every=2",
        "train.save_every=2", "train.eval_batches=1", "train.progress=false", "train.tensorboard=false",
        "train.device=cpu", "train.precision=fp32", "train.init_from=null", "train.max_minutes=null",
        "data.batch_size=2", "data.max_tokens=512",
    ]
    recipe_config = load_yaml(recipe, TrainConfig)
    if recipe_config.data.prepared is not None:
        pytest.skip("trains on `aiayn prepare` shards of WMT14 (4.5M pairs, not here): "
                    "tests/training/test_prepared_torchrun.py runs it shrunk on prepared shards")
    if recipe_config.model.preset is None and recipe_config.model.family is None:  # fine-tunes a pretrained model: keep it
        pytest.importorskip(recipe_config.train.init_from.removeprefix("package:").split("/")[0])
        overrides.remove("train.init_from=null")
    config = apply_overrides(recipe_config, overrides)
    result = train(config)
    assert result.step == 2 and "val_loss" in result.metrics


def test_recipes_are_found_by_name_and_listed(capsys):
    from aiayn.cli.main import main
    from aiayn.recipes import recipe_path, resolve_config_path

    assert resolve_config_path("shakespeare-char") == recipe_path("shakespeare-char.yaml")
    assert resolve_config_path("recipes/sst2.yaml") == recipe_path("sst2")  # the pre-package path still works
    with pytest.raises(ValueError, match="did you mean 'shakespeare-char'"):
        resolve_config_path("shakespeare-chr")
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert all(p.stem in out for p in RECIPES) and "Tiny Shakespeare" in out
    assert main(["presets"]) == 0
    assert "paper-base" in (out := capsys.readouterr().out) and "encoder-decoder: 6+6 layers, d_model 512" in out


def test_shortening_a_recipe_shortens_its_schedule(caplog):
    """--set train.max_steps=10 on the Shakespeare recipe: the cosine schedule ends at step 10, warmup capped."""
    config = apply_overrides(load_yaml(recipe_path_of("shakespeare-char"), TrainConfig), ["train.max_steps=10"])
    with caplog.at_level("WARNING"):
        schedule = config.schedule.resolve(max_steps=config.train.max_steps, d_model=128)
    assert schedule.max_steps == 10 and schedule.warmup == 9 and "capped" in caplog.text


def recipe_path_of(name):
    from aiayn.recipes import recipe_path

    return recipe_path(name)
