"""config_io: strict dataclass <-> dict/YAML conversion, dotted overrides."""

from __future__ import annotations

import dataclasses
import errno
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from aiayn.checkpoint import atomic_io
from aiayn.config_io import apply_overrides, from_dict, load_yaml, parse_yaml_value, save_yaml, to_dict
from aiayn.training.optim import OptimConfig


@dataclass(frozen=True)
class Block:
    n_layers: int = 2
    dropout: float = 0.1
    kind: Literal["pre", "post"] = "post"

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")


@dataclass(frozen=True)
class Data:
    name: str = "copy"
    langs: tuple[str, ...] = ("de", "en")
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    weights: dict[str, float] = field(default_factory=dict)
    max_len: int | None = None
    shuffle: bool = True


@dataclass(frozen=True)
class Run:
    model: Block = field(default_factory=Block)
    data: Data = field(default_factory=Data)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    pair: tuple[int, float] = (1, 2.0)
    note: str | None = None
    extra: Block | None = None
    either: int | str = 0


@dataclass(frozen=True)
class Required:
    size: int
    label: str = "x"


@dataclass
class Derived:
    a: int = 1
    b: int = field(init=False, default=0)


def test_round_trip_gives_plain_data_and_the_same_object() -> None:
    run = Run(
        model=Block(n_layers=3, dropout=0.0, kind="pre"),
        data=Data(name="multi30k", langs=("en",), sizes=[4], weights={"a": 0.5}, max_len=64, shuffle=False),
        optim=OptimConfig(name="adamw", lr=3e-4, weight_decay=0.1),
        seed=7,
        pair=(3, 0.5),
        note="hello",
        extra=Block(n_layers=5),
        either="five",
    )
    plain = to_dict(run)
    assert plain["data"]["langs"] == ["en"] and plain["optim"]["betas"] == [0.9, 0.98]
    assert json.loads(json.dumps(plain)) == plain
    assert from_dict(Run, plain) == run
    assert from_dict(Run, json.loads(json.dumps(plain))) == run


def test_init_false_fields_are_not_written_and_not_accepted() -> None:
    assert to_dict(Derived(a=3)) == {"a": 3}
    with pytest.raises(ValueError, match="unknown key 'b'"):
        from_dict(Derived, {"a": 1, "b": 2})


def test_unknown_key_lists_valid_keys_and_suggests_the_closest() -> None:
    with pytest.raises(ValueError) as info:
        from_dict(Run, {"optim": {"lrr": 0.1}})
    msg = str(info.value)
    assert "unknown key 'optim.lrr' for OptimConfig" in msg
    assert "did you mean 'optim.lr'?" in msg
    assert "valid keys: name, lr, betas, eps, weight_decay" in msg


def test_unknown_key_without_close_match_still_lists_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'zzz' for Run; valid keys: model, data, optim, seed"):
        from_dict(Run, {"zzz": 1})


@pytest.mark.parametrize(
    ("data", "key", "expected"),
    [
        ({"model": {"n_layers": "4"}}, "model.n_layers", "expected int, got '4' (str)"),
        ({"model": {"n_layers": True}}, "model.n_layers", "expected int, got True (bool)"),
        ({"model": {"dropout": True}}, "model.dropout", "expected float, got True (bool)"),
        ({"model": {"dropout": "0.1"}}, "model.dropout", "expected float"),
        ({"data": {"shuffle": 1}}, "data.shuffle", "expected bool, got 1 (int)"),
        ({"data": {"name": 3}}, "data.name", "expected str, got 3 (int)"),
        ({"data": {"max_len": 1.5}}, "data.max_len", "expected int, got 1.5 (float)"),
        ({"data": {"sizes": [1, "x"]}}, "data.sizes[1]", "expected int, got 'x'"),
        ({"data": {"sizes": 3}}, "data.sizes", "expected list[int], got 3 (int)"),
        ({"data": {"langs": ["de", 2]}}, "data.langs[1]", "expected str, got 2"),
        ({"data": {"weights": {"a": "x"}}}, "data.weights.a", "expected float, got 'x'"),
        ({"data": {"weights": [1]}}, "data.weights", "expected dict[str, float]"),
        ({"pair": [1, 2, 3]}, "pair", "expected tuple[int, float] (2 items), got 3 items"),
        ({"pair": ["a", 2.0]}, "pair[0]", "expected int, got 'a'"),
        ({"either": 1.5}, "either", "expected int | str, got 1.5 (float)"),
        ({"model": 3}, "model", "expected Block, got 3 (int)"),
        ({"note": 3}, "note", "expected str, got 3 (int)"),
    ],
)
def test_wrong_types_name_the_dotted_key_and_expected_type(data: dict, key: str, expected: str) -> None:
    with pytest.raises(TypeError) as info:
        from_dict(Run, data)
    assert str(info.value).startswith(f"{key}: ")
    assert expected in str(info.value)


