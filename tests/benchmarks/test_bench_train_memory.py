"""benchmarks/train_memory.py on a tiny translation config: the child's one JSON line, and a high-water
mark whose parts add up (Adam's state is two moments per parameter)."""

import json

import pytest
from bench_scripts import load_benchmark
from loop_fixtures import save_config, translation_config


def _load_script():
    return load_benchmark("train_memory")


def test_the_child_reports_peak_rss_beside_a_high_water_mark_that_adds_up(tmp_path, capsys):
    bench = _load_script()
    path = save_config(translation_config(tmp_path / "cfg", steps=2), tmp_path / "tiny.yaml")
    [(name, r)] = bench.main(["--child", str(path), "--steps", "2", "--run-dir", str(tmp_path / "run"),
                              "--set", "data.pad_to_multiple=8"])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith(bench.RESULT)]
    assert len(line) == 1 and json.loads(line[0][len(bench.RESULT):]) == r
    assert r["steps"] == 2 and r["peak_rss"] > r["hwm"] > 0
    assert r["hwm"] == r["params"] + r["grads"] + r["optimizer"] + r["activations"]
    assert r["grads"] == r["params"]
    assert 2 * r["params"] <= r["optimizer"] <= 2 * r["params"] + 8 * 64  # two fp32 moments, plus a step count per tensor
    assert r["activations"] > 0
    rows, lengths = zip(*(side.split("x") for side in r["largest_batch"].split(" + ")))
    assert len(rows) == 2 and all(int(n) % 8 == 0 for n in lengths)  # source and target, padded to 8
    table = bench.format_table([(name, r)])
    assert r["precision"] == "float32" and f"| {path} | - | float32 | 2 | {r['tokens_per_s']:,.0f} | {r['loss']:.6f} |" in table


def test_each_allocator_gets_the_environment_the_aiayn_command_would_give_it(monkeypatch):
    from aiayn.allocator import mimalloc_path

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    bench = _load_script()
    assert "LD_PRELOAD" not in bench.child_env("system") and bench.child_env("system")["AIAYN_ALLOCATOR"] == "system"
    if mimalloc_path() is not None:
        assert bench.child_env("mimalloc")["LD_PRELOAD"] == str(mimalloc_path())


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--recipes", "no-such-recipe"], ["--recipes", "sst2", "--config", "x.yaml"],
                                  ["--allocators", "jemalloc"]])
def test_flag_errors(argv):
    with pytest.raises(SystemExit):
        _load_script().parse_args(argv)


def test_the_default_list_is_the_cpu_recipes():
    recipes = _load_script().cpu_recipes()
    assert "shakespeare-char-gpu" not in recipes and "sst2" not in recipes and "multi30k-de-en" in recipes
