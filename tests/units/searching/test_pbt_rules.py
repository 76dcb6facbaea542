"""Population based training on its own: the scheduler's settings and checks, a replayed config, what a trial
copies (a search with scheduler: pbt: tests/searches/test_pbt.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from optuna.distributions import FloatDistribution

from search.definition.schema import Searched
from search.searching.pbt import ClipToRange, replay_config
from tests.helpers import small_space
from trainable.config import TrialConfig, parse_schedule
from trainable.data import BUILTIN_CLASSES, TORCHVISION_SETS, Data, Standardize, split
from trainable.errors import ConfigError
from trainable.loop import build_run, train_and_evaluate


CPU = torch.device("cpu")


BASE = dict(train_size=600, val_size=200, epochs=4, batch_size=64, model_args={"hidden_sizes": [16]},
            num_threads=1)


@pytest.fixture(scope="module")
def data(mnist_train) -> Data:
    train, val = split(mnist_train, BASE["train_size"], BASE["val_size"], split_seed=0)
    return Data(train, val, None, BUILTIN_CLASSES, (1, 28, 28), Standardize(*TORCHVISION_SETS["mnist"][1:]))


def val_accs(run, schedule=None) -> list[float]:
    return [r.val_acc for r in train_and_evaluate(run, schedule)]


def test_a_copied_trial_trains_with_its_own_values_and_the_schedule_replays_it_bit_for_bit(data):
    # trial 0 trains 2 epochs; trial 1 continues from its checkpoint with other values (PBT's exploit)
    donor = build_run(TrialConfig(**BASE, lr=0.05, seed=11, trial_number=0), data, CPU)
    donor_accs = [r.val_acc for _, r in zip(range(2), train_and_evaluate(donor))]
    state = copy.deepcopy(donor.state_dict())
    changed = dict(lr=0.08, momentum=0.5, weight_decay=1e-4, clip_norm=1.0)
    copier = build_run(TrialConfig(**BASE, **changed, seed=22, trial_number=1), data, CPU)
    copier.load_state_dict(state)
    records = list(train_and_evaluate(copier))
    # the new lr scales the cosine schedule where it stands (epoch 3 of 4: half of the base lr)
    assert records[0].epoch_lr == pytest.approx(0.08 * 0.5)
    assert copier.optimizer.param_groups[0]["momentum"] == 0.5

    replay = replay_config(TrialConfig(**BASE, **changed, seed=22, trial_number=1).to_dict(), copier.lineage)
    assert replay["seed"] == 11 and replay["lr"] == 0.05
    assert replay["schedule"] == [{"epoch": 3, "trial_number": 1, **changed}]
    schedule = parse_schedule(replay.pop("schedule"))
    replayed = val_accs(build_run(TrialConfig.from_mapping(replay), data, CPU), schedule)
    assert replayed[:2] == donor_accs
    assert replayed[2:] == [r.val_acc for r in records]


def test_a_restart_with_the_same_values_is_bit_for_bit(data):
    config = TrialConfig(**BASE, lr=0.05, momentum=0.9, seed=3)
    whole = val_accs(build_run(config, data, CPU))
    half = build_run(config, data, CPU)
    accs = [r.val_acc for _, r in zip(range(2), train_and_evaluate(half))]
    restarted = build_run(config, data, CPU)
    restarted.load_state_dict(copy.deepcopy(half.state_dict()))
    assert accs + val_accs(restarted) == whole
    assert replay_config(config.to_dict(), restarted.lineage) == config.to_dict()  # no schedule for its own weights


def test_a_bad_schedule_names_each_entry():
    with pytest.raises(ConfigError) as error:
        parse_schedule([{"epoch": 2, "lr": -1}, {"epoch": 2, "batch_size": 8}, "x"])
    text = str(error.value)
    assert "schedule[0].lr: must be > 0" in text
    assert "schedule[1].epoch: must be an integer > 2" in text
    assert "schedule[1].batch_size: unknown key" in text
    assert "schedule[2]: must be a mapping" in text


def test_perturbed_values_stay_in_the_searched_range():
    clip = ClipToRange((Searched("lr", FloatDistribution(0.01, 0.1, log=True)),
                        Searched("momentum", FloatDistribution(0.5, 0.95))))
    assert clip({"lr": 0.12, "momentum": 1.14, "batch_size": 64}) == {"lr": 0.1, "momentum": 0.95, "batch_size": 64}


@pytest.mark.parametrize("sections, expected", [
    ({"space": {"lr": 0.1, "clip_norm": None}},
     "space: must search at least one of lr, momentum, weight_decay, clip_norm for scheduler pbt"),
    ({"experiment": {"perturbation_interval": 4}},
     "experiment.perturbation_interval: must be < the epochs a trial runs (4) for pbt"),
    ({"experiment": {"checkpoint_every": 2}}, "experiment.checkpoint_every: must divide perturbation_interval (1)"),
    ({"experiment": {"quantile_fraction": 0.6}}, "experiment.quantile_fraction: must be a number in (0, 0.5]"),
    ({"experiment": {"num_to_keep": 1}}, "experiment.num_to_keep: must be null (keep all) for pbt"),
    ({"space": {"optimizer": {"distribution": "choice", "values": ["sgd", "adam"]},
                "momentum": {"distribution": "float", "low": 0.5, "high": 0.95, "when": {"optimizer": "sgd"}}}},
     "space.momentum.when: is not supported with scheduler pbt: its trials copy and perturb whole configs, so "
     "every searched key must be drawn in every trial, got {'optimizer': 'sgd'}"),
])
def test_a_pbt_space_that_cannot_work_is_refused_before_the_search(tmp_path, data_root, sections, expected):
    experiment = {"scheduler": "pbt", **sections.get("experiment", {})}
    space = {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}, "batch_size": 32,
             "t_max": 4, "clip_norm": 1.0, **sections.get("space", {})}
    with pytest.raises(ConfigError) as error:
        small_space(tmp_path, data_root, experiment=experiment, training={"epochs": 4}, space=space)
    assert expected in str(error.value)


def test_the_population_is_tunes_param_space_without_a_deprecated_spec_form(tmp_path, data_root, caplog):
    import logging

    from ray.tune.search.variant_generator import generate_variants

    from search.searching.pbt import initial_population, population_space

    space = small_space(tmp_path, data_root, experiment={"num_samples": 3, "scheduler": "pbt"})
    with caplog.at_level(logging.WARNING, logger="ray.tune"):
        configs = [config for _, config in generate_variants(population_space(space, {}))]
    assert configs == initial_population(space)
    assert "deprecated" not in caplog.text  # Tune's "sample_from functions that take a spec dict" warning


def test_pbt_keeps_every_checkpoint_unless_told_otherwise(tmp_path, data_root):
    space = small_space(tmp_path, data_root, experiment={"scheduler": "pbt"}, training={"epochs": 4},
                        space={"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}})
    assert space.experiment.num_to_keep is None


def test_the_summary_names_a_best_trials_schedule_and_gives_its_first_values():
    from search.outputs.summary import searched_values

    config = {**TrialConfig(**BASE, lr=0.05, seed=11).to_dict(),
              "schedule": [{"epoch": 3, "trial_number": 1, "lr": 0.08, "momentum": 0.5, "weight_decay": 0.0,
                            "clip_norm": 1.0}]}
    assert searched_values(config, ["lr"]) == "lr=0.05 at epoch 1, then 1 change(s) in best.yaml's schedule"