def test_ints_become_floats_and_unions_pick_the_matching_type() -> None:
    run = from_dict(Run, {"model": {"dropout": 0}, "either": "x", "data": {"max_len": None}})
    assert run.model.dropout == 0.0 and type(run.model.dropout) is float
    assert run.either == "x"
    assert run.data.max_len is None
    assert from_dict(Run, {"either": 4}).either == 4


def test_literal_outside_its_set_lists_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"model.kind: expected one of 'pre', 'post', got 'pos' \(did you mean 'post'\?\)"):
        from_dict(Run, {"model": {"kind": "pos"}})
    with pytest.raises(ValueError, match=r"optim.name: expected one of 'adam', 'adamw', 'muon', got 'sgd'"):
        from_dict(Run, {"optim": {"name": "sgd"}})


def test_missing_required_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"missing required key 'size' for Required"):
        from_dict(Required, {"label": "y"})
    assert from_dict(Required, {"size": 3}) == Required(size=3)


def test_post_init_validation_runs_with_the_path_in_front() -> None:
    with pytest.raises(ValueError, match=r"^model: n_layers must be >= 1, got 0$"):
        from_dict(Run, {"model": {"n_layers": 0}})
    with pytest.raises(ValueError, match=r"^optim: lr=-1.0 must be a finite number > 0.0$"):
        from_dict(Run, {"optim": {"lr": -1}})
    with pytest.raises(ValueError, match=r"^n_layers must be >= 1, got 0$"):
        from_dict(Block, {"n_layers": 0})


