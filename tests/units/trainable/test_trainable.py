"""The training loop on real MNIST subsets: reproducibility, learning, metrics, clipping, checkpoints.

Config validation, data, model factories and the CLI have their own files (test_trainable_config.py,
test_trainable_data.py, test_factories.py, test_trainable_cli.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from trainable.batches import InMemoryBatches
from trainable.config import OPTIMIZERS, SOURCES, TrialConfig, schedule_note
from trainable.data import BUILTIN_CLASSES, TORCHVISION_SETS, Data, Standardize, split
from trainable.loop import EpochRecord, build_run, evaluate, evaluate_model, train, train_and_evaluate
from trainable.measures import accuracy_metric
from trainable.model import make_mlp
from trainable.report import CHECKPOINT_FILE, CheckpointError, load_checkpoint, save_checkpoint

CPU = torch.device("cpu")
ACCELERATOR = torch.accelerator.current_accelerator(check_available=True)
MNIST = Standardize(*TORCHVISION_SETS["mnist"][1:])

# small enough for about 0.1 s per epoch on 2 cores, big enough to learn something
SMALL = dict(train_size=2000, val_size=500, epochs=2, batch_size=64)


def mnist_data(train, val) -> Data:
    """A split of MNIST as load_data would give it to trials."""
    return Data(train, val, None, BUILTIN_CLASSES, (1, 28, 28), MNIST)


@pytest.fixture(scope="module")
def small_data(mnist_train) -> Data:
    return mnist_data(*split(mnist_train, SMALL["train_size"], SMALL["val_size"], split_seed=0))


@pytest.fixture(scope="module")
def first_1000(mnist_train):
    return mnist_train.take(torch.arange(1000).numpy())


def run_records(config: TrialConfig, data: Data, device: torch.device = CPU) -> list[EpochRecord]:
    return list(train_and_evaluate(build_run(config, data, device)))


def metrics(record: EpochRecord) -> dict:
    """Everything a record says except its wall times (*_seconds, latency_ms), which are never reproducible."""
    return {k: v for k, v in dataclasses.asdict(record).items() if not k.endswith("_seconds") and k != "latency_ms"}


def memory_batches(arrays, batch_size: int, device: torch.device = CPU, **kwargs) -> InMemoryBatches:
    return InMemoryBatches(arrays, batch_size, device, standardize=MNIST, shuffle=False, **kwargs)


# --- reproducibility -------------------------------------------------------------------------

@pytest.mark.parametrize("source", SOURCES)
def test_same_seed_gives_identical_metrics_and_another_seed_does_not(small_data, source):
    config = TrialConfig(**SMALL, source=source, seed=1)
    first = run_records(config, small_data)
    again = run_records(config, small_data)
    other = run_records(dataclasses.replace(config, seed=2), small_data)

    assert len(first) == len(again) == config.epochs
    # bit for bit on the CPU: ==, not approx
    assert [metrics(r) for r in first] == [metrics(r) for r in again]
    for mine, theirs in zip(first, other):
        assert mine.train_loss != theirs.train_loss
        assert mine.val_loss != theirs.val_loss


# --- learning ----------------------------------------------------------------------------------

def test_training_lowers_the_loss_and_beats_chance(mnist_train):
    config = TrialConfig(train_size=5000, val_size=1000, epochs=2)
    records = run_records(config, mnist_data(*split(mnist_train, 5000, 1000, split_seed=0)))

    assert [r.epoch for r in records] == [1, 2]
    assert records[0].train_loss < math.log(10)  # below an untrained model's loss on 10 classes
    assert records[1].train_loss < records[0].train_loss
    assert records[1].val_loss < records[0].val_loss
    assert records[1].val_acc > 0.5
    # the cosine schedule steps once per epoch: epoch 2 trains at a lower lr than epoch 1
    assert records[0].epoch_lr == config.lr
    assert records[1].epoch_lr < records[0].epoch_lr
    assert not any(r.diverged for r in records)


# --- metrics and loss averaging -------------------------------------------------------------------

def test_a_runs_latency_is_measured_once_after_its_first_epoch_and_stays_with_its_rows(small_data):
    """7 forward passes an epoch cost the built-in CNN on a CPU 0.24-1.2 s: the model and its batch size do not
    change as it trains, so every row of a run carries the first epoch's measure (timings never repeat)."""
    records = run_records(TrialConfig(**{**SMALL, "epochs": 3}), small_data)
    latencies = {record.latency_ms for record in records}
    assert len(latencies) == 1 and next(iter(latencies)) > 0, latencies


