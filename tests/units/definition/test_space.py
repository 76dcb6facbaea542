"""The space file: every shipped file loads; bad files fail with exit 2 naming key, rule, value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.cli import apply_overrides, assignments, load_space, parse_args, set_keys
from search.definition.schema import is_run_name
from search.definition.space import example_config, parse_space, to_raw
from trainable.errors import ConfigError
from trainable.yaml_file import read_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
# the shipped space files: spaces/ and each example's space.yaml
SPACES = sorted((REPO / "spaces").glob("*.yaml")) + sorted((REPO / "examples").glob("*/space.yaml"))
MNIST = REPO / "spaces" / "mnist.yaml"
LR = {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}  # a space that searches something


def lr_space(**lr):
    return {"space": {"lr": {"distribution": "loguniform", **lr}}}


def problems_of(raw) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_space(raw)
    return caught.value.problems


@pytest.mark.parametrize("path", SPACES, ids=[str(p.relative_to(REPO)) for p in SPACES])
def test_every_shipped_space_is_valid(path):
    space = parse_space(read_yaml_mapping(path), source=str(path))
    assert space.searched, "a shipped space searches something"
    space.trial_defaults()  # the fixed part alone is a valid trial config
    example_config(space)  # and so is one the search could produce
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each space file opens with a comment saying what it tunes"
    assert f"--space {path.relative_to(REPO)}" in path.read_text(), "and the command that runs it"


def test_shipped_mnist_space_searches_the_four_fields():
    space = parse_space(read_yaml_mapping(MNIST))
    kinds = {d.name: d.to_raw()["distribution"] + (" log" if d.to_raw().get("log") else "") for d in space.searched}
    assert kinds == {"lr": "float log", "batch_size": "choice", "t_max": "int", "clip_norm": "float log"}
    batch = next(d for d in space.searched if d.name == "batch_size")
    assert all(b % 8 == 0 for b in batch.values)
    # the template MLP, 784-128-10, from the model section
    defaults = space.trial_defaults()
    assert (defaults.model, defaults.model_args) == ("mlp", {"hidden_sizes": [128]})


@pytest.mark.parametrize("raw, expected", [
    (lr_space(low=0, high=1), "space.lr.low: must be > 0 for loguniform, got 0"),
    (lr_space(low=0.5, high=0.1), "space.lr.low: must be < high (0.1), got 0.5"),
    (lr_space(low=0.1), "space.lr.high: must be a number for loguniform, got None"),
    (lr_space(low=0.1, high=2e6), "space.lr.high: must be > 0 and <= 1e6, got 2000000.0"),
    ({"space": {"batch_size": {"distribution": "choice", "values": []}}},
     "space.batch_size.values: must be a non-empty list, got []"),
    ({"space": {"batch_size": {"distribution": "choice", "values": [64, 0]}}},
     "space.batch_size.values[1]: must be in [1, 2**24], got 0"),
    ({"space": {"batch_size": {"distribution": "choice", "values": [64, 12.5]}}},
     "space.batch_size.values[1]: must be an integer, got 12.5"),
    ({"space": {"t_max": {"distribution": "randint", "low": 2.5, "high": 6}}},
     "space.t_max.low: must be an integer for randint, got 2.5"),
    ({"space": {"lr": {"distribution": "normal", "low": 1, "high": 2}}},
     "space.lr.distribution: must be one of float, int, choice, loguniform, uniform, randint, got 'normal'"),
    ({"space": {"learning_rate": 0.1}}, "space.learning_rate: unknown field of the trial config, got 0.1"),
    ({"space": {"seed": 3}}, "space.seed: cannot be searched: it is set by the driver, got 3"),
    ({"space": {"train_size": {"distribution": "choice", "values": [1000]}}},
     "space.train_size: cannot be searched: it is set by the data section"),
    ({"space": {"resources": {"gpus": -1}}}, "space.resources: unknown field of the trial config"),
    ({"resources": {"gpus": -1}}, "resources.gpus: must be 0, a fraction in [0.01, 1]"),
    ({"resources": {"gpus": 1.5}}, "resources.gpus: must be 0, a fraction in [0.01, 1]"),
    ({"resources": {"gpus": 2}}, "resources.gpus: must be 0, a fraction in [0.01, 1] (0.25 packs four trials "
                                 "per GPU; a trial uses one GPU at most) or auto (measured), got 2"),
    ({"resources": {"gpus": "max"}}, "resources.gpus: must be 0, a fraction in [0.01, 1] (0.25 packs four "
                                     "trials per GPU; a trial uses one GPU at most) or auto (measured), got 'max'"),
    ({"resources": {"spread": "yes"}}, "resources.spread: must be true or false, got 'yes'"),
    ({"experiment": {"scheduler": "median"}}, "experiment.scheduler: must be one of fifo, asha, hyperband, bohb, pbt, got 'median'"),
    ({"experiment": {"metric": "accuracy"}}, "experiment.metric: must be a metric the trainable reports"),
    ({"experiment": {"num_samples": "many"}}, "experiment.num_samples: must be an integer in [1, 1000000], got 'many'"),
    ({"experiment": {"colour": "blue"}}, "experiment.colour: unknown key"),
    ({"experiment": {"name": "../up"}}, "experiment.name: must be letters, digits, '_', '.' or '-'"),
    ({"experiment": {"name": "-x"}}, "experiment.name: must be letters, digits, '_', '.' or '-', at most 128, "
                                      "starting with a letter or digit (it names a folder), got '-x'"),
    ({"training": {"lr": 0.1}, "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "space.lr: is also fixed in the training section; set it in one place"),
    ({"training": {"dataset": "mnist"}}, "training.dataset: belongs in the data section"),
    ({"data": {"dataset": "imagenet"}},
     "data.dataset: must be one of mnist, fashion_mnist, kmnist, cifar10 or FILE.py:FUNCTION / "
     "package.module:FUNCTION, got 'imagenet'"),
    ({"data": {"persistent_workers": True}}, "data.persistent_workers: needs num_workers > 0, got True"),
    ({"data": {"args": {"n": 1}}},
     "data.args: is for a dataset function (FILE.py:FUNCTION); the built-in mnist takes no arguments, got {'n': 1}"),
    ({"data": {"train_size": 0}}, "data.train_size: must be in [1, 10**9] (or null for the rest), got 0"),
    ({"data": {"args": [1, 2]}}, "data.args: must be a mapping of keyword arguments to plain values, got [1, 2]"),
    ({"data": {"data_args": {"n": 3}}}, "data.data_args: unknown key (known: root, dataset, args, train_size"),
    ({"optimiser": {}}, "optimiser: unknown section"),
    ({"space": {"lr": {"distribuion": "loguniform", "low": 0.01, "high": 0.1}}},
     "space.lr.distribuion: unknown key (known: distribution, high, log, low, step, values, when), got 'loguniform'"),
    ({"space": {"lr": {"low": 0.01, "high": 0.1}}}, "space.lr: needs a distribution key"),
    ({"training": {"epochs": 2}}, "space: must search at least one key"),
    # the model section and searched model keywords
    ({"model": {"factory": "resnet"}},
     "model.factory: must be one of mlp, cnn or FILE.py:CALLABLE / package.module:CALLABLE, got 'resnet'"),
    ({"model": {"hidden-sizes": [64]}},
     "model.hidden-sizes: must name a keyword argument of the factory (a Python identifier), got [64]"),
    ({"model": {"width": 2**63}},
     "model.width: must be plain data (numbers within int64, strings, lists, mappings), got 9223372036854775808"),
    ({"model": "mlp"}, "model: must be a mapping of keys to values, got 'mlp'"),
    ({"training": {"model": "cnn"}}, "training.model: unknown key (known: epochs, optimizer, lr"),
    ({"model": {"hidden_sizes": [64]},
      "space": {"model.hidden_sizes": {"distribution": "choice", "values": [[32], [64]]}}},
     "space.model.hidden_sizes: is also fixed in the model section; set it in one place"),
    ({"space": {"model.factory": {"distribution": "choice", "values": ["mlp", "cnn"]}}},
     "space.model.factory: cannot be searched: it is set by the model section"),
    ({"space": {"model.2x": {"distribution": "uniform", "low": 0.0, "high": 0.3}}},
     "space.model.2x.low: must name a keyword argument of the factory (a Python identifier), got 0.0"),
    # keys of the first release that moved to the model section
    ({"training": {"hidden_sizes": [64]}},
     "training.hidden_sizes: moved to model.hidden_sizes (in the model section, or space: model.hidden_sizes)"),
    ({"space": {"hidden_sizes": {"distribution": "choice", "values": [[64], [128]]}}},
     "space.hidden_sizes: moved to model.hidden_sizes (in the model section, or space: model.hidden_sizes)"),
])
def test_bad_input_names_key_rule_and_value(raw, expected):
    assert any(p.startswith(expected) for p in problems_of(raw)), problems_of(raw)


def test_every_problem_is_reported_at_once():
    raw = {"experiment": {"mode": "up", "max_concurrent": 0}, "resources": {"cpus": 0},
           "space": {"lr": {"distribution": "loguniform", "low": -1, "high": 1},
                     "batch_size": {"distribution": "choice", "values": [-8]}}}
    keys = {p.split(":")[0] for p in problems_of(raw)}
    assert keys == {"experiment.mode", "experiment.max_concurrent", "resources.cpus",
                    "space.lr.low", "space.batch_size.values[0]"}


def test_a_pbt_file_with_two_errors_hears_of_both():
    """Issue 37: a bad quantile_fraction hid that perturbation_interval is past the last epoch."""
    raw = {"experiment": {"scheduler": "pbt", "quantile_fraction": 0.9, "perturbation_interval": 5},
           "training": {"epochs": 4}, **lr_space(low=0.01, high=0.1)}
    said = problems_of(raw)
    assert {p.split(":")[0] for p in said} == {"experiment.quantile_fraction", "experiment.perturbation_interval"}
    assert any("must be < the epochs a trial runs (4) for pbt" in p for p in said)
    # a key said wrong once is not said again through the default that stands in for it
    raw["experiment"]["perturbation_interval"] = 0
    assert [p.split(":")[0] for p in problems_of(raw)].count("experiment.perturbation_interval") == 1


def test_plain_values_in_space_are_fixed_and_lists_can_be_chosen():
    space = parse_space({"space": {"momentum": 0.5, "model.hidden_sizes": {"distribution": "choice",
                                                                            "values": [[64], [128, 64]]}}})
    assert space.fixed["momentum"] == 0.5
    (searched,) = space.searched
    assert searched.name == "model.hidden_sizes"
    assert [list(v) for v in searched.values] == [[64], [128, 64]]


def test_model_section_keys_and_searched_model_keywords_reach_the_trial_config():
    space = parse_space({"model": {"factory": "cnn", "hidden": 32},
                         "data": {"dataset": "my_data.py:load", "args": {"n": 3}},
                         "space": {"model.dropout": {"distribution": "uniform", "low": 0.1, "high": 0.3},
                                   "model.channels": {"distribution": "choice", "values": [[8], [8, 16]]}}})
    defaults = space.trial_defaults()
    assert (defaults.model, defaults.model_args) == ("cnn", {"hidden": 32})
    assert (defaults.dataset.endswith("/my_data.py:load"), defaults.data_args) == (True, {"n": 3})  # data.args -> data_args
    example = example_config(space)  # the fixed part plus each searched field's low or first value
    assert example.model_args == {"hidden": 32, "dropout": 0.1, "channels": [8]}
    assert example.dataset == defaults.dataset


def test_an_oversized_split_passes_the_file_and_fails_when_the_data_loads(data_root):
    """The sum against the dataset's size is checked where the size is known: data.split (before Ray)."""
    from trainable.data import load_data
    from trainable.errors import DataError

    space = parse_space({"data": {"train_size": 55_000, "val_size": 10_000}, "space": LR})
    with pytest.raises(DataError, match=r"train_size \+ val_size must be <= 60000 .*got 55000 \+ 10000"):
        load_data(space.trial_defaults(), data_root, key="data.dataset", with_test=False)


