"""Every recipe loads as a typed config and trains a couple of steps on the real data (when present)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.config_io import apply_overrides, load_yaml
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    names = {p.stem for p in RECIPES}
    assert {"multi30k-de-en", "multi30k-en-de", "shakespeare-char", "shakespeare-char-gpu", "sst2-mlm", "sst2"} <= names


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
    if recipe_config.model.preset is None and recipe_config.model.family is None:  # fine-tunes a pretrained model: keep it
        pytest.importorskip(recipe_config.train.init_from.removeprefix("package:").split("/")[0])
        overrides.remove("train.init_from=null")
    config = apply_overrides(recipe_config, overrides)
    result = train(config)
    assert result.step == 2 and "val_loss" in result.metrics