def test_train_resets_the_metric_each_epoch(first_1000):
    torch.manual_seed(0)
    model = make_mlp(hidden_sizes=(64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = memory_batches(first_1000, 100)
    predictions: list[torch.Tensor] = []
    model.register_forward_hook(lambda module, inputs, output: predictions.append(output.detach().argmax(1)))
    metric = accuracy_metric(10, CPU)

    reported, by_hand = [], []
    for _ in range(2):
        predictions.clear()
        _, acc = train(model, batches, nn.CrossEntropyLoss(), optimizer, metric, CPU)
        reported.append(acc)
        by_hand.append((torch.cat(predictions) == batches.labels).double().mean().item())

    # the model learned during epoch 1, so an average over both epochs would differ from epoch 2's
    assert by_hand[0] != pytest.approx(by_hand[1], abs=1e-3)
    assert reported[0] == pytest.approx(by_hand[0], abs=1e-6)
    assert reported[1] == pytest.approx(by_hand[1], abs=1e-6)


def test_evaluate_resets_the_metric(first_1000, mnist_train):
    torch.manual_seed(0)
    model = make_mlp(hidden_sizes=(64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, memory_batches(first_1000, 100), nn.CrossEntropyLoss(), optimizer, accuracy_metric(10, CPU), CPU)
    part_a = memory_batches(mnist_train.take(torch.arange(1000, 1500).numpy()), 100)
    part_b = memory_batches(mnist_train.take(torch.arange(1500, 1530).numpy()), 100)
    loss_fn = nn.CrossEntropyLoss()

    shared = accuracy_metric(10, CPU)
    _, acc_a = evaluate(model, part_a, loss_fn, shared, CPU)
    _, acc_b = evaluate(model, part_b, loss_fn, shared, CPU)
    _, fresh_b = evaluate(model, part_b, loss_fn, accuracy_metric(10, CPU), CPU)

    assert acc_a != pytest.approx(acc_b, abs=1e-3)  # so carrying part A over would show
    assert acc_b == fresh_b


def test_loss_is_averaged_weighted_by_batch_size(first_1000):
    torch.manual_seed(0)
    model = make_mlp(hidden_sizes=(64,))
    # lr 0: the weights stay put, so the loss of each batch can be recomputed afterwards
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss_fn = nn.CrossEntropyLoss()
    batches = memory_batches(first_1000, 450)  # 450, 450 and a last batch of 100
    assert [len(y) for _, y in batches] == [450, 450, 100]

    with torch.no_grad():
        losses = [(loss_fn(model(X), y).item(), len(y)) for X, y in batches]
    weighted = sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
    unweighted = sum(loss for loss, _ in losses) / len(losses)
    assert abs(weighted - unweighted) > 1e-3 * weighted  # the test can tell them apart

    train_loss, _ = train(model, batches, loss_fn, optimizer, accuracy_metric(10, CPU), CPU)
    val_loss, _ = evaluate(model, batches, loss_fn, accuracy_metric(10, CPU), CPU)
    assert train_loss == pytest.approx(weighted, rel=1e-5)
    assert val_loss == pytest.approx(weighted, rel=1e-5)


# --- gradient clipping ------------------------------------------------------------------------------

class ScaledLoss(nn.Module):
    """Cross-entropy times a large factor: gradients far above any sensible clip norm."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.scale * nn.functional.cross_entropy(logits, target)


def grad_norms_at_step(arrays, clip_norm: float | None) -> list[float]:
    """The total gradient L2 norm seen by optimizer.step() at every step of one epoch."""
    torch.manual_seed(0)
    model = make_mlp(hidden_sizes=(64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # same weights, same raw gradients each run
    norms: list[float] = []

    def record(opt, args, kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())

    optimizer.register_step_pre_hook(record)
    train(model, memory_batches(arrays, 100), ScaledLoss(1000.0), optimizer, accuracy_metric(10, CPU), CPU,
          clip_norm=clip_norm)
    return norms


def test_clip_norm_bounds_the_gradient_norm_at_each_step(first_1000):
    clip_norm = 1.0
    unclipped = grad_norms_at_step(first_1000, None)
    clipped = grad_norms_at_step(first_1000, clip_norm)

    assert len(unclipped) == len(clipped) == 10
    assert min(unclipped) > 10 * clip_norm  # without clipping the bound is far exceeded
    assert max(clipped) <= clip_norm * (1 + 1e-4)
    assert min(clipped) >= clip_norm * (1 - 1e-3)  # scaled down to the bound, not zeroed


# --- checkpoints and divergence ------------------------------------------------------------------

@pytest.mark.parametrize("source", SOURCES)
def test_checkpoint_round_trip_resumes_bit_for_bit(small_data, source, tmp_path):
    # three epochs: a scheduler left unrestored only shows in the lr of the epoch after the next
    config = TrialConfig(**{**SMALL, "epochs": 3}, source=source, seed=3)
    uninterrupted = run_records(config, small_data)

    run = build_run(config, small_data, CPU)
    first = next(train_and_evaluate(run))
    path = save_checkpoint(tmp_path, config, run.input_shape, run.num_classes, run.state_dict())
    assert path == tmp_path / CHECKPOINT_FILE

    # the checkpoint alone says what model it holds
    saved = load_checkpoint(tmp_path)
    assert saved.config == config
    assert (saved.input_shape, saved.num_classes) == ((1, 28, 28), 10)

    # a fresh run, built with another seed so that nothing but the checkpoint can make it agree
    resumed_run = build_run(dataclasses.replace(config, seed=config.seed + 1), small_data, CPU)
    resumed_run.load_state_dict(saved.state)
    assert resumed_run.epoch == 1
    resumed = list(train_and_evaluate(resumed_run))

    assert metrics(first) == metrics(uninterrupted[0])
    assert [r.epoch for r in resumed] == [2, 3]
    assert [metrics(r) for r in resumed] == [metrics(r) for r in uninterrupted[1:]]


CNN_WITH_DROPOUT = dict(model="cnn", model_args={"channels": [4], "hidden": 16, "dropout": 0.5},
                        train_size=500, val_size=100, epochs=3, batch_size=50, seed=5)


@pytest.fixture(scope="module")
def cnn_data(mnist_train) -> Data:
    return mnist_data(*split(mnist_train, 500, 100, split_seed=0))


EXAMPLE_NET = str(Path(__file__).resolve().parents[3] / "examples" / "mnist_cnn" / "model.py") + ":Net"


@pytest.mark.parametrize("model", [{}, {"model": EXAMPLE_NET, "model_args": {"channels": 4, "hidden": 16, "dropout": 0.3}}],
                         ids=["builtin cnn", "examples/mnist_cnn"])
def test_a_model_with_dropout_resumes_bit_for_bit(cnn_data, tmp_path, model):
    """Dropout draws from torch's global RNG, not the trial's generator: the checkpoint must hold it."""
    config = TrialConfig(**{**CNN_WITH_DROPOUT, **model})
    straight = build_run(config, cnn_data, CPU)
    uninterrupted = list(train_and_evaluate(straight))

    run = build_run(config, cnn_data, CPU)
    next(train_and_evaluate(run))
    save_checkpoint(tmp_path, config, run.input_shape, run.num_classes, run.state_dict())
    torch.manual_seed(999)  # whatever ran in between (another trial, a restarted worker) drew too

    # a fresh build, as a restarted trial makes; another seed, so only the checkpoint can make it agree
    resumed_run = build_run(dataclasses.replace(config, seed=config.seed + 1), cnn_data, CPU)
    assert resumed_run.load_state_dict(load_checkpoint(tmp_path).state) is None  # no note: every state was there
    resumed = list(train_and_evaluate(resumed_run))

    assert [metrics(r) for r in resumed] == [metrics(r) for r in uninterrupted[1:]]
    for (name, a), b in zip(straight.model.state_dict().items(), resumed_run.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_checkpoint_without_the_global_rng_states_resumes_with_a_note(cnn_data, tmp_path):
    """Checkpoints written before the RNG states were saved still load; the run says what it lacks."""
    config = TrialConfig(**{**CNN_WITH_DROPOUT, "epochs": 2})
    run = build_run(config, cnn_data, CPU)
    next(train_and_evaluate(run))
    old_state = {k: v for k, v in run.state_dict().items() if k != "rng"}
    save_checkpoint(tmp_path, config, run.input_shape, run.num_classes, old_state)

    resumed_run = build_run(config, cnn_data, CPU)
    note = resumed_run.load_state_dict(load_checkpoint(tmp_path).state)
    assert note is not None and "random number generator states" in note and "not bit for bit" in note
    assert [r.epoch for r in train_and_evaluate(resumed_run)] == [2]


def test_a_checkpoint_rebuilds_its_model_for_evaluation(small_data, tmp_path):
    """evaluate_model: what the driver does with the best checkpoint and the test part."""
    config = TrialConfig(**{**SMALL, "epochs": 1}, model_args={"hidden_sizes": [32]})
    run = build_run(config, small_data, CPU)
    (record,) = train_and_evaluate(run)
    save_checkpoint(tmp_path, config, run.input_shape, run.num_classes, run.state_dict())
    saved = load_checkpoint(tmp_path)
    loss, acc = evaluate_model(saved.config, saved.state["model"], saved.input_shape, saved.num_classes,
                               small_data.val, small_data.standardize, CPU)
    # the same weights on the same validation examples: the numbers the epoch reported
    assert loss == pytest.approx(record.val_loss, rel=1e-6)
    assert acc == pytest.approx(record.val_acc, abs=1e-9)


def test_unreadable_checkpoints_are_checkpoint_errors(tmp_path, small_data):
    missing = tmp_path / "missing"
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(missing)

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(garbage)
    assert str(garbage / CHECKPOINT_FILE) in str(caught.value)

    # the first release saved the bare state dict, without a format or config
    old = tmp_path / "old"
    old.mkdir()
    run = build_run(TrialConfig(**SMALL), small_data, CPU)
    torch.save(run.state_dict(), old / CHECKPOINT_FILE)
    with pytest.raises(CheckpointError, match="checkpoint format None, this version reads 2"):
        load_checkpoint(old)

    # truncated mid-file (a worker killed while writing)
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    save_checkpoint(truncated, TrialConfig(**SMALL), run.input_shape, run.num_classes, run.state_dict())
    data = (truncated / CHECKPOINT_FILE).read_bytes()
    (truncated / CHECKPOINT_FILE).write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(truncated)


def test_divergent_run_is_reported_and_stops_early(small_data):
    config = TrialConfig(**{**SMALL, "epochs": 3}, lr=1e6, clip_norm=None)
    records = run_records(config, small_data)  # no exception

    assert 1 <= len(records) < config.epochs
    assert records[-1].diverged
    assert not math.isfinite(records[-1].train_loss)
    assert not any(r.diverged for r in records[:-1])


# --- learning-rate schedule ------------------------------------------------------------------------

def test_the_cosine_schedule_follows_epochs_unless_t_max_is_set(mnist_train):
    """With more epochs than the old default t_max (5), the lr fell to 0 and climbed back."""
    data = mnist_data(*split(mnist_train, 200, 100, split_seed=0))
    tiny = dict(train_size=200, val_size=100, batch_size=100, model_args={"hidden_sizes": [8]})
    lrs = [r.epoch_lr for r in run_records(TrialConfig(**tiny, epochs=7), data)]
    assert lrs[0] == 0.05 and all(a > b > 0 for a, b in zip(lrs, lrs[1:])), lrs  # one half cosine over 7 epochs

    restarting = [r.epoch_lr for r in run_records(TrialConfig(**tiny, epochs=4, t_max=2), data)]
    assert restarting[2] == pytest.approx(0.0, abs=1e-12) and restarting[3] > 0  # a t_max that is set is kept


def test_a_t_max_below_epochs_gets_a_note_and_others_do_not():
    note = schedule_note(TrialConfig(epochs=10, t_max=4))
    assert note.startswith("t_max (4) < epochs (10): ") and "climbs back" in note
    assert schedule_note(TrialConfig(epochs=10)) is None
    assert schedule_note(TrialConfig(epochs=10, t_max=10)) is None and schedule_note(TrialConfig(epochs=3, t_max=8)) is None


# --- models and optimizers ------------------------------------------------------------------------

def test_the_builtin_cnn_trains_one_tiny_epoch(mnist_train):
    data = mnist_data(*split(mnist_train, 500, 100, split_seed=0))
    config = TrialConfig(model="cnn", model_args={"channels": [4], "hidden": 16, "dropout": 0.0},
                         epochs=1, batch_size=50, train_size=500, val_size=100)
    run = build_run(config, data, CPU)
    assert [type(m) for m in run.model if isinstance(m, nn.Conv2d)] == [nn.Conv2d]
    assert run.model[0].out_channels == 4 and run.model[-1].out_features == 10
    before = [p.detach().clone() for p in run.model.parameters()]
    (record,) = train_and_evaluate(run)
    assert record.epoch == 1
    assert math.isfinite(record.train_loss) and math.isfinite(record.val_loss)
    assert any(not torch.equal(b, p) for b, p in zip(before, run.model.parameters()))  # it trained


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_trains_and_is_the_one_configured(small_data, optimizer):
    config = TrialConfig(**{**SMALL, "epochs": 1}, optimizer=optimizer, lr=0.01 if optimizer != "sgd" else 0.05,
                         nesterov=optimizer == "sgd", beta1=0.8, beta2=0.99, weight_decay=1e-4)
    run = build_run(config, small_data, CPU)
    expected = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer]
    assert type(run.optimizer) is expected
    group = run.optimizer.param_groups[0]
    assert group["weight_decay"] == 1e-4
    if optimizer == "sgd":
        assert group["nesterov"] is True and group["momentum"] == config.momentum
    else:
        assert group["betas"] == (0.8, 0.99)
    (record,) = train_and_evaluate(run)
    assert record.train_loss < math.log(10)  # it learned something in one epoch


# --- accelerator ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(ACCELERATOR is None, reason="no accelerator available")
def test_on_the_accelerator_batches_live_there_and_runs_repeat(small_data):
    device = ACCELERATOR
    config = TrialConfig(**SMALL, seed=1)

    run = build_run(config, small_data, device)
    assert run.train_batches.inputs.device.type == device.type
    assert run.train_batches.labels.device.type == device.type
    # the validation batches: a look at the training ones would draw a shuffle and change the run
    X, y = next(iter(run.val_batches))
    assert X.device.type == y.device.type == device.type
    assert next(run.model.parameters()).device.type == device.type

    first = list(train_and_evaluate(run))
    again = run_records(config, small_data, device)
    assert len(first) == len(again) == config.epochs
    for a, b in zip(first, again):
        for name in ("train_loss", "train_acc", "val_loss", "val_acc", "epoch_lr"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-3, abs=1e-3)
    assert first[-1].val_acc > 0.5


def test_seeding_prepares_deterministic_cuda_without_the_memory_fill(monkeypatch):
    """cuBLAS needs a fixed workspace to be deterministic; filling fresh memory costs kernels for nothing."""
    import os

    from trainable.seed import set_seed

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    set_seed(0)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.utils.deterministic.fill_uninitialized_memory is False