def test_relative_file_references_are_absolute_from_the_space_file(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "models").mkdir(parents=True)
    path = folder / "space.yaml"
    path.write_text("model:\n  factory: models/net.py:Net\ndata:\n  dataset: ../data.py:load\n"
                    "space:\n  lr: {distribution: uniform, low: 0.1, high: 0.2}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the space file is
    space = load_space(str(path), [])
    assert space.fixed["model.factory"] == f"{(folder / 'models' / 'net.py').resolve()}:Net"
    assert space.fixed["dataset"] == f"{(tmp_path / 'data.py').resolve()}:load"
    # built-in names and package.module references are left as they are
    space = load_space(str(path), [("model.factory", "pkg.models:Net"), ("data.dataset", "kmnist")])
    assert (space.fixed["model.factory"], space.fixed["dataset"]) == ("pkg.models:Net", "kmnist")


@pytest.mark.parametrize("path", SPACES, ids=[str(p.relative_to(REPO)) for p in SPACES])
def test_to_raw_is_a_space_file_that_reads_back_the_same(path, tmp_path):
    space = parse_space(read_yaml_mapping(path), source=str(path))
    raw = to_raw(space)
    assert set(raw) == ({"trainable", "experiment", "resources", "training", "space"} if space.trainable else
                        {"experiment", "resources", "model", "data", "training", "space"})
    # it is what spec.yaml holds: through YAML text and back
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    again = parse_space(read_yaml_mapping(spec), source=str(spec))
    assert (again.experiment, again.resources, again.data_root) == (space.experiment, space.resources,
                                                                    space.data_root)
    assert again.searched == space.searched
    assert again.trial_defaults() == space.trial_defaults()
    assert example_config(again) == example_config(space)
    assert to_raw(again) == raw  # a fixed point: writing a spec again changes nothing


@pytest.mark.parametrize("name, expected", [
    ("mnist", True), ("mnist-20240101-120000", True), ("a.b_c-1", True), ("x" * 128, True),
    ("x" * 129, False), ("", False), (".", False), ("..", False), ("../up", False), ("a/b", False),
    ("-x", False), ("name\n", False), (3, False),
])
def test_run_names_are_one_safe_folder_name(name, expected):
    assert is_run_name(name) is expected


def test_overrides_set_any_key_and_are_validated_like_the_file():
    args = parse_args(["--space", "x.yaml", "--epochs", "3", "--gpus-per-trial", "0.5",
                       "--set", "space.lr.high=0.5", "--set", "training.momentum=0.8",
                       "--set", "model.hidden_sizes=[256, 128]"])
    raw = apply_overrides(yaml.safe_load(MNIST.read_text()), args)
    space = parse_space(raw)
    assert space.fixed["epochs"] == 3 and space.fixed["momentum"] == 0.8
    assert space.fixed["model.hidden_sizes"] == [256, 128]
    assert space.resources.gpus == 0.5
    assert next(d for d in space.searched if d.name == "lr").high == 0.5
    # load_space: the same through the file's path
    space = load_space(str(MNIST), assignments(args))
    assert space.fixed["epochs"] == 3 and space.fixed["model.hidden_sizes"] == [256, 128]
    with pytest.raises(ConfigError) as caught:
        load_space(str(MNIST), [("training.epochs", 0)])
    assert caught.value.problems == ["training.epochs: must be in [1, 100000], got 0"]
    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, parse_args(["--space", "x", "--set", "no-equals-sign"]))
    assert caught.value.problems == ["--set: must be section.key=value, got 'no-equals-sign'"]
    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, parse_args(["--space", "x", "--set", "training..lr=0.1"]))
    assert caught.value.problems == ["--set: must be section.key=value, got 'training..lr=0.1'"]
    with pytest.raises(ConfigError) as caught:
        set_keys({"training": 3}, [("training.lr", 0.1)])
    assert caught.value.problems == ["training: is not a mapping, cannot set a key in it, got 3"]


