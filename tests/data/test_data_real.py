"""Loaders on the real files under ../shared/data (skipped when that folder is absent)."""

from __future__ import annotations

import pytest

from aiayn.data import load_multi30k, load_sst2, load_tinyshakespeare, read_text

pytestmark = pytest.mark.data


def test_multi30k_sizes_both_directions(shared_data) -> None:
    for split, n in (("train", 29000), ("val", 1014), ("test2016", 1000)):
        de_en = load_multi30k(split, data_dir=shared_data, download=False)
        en_de = load_multi30k(split, direction="en-de", data_dir=shared_data, download=False)
        assert len(de_en) == len(en_de) == n
        assert de_en.src == en_de.tgt and de_en.tgt == en_de.src
    train = load_multi30k("train", data_dir=shared_data, download=False)
    assert train.src[0].startswith("Zwei junge weiße Männer") and train.tgt[0].startswith("Two young, White males")
    assert sum("\u00a0" in line for line in train.src) > 0


def test_sst2_sizes(shared_data) -> None:
    train = load_sst2("train", data_dir=shared_data, download=False)
    dev = load_sst2("dev", data_dir=shared_data, download=False)
    assert (len(train), len(dev)) == (6920, 872)
    assert train.label_names == dev.label_names == ["0", "1"]
    assert set(train.labels) == {0, 1} and train.texts[0].startswith("a stirring , funny")


def test_tinyshakespeare_90_10(shared_data) -> None:
    text = read_text(shared_data / "tinyshakespeare" / "input.txt")
    train = load_tinyshakespeare("train", data_dir=shared_data, download=False)
    val = load_tinyshakespeare("val", data_dir=shared_data, download=False)
    assert len(text) == 1115394
    assert len(train) == int(0.9 * len(text)) == 1003854 and train + val == text