def test_bad_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="from_dict expects a dataclass type"):
        from_dict(dict, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_dict expects a dataclass instance, got type"):
        to_dict(Run)
    with pytest.raises(TypeError, match=r"Run: expected a mapping of Run fields, got \[1\] \(list\)"):
        from_dict(Run, [1])  # type: ignore[arg-type]


@dataclass
class Holder:
    thing: object = None


def test_to_dict_refuses_values_it_cannot_write() -> None:
    with pytest.raises(TypeError, match=r"thing: cannot convert PosixPath to plain data"):
        to_dict(Holder(thing=Path("/x")))


def test_unresolvable_string_annotations_name_the_class() -> None:
    @dataclass
    class Local:
        x: NotDefinedAnywhere  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(TypeError, match="cannot resolve the annotations of .*Local"):
        from_dict(Local, {"x": 1})


def test_yaml_reads_exponent_floats() -> None:
    assert parse_yaml_value("5e-4") == 5e-4
    assert parse_yaml_value("1E9") == 1e9
    assert parse_yaml_value("[1, 2.5e-3]") == [1, 2.5e-3]
    assert parse_yaml_value("abc") == "abc"
    assert parse_yaml_value("12") == 12 and type(parse_yaml_value("12")) is int


def test_save_and_load_yaml_round_trip(tmp_path: Path) -> None:
    run = Run(optim=OptimConfig(lr=5e-4, eps=1e-9), data=Data(langs=("fr",)))
    path = tmp_path / "run.yaml"
    save_yaml(run, path)
    assert load_yaml(path, Run) == run
    assert "lr: 0.0005" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["run.yaml"]


def test_load_yaml_errors_name_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  betaz: [0.9, 0.99]\n")
    with pytest.raises(ValueError, match=rf"{path}: unknown key 'optim.betaz' .*did you mean 'optim.betas'"):
        load_yaml(path, Run)
    path.write_text("model:\n  n_layers: four\n")
    with pytest.raises(TypeError, match=rf"{path}: model.n_layers: expected int, got 'four'"):
        load_yaml(path, Run)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(TypeError, match=rf"{path}: expected a mapping at the top level, got list"):
        load_yaml(path, Run)
    path.write_text("a: [1,\n")
    with pytest.raises(ValueError, match=rf"{path}: cannot parse"):
        load_yaml(path, Run)
    path.write_text("")
    with pytest.raises(ValueError, match=rf"{path}: the config file is empty"):  # never silently "all defaults"
        load_yaml(path, Run)


def test_exponent_float_in_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("optim:\n  lr: 5e-4\n")
    assert load_yaml(path, Run).optim.lr == 5e-4


@pytest.mark.reliability
def test_save_yaml_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.yaml"
    save_yaml(Run(seed=1), path)
    before = path.read_bytes()

    def full_disk(target: Path, data: bytes) -> None:
        Path(target).write_bytes(data[:5])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_io, "write_durable", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_yaml(Run(seed=2), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.yaml"]


def test_apply_overrides_returns_a_new_typed_object() -> None:
    run = Run()
    new = apply_overrides(run, ["optim.lr=5e-4", "model.n_layers=4", "data.name=multi30k", "data.sizes=[3, 4]"])
    assert new.optim.lr == 5e-4 and type(new.optim.lr) is float
    assert new.model.n_layers == 4
    assert new.data.name == "multi30k" and new.data.sizes == [3, 4]
    assert run == Run()
    assert new == dataclasses.replace(
        run,
        optim=dataclasses.replace(run.optim, lr=5e-4),
        model=Block(n_layers=4),
        data=dataclasses.replace(run.data, name="multi30k", sizes=[3, 4]),
    )


def test_later_overrides_win_and_tuples_parse() -> None:
    new = apply_overrides(Run(), ["seed=1", "seed=2", "optim.betas=[0.8, 0.9]"])
    assert new.seed == 2 and new.optim.betas == (0.8, 0.9)


def test_override_of_a_str_field_keeps_the_text() -> None:
    new = apply_overrides(Run(), ["data.name=1.0", "note=yes"])
    assert new.data.name == "1.0" and new.note == "yes"
    assert apply_overrides(Run(note="x"), ["note=null"]).note is None


def test_override_unknown_key_lists_keys_at_that_level() -> None:
    with pytest.raises(ValueError) as info:
        apply_overrides(Run(), ["optim.lrr=1"])
    assert "unknown key 'optim.lrr' for OptimConfig (did you mean 'optim.lr'?)" in str(info.value)
    assert "valid keys: name, lr, betas, eps, weight_decay" in str(info.value)
    with pytest.raises(ValueError, match=r"unknown key 'modle' for Run \(did you mean 'model'\?\); valid keys: model, data"):
        apply_overrides(Run(), ["modle.n_layers=3"])


def test_override_wrong_type_names_the_key() -> None:
    with pytest.raises(TypeError, match=r"^model.n_layers: expected int, got 'abc' \(str\)$"):
        apply_overrides(Run(), ["model.n_layers=abc"])


def test_override_runs_post_init() -> None:
    with pytest.raises(ValueError, match=r"^optim: lr=-1.0 must be a finite number > 0.0$"):
        apply_overrides(Run(), ["optim.lr=-1"])


def test_override_into_an_unset_optional_section_starts_from_defaults() -> None:
    assert apply_overrides(Run(), ["extra.n_layers=3"]).extra == Block(n_layers=3)


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ("optim.lr", ValueError, r"override 'optim.lr' must have the form 'dotted.key=value'"),
        ("=3", ValueError, r"override '=3' must have the form"),
        ("seed.x=1", ValueError, r"override key 'seed.x': 'seed' is a int, not a config section"),
        ("seed=[1,", ValueError, r"override 'seed': cannot parse '\[1,' as YAML"),
    ],
)
def test_malformed_overrides(override: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        apply_overrides(Run(), [override])


def test_overrides_must_be_a_sequence_of_strings() -> None:
    with pytest.raises(TypeError, match="got the single string 'seed=1'"):
        apply_overrides(Run(), "seed=1")