def test_searched_model_keywords_are_set_through_their_dotted_name():
    """`space.model.<key>[.<setting>]`: the key in space holds a dot itself."""
    raw = yaml.safe_load((REPO / "examples" / "mnist_cnn" / "space.yaml").read_text())
    raw = set_keys(raw, [("space.model.dropout.high", 0.5), ("space.model.channels.values", [4, 8, 16]),
                         ("space.model.hidden", {"distribution": "choice", "values": [32, 64]})])
    assert raw["space"]["model.dropout"] == {"distribution": "uniform", "low": 0.0, "high": 0.5}
    assert raw["space"]["model.channels"]["values"] == [4, 8, 16]
    del raw["model"]["hidden"]  # fixed in the model section too would be an error
    space = parse_space(raw)
    assert {d.name: d for d in space.searched}["model.hidden"].values == (32, 64)
    assert {d.name: d for d in space.searched}["model.channels"].values == (4, 8, 16)


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "search", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_bad_file_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("space:\n  lr: {distribution: loguniform, low: 0, high: 1}\n"
                   "  batch_size: {distribution: choice, values: [64, -1]}\n")
    done = run_cli("--space", str(bad), "--storage-path", str(tmp_path / "runs"))
    assert done.returncode == 2
    assert "space.lr.low: must be > 0 for loguniform, got 0" in done.stderr
    assert "space.batch_size.values[1]: must be in [1, 2**24], got -1" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing starts before the file is valid"


def test_a_refusal_of_bad_input_does_not_import_torch(tmp_path):
    # torch's import was 1.5 s of the 2.1 s a refusal took (trainable/report.py imports it where it is used)
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment:\n  num_samples: -1\n")
    code = ("import sys\nfrom search.cli import main\ncode = main(['--space', sys.argv[1]])\n"
            "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert "experiment.num_samples: must be an integer in [1, 1000000], got -1" in done.stderr
    assert done.stdout.split() == ["2", "False"]


def test_cli_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("experiment:\n  name: x\n  seed: [1, 2\n")
    done = run_cli("--space", str(bad))
    assert done.returncode == 2
    assert f"{bad}: invalid YAML at line" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_bad_flag_value_exits_2(tmp_path):
    done = run_cli("--space", "spaces/mnist.yaml", "--scheduler", "median", "--max-concurrent", "0")
    assert done.returncode == 2
    assert "experiment.scheduler: must be one of fifo, asha, hyperband, bohb, pbt, got 'median'" in done.stderr
    assert "experiment.max_concurrent: must be an integer in [1, 10000], got 0" in done.stderr


def test_cli_resume_without_a_run_exits_2(tmp_path):
    done = run_cli("--space", "spaces/mnist.yaml", "--resume", "--storage-path", str(tmp_path))
    assert done.returncode == 2
    assert "--resume: no run named mnist-* under" in done.stderr
    assert "Traceback" not in done.stderr


def test_numbers_in_scientific_notation_are_numbers(tmp_path):
    path = tmp_path / "sci.yaml"
    path.write_text("space:\n  lr: {distribution: loguniform, low: 1e-3, high: 3E-1}\n  weight_decay: 5e-4\n")
    space = parse_space(read_yaml_mapping(path))
    assert (space.searched[0].low, space.searched[0].high) == (0.001, 0.3)
    assert space.fixed["weight_decay"] == 0.0005
    args = parse_args(["--space", "x", "--set", "space.lr.high=5e-1"])
    assert apply_overrides({}, args)["space"]["lr"]["high"] == 0.5


def test_strings_that_read_as_numbers_are_written_quoted_and_read_back_as_written(tmp_path):
    """What the run folder writes reads back unchanged: a trial id such as 11755e63 (hex digits that
    happen to spell a number in scientific notation) was written bare and read back as 1.1755e+67."""
    from trainable.yaml_file import dump_yaml

    written = {"trial_id": "11755e63", "choice": "1e5", "signed": "-2E-3", "plain": "abc123", "number": 1e-05,
               "nested": {"ids": ["0e1", "12345678"]}}
    path = tmp_path / "best.yaml"
    path.write_text(dump_yaml(written))
    assert read_yaml_mapping(path) == written
    assert list(read_yaml_mapping(path)) == list(written), "keys stay in their order"


def test_the_canonical_loop_and_a_function_get_the_same_answer_from_one_parse_path(tmp_path):
    """One parse path: a rule on the experiment and its schedule holds for both kinds of trial. A
    reproducible asha whose checkpoint_every does not divide grace_period is refused for both, in
    the same words (a function trainable's space used to pass it and ignore checkpoint_every)."""
    from search.definition.space import parse_space
    from trainable.errors import ConfigError

    experiment = {"scheduler": "asha", "grace_period": 3, "checkpoint_every": 2, "reproducible": True}
    searched = {"lr": {"distribution": "float", "low": 0.01, "high": 0.1}}
    canonical = {"experiment": experiment, "training": {"epochs": 4}, "space": searched}
    function = {"trainable": "train.py:train", **canonical}
    said = []
    for raw in (canonical, function):
        with pytest.raises(ConfigError) as caught:
            parse_space(raw, source=str(tmp_path / "space.yaml"))
        said.append(str(caught.value).splitlines()[1:])
    rule = ("  experiment.checkpoint_every: must divide grace_period (3) for a reproducible asha: a trial that "
            "waits at a rung resumes from that rung's checkpoint, got 2")
    assert said[0] == said[1] == [rule]
    for raw in (canonical, function):  # and both pass once it divides
        raw["experiment"] = {**experiment, "checkpoint_every": 1}
        assert parse_space(raw, source=str(tmp_path / "space.yaml")).experiment.checkpoint_every == 1


def test_a_section_key_that_is_no_string_is_an_unknown_key_not_a_crash():
    # YAML's `1: 2` gives the int key 1, which pydantic reports as an invalid key, not an extra one
    (said,) = problems_of({"experiment": {1: 2}, "space": LR})
    assert said.startswith("experiment.1: unknown key (known: ") and said.endswith("got 2")
    (said,) = problems_of({"resources": {3: "x"}, "space": LR})
    assert said.startswith("resources.3: unknown key (known: ") and said.endswith("got 'x'")
