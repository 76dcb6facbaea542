"""The canonical training loop: train() and evaluate() per epoch, and the run around them.

Framework-free: these functions take what they need, return numbers and never print,
report or import Ray. The Ray adapter (adapter.py) and the CLI (__main__.py) drive
`train_and_evaluate`, which yields one EpochRecord per epoch.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch
from torch import nn

from trainable.batches import Batches, InMemoryBatches, make_loader
from trainable.config import MUTABLE, TrialConfig, schedule_period
from trainable.data import Arrays, Data, Standardize
from trainable.distributed import SINGLE, ShardedBatches, World, summed, wrap_model
from trainable.factories import build_model
from trainable.measures import ACCURACY, LossFunction, build_loss, build_metrics, fit_outputs
from trainable.report import EpochRecord
from trainable.seed import global_rng_states, set_global_rng_states, set_seed

if TYPE_CHECKING:
    from torchmetrics import Metric  # imported where metrics are built (trainable/measures.py)


Metrics = Mapping[str, "Metric"]  #: column name without train_/val_ (acc, f1_score, ...) -> its torchmetrics object


def train(model: nn.Module, batches: Batches, loss_fn: LossFunction, optimizer: torch.optim.Optimizer,
          metrics: Metric | Metrics, device: torch.device,
          clip_norm: float | None = None, *, distributed: bool = False) -> tuple[float, Any]:
    """One epoch of training; returns (mean loss weighted by batch size, the metrics' values).

    `metrics`: a mapping of names to metrics, whose values come back as a dict; or one metric
    (accuracy), whose value comes back as a float. `distributed`: this is one worker of several
    (distributed.py); the loss and the metrics are over every worker's examples.
    """
    model.train()
    # summed on the device: a .item() per batch would force a sync each step
    loss_sum = torch.zeros((), device=device)
    seen = 0
    kept, targets = [], []
    for X, y in batches:
        X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
        outputs = fit_outputs(model(X), y)
        loss = loss_fn(outputs, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        loss_sum += loss.detach() * len(y)
        seen += len(y)
        kept.append(keep_for(metrics, outputs.detach()))
        targets.append(y)
    if distributed:  # torchmetrics sums its states over the workers itself, in compute()
        loss_sum, total = summed(loss_sum, torch.tensor(float(seen), device=device))
        return (loss_sum / total).item(), compute(metrics, kept, targets)
    return (loss_sum / seen).item(), compute(metrics, kept, targets)


def evaluate(model: nn.Module, batches: Batches, loss_fn: LossFunction, metrics: Metric | Metrics,
             device: torch.device) -> tuple[float, Any]:
    """Loss (weighted by batch size) and the metrics' values over `batches`, without gradients."""
    model.eval()
    loss_sum = torch.zeros((), device=device)
    seen = 0
    kept, targets = [], []
    with torch.inference_mode():
        for X, y in batches:
            X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            outputs = fit_outputs(model(X), y)
            loss_sum += loss_fn(outputs, y) * len(y)
            seen += len(y)
            kept.append(keep_for(metrics, outputs))
            targets.append(y)
    return (loss_sum / seen).item(), compute(metrics, kept, targets)


def keep_for(metrics: Metric | Metrics, outputs: torch.Tensor) -> torch.Tensor:
    """What the metrics need of a batch's outputs: accuracy alone needs the predicted classes only
    (a tenth of MNIST's logits to keep), other metrics the outputs (probabilities, regression values)."""
    only_accuracy = not isinstance(metrics, Mapping) or set(metrics) == {ACCURACY}  # one Metric: accuracy
    return outputs.argmax(dim=1) if only_accuracy and outputs.dim() > 1 else outputs


def compute(metrics: Metric | Metrics, kept: list[torch.Tensor], targets: list[torch.Tensor]) -> Any:
    """Each metric over the epoch's kept outputs, updated once: torchmetrics costs ~75 us a call,
    10% of an MNIST epoch of this MLP if called per batch (bench/epoch.py)."""
    single = not isinstance(metrics, Mapping)  # one Metric (accuracy), not several by name
    named: Metrics = metrics if isinstance(metrics, Mapping) else {ACCURACY: metrics}
    outputs, wanted = (torch.cat(kept), torch.cat(targets)) if kept else (None, None)
    values = {}
    for name, metric in named.items():
        metric.reset()
        if outputs is not None:
            metric.update(outputs, wanted)
        value = metric.compute()
        if value.numel() != 1:
            raise ValueError(f"training.metrics: {type(metric).__name__} gave {tuple(value.shape)} values, not one "
                             "number (set its average, e.g. average: macro)")
        values[name] = value.item()
    return values[ACCURACY] if single else values


@dataclass
class Run:
    """Everything one training run holds; `state_dict` is what a checkpoint saves."""

    config: TrialConfig
    device: torch.device
    input_shape: tuple[int, ...]
    num_classes: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator
    train_batches: Batches
    val_batches: Batches
    loss_fn: LossFunction
    train_metric: Metrics  #: training's metrics (measures.build_metrics: acc with cross_entropy, training.metrics)
    val_metric: Metrics  #: validation's: separate objects, so neither epoch's state leaks into the other
    epoch: int = 0  #: epochs completed
    # where the weights come from: the seed that drew them and, per epoch, the trial that trained
    # it and the MUTABLE values it used (PBT copies another trial's weights; best.yaml replays this)
    lineage: dict[str, Any] = field(default_factory=dict)
    world: World = SINGLE  #: this process's rank among the run's workers (distributed.py)
    train_model: nn.Module | None = None  #: the model wrapped for data-parallel training; None: `model` itself
    #: forward_latency_ms after this run's first epoch, given to every later epoch's record: the model and its
    #: batch size stay as they are while it trains, and measuring again cost 7 forward passes an epoch (the
    #: built-in CNN on a CPU: 0.24 s at batch_size 64, 1.2 s at 256; docs/performance.md)
    latency_ms: float | None = None

    def state_dict(self) -> dict[str, Any]:
        # plain tensors and numbers only, so torch.load(weights_only=True) can read it
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            # the global RNGs too: dropout draws from torch's, user code from NumPy's or Python's
            "rng": global_rng_states(),
            "epoch": self.epoch,
            "lineage": copy.deepcopy(self.lineage),
        }

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Continue from `state`; returns a note when the resume cannot be bit for bit."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.epoch = int(state["epoch"])
        # a checkpoint written before lineages were kept: its earlier epochs are not known
        self.lineage = copy.deepcopy(state.get("lineage") or {"seed": self.config.seed, "epochs": []})
        # the checkpoint restored the values it trained with; this run's config may say others
        # (PBT's explore step): changed only where they differ, so a plain restart is bit for bit
        set_hyperparameters(self, {name: getattr(self.config, name) for name in MUTABLE})
        if "rng" not in state:  # written before checkpoints held them
            return ("the checkpoint holds no global random number generator states (an older version wrote "
                    "it): a model that draws randomness (dropout) resumes correctly but not bit for bit")
        return set_global_rng_states(state["rng"])


def set_hyperparameters(run: Run, values: Mapping[str, Any]) -> None:
    """Train on with these MUTABLE values (lr, momentum, weight_decay, clip_norm) from the next epoch.

    lr is the cosine schedule's initial value: a new one scales the schedule, so the current
    learning rate keeps its place on the cosine. clip_norm is read from run.config each epoch;
    momentum applies to SGD only (Adam has betas). A value equal to the one in effect changes nothing.
    """
    run.config = dataclasses.replace(run.config, **values)
    scheduler = run.scheduler
    for i, group in enumerate(run.optimizer.param_groups):
        if "lr" in values and scheduler.base_lrs[i] != values["lr"]:
            group["lr"] = group["lr"] * values["lr"] / scheduler.base_lrs[i]
            scheduler.base_lrs[i] = group["initial_lr"] = values["lr"]
        for name in ("momentum", "weight_decay"):
            if name in values and name in group and group[name] != values[name]:
                group[name] = values[name]


def make_optimizer(config: TrialConfig, model: nn.Module) -> torch.optim.Optimizer:
    if config.optimizer in ("adam", "adamw"):
        adam = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
        return adam(model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                    weight_decay=config.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                           nesterov=config.nesterov and config.momentum > 0, weight_decay=config.weight_decay)


def make_batches(config: TrialConfig, arrays: Arrays, standardize: Standardize | None, device: torch.device, *,
                 shuffle: bool, generator: torch.Generator | None) -> Batches:
    drop_last = config.drop_last and shuffle  # drop_last is about training batches only
    if config.source == "loader":
        # pinned host batches copy to the GPU asynchronously (train() moves them non_blocking);
        # on the CPU pinning only costs
        pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
        return make_loader(arrays, config.batch_size, standardize=standardize, shuffle=shuffle,
                           generator=generator, drop_last=drop_last,
                           num_workers=config.num_workers, pin_memory=pin,
                           persistent_workers=config.persistent_workers)
    return InMemoryBatches(arrays, config.batch_size, device, standardize=standardize,
                           shuffle=shuffle, drop_last=drop_last, generator=generator)


def build_run(config: TrialConfig, data: Data, device: torch.device, world: World = SINGLE) -> Run:
    """Seed, then build model, optimizer, cosine schedule and batch sources for `config`.

    `world`: this worker's rank among config.workers, its process group joined (distributed.py); the
    training batches are then its share, the model wrapped in DistributedDataParallel."""
    if world.size != config.workers:
        raise ValueError(f"workers: the config asks for {config.workers}, but this run has {world.size}")
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    generator = set_seed(config.seed)
    # weight init draws from the seeded global RNG
    model = build_model(config, data.input_shape, data.num_classes).to(device)
    optimizer = make_optimizer(config, model)
    train_batches = make_batches(config, data.train, data.standardize, device, shuffle=True, generator=generator) \
        if not world.distributed else sharded_batches(config, data, device, world)
    val_metric = build_metrics(config, data.num_classes, device)
    for metric in val_metric.values():  # every worker validates on the whole set: nothing to sum across workers
        metric.sync_on_compute = metric._to_sync = False
    return Run(
        config=config,
        device=device,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        model=model,
        optimizer=optimizer,
        # stepped once per epoch, so T_max counts epochs; unset, it follows epochs (one half cosine)
        scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=schedule_period(config)),
        generator=generator,
        train_batches=train_batches,
        val_batches=make_batches(config, data.val, data.standardize, device, shuffle=False, generator=None),
        loss_fn=build_loss(config.loss),
        train_metric=build_metrics(config, data.num_classes, device),
        val_metric=val_metric,
        lineage={"seed": config.seed, "epochs": []},
        world=world,
        train_model=wrap_model(model, device) if world.distributed else None,
    )


def sharded_batches(config: TrialConfig, data: Data, device: torch.device, world: World) -> ShardedBatches:
    """This worker's share of the training batches (distributed.py): DistributedSampler seeded with the trial's seed."""
    pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
    return ShardedBatches(data.train, config.batch_size, device, world, config.seed, standardize=data.standardize,
                          drop_last=config.drop_last, source=config.source, num_workers=config.num_workers,
                          pin_memory=pin, persistent_workers=config.persistent_workers)


def train_and_evaluate(run: Run, schedule: Mapping[int, Mapping[str, Any]] | None = None) -> Iterator[EpochRecord]:
    """Train from `run.epoch` to `config.epochs`, yielding a record after each epoch.

    `schedule` (epoch -> MUTABLE values, config.parse_schedule) changes the hyperparameters
    before that epoch, as a PBT trial had them changed: best.yaml's replay.
    A diverged epoch (NaN or infinite training loss) is yielded, then the run stops:
    more epochs cannot recover it, and the caller scores it like any other result.
    """
    while run.epoch < run.config.epochs:
        if schedule and run.epoch + 1 in schedule:
            set_hyperparameters(run, schedule[run.epoch + 1])
        start = time.perf_counter()
        epoch_lr = run.optimizer.param_groups[0]["lr"]
        if isinstance(run.train_batches, ShardedBatches):  # the epoch's order: (seed, epoch), so a resume keeps it
            run.train_batches.set_epoch(run.epoch)
        train_loss, train_values = train(run.train_model or run.model, run.train_batches, run.loss_fn, run.optimizer,
                                         run.train_metric, run.device, run.config.clip_norm,
                                         distributed=run.world.distributed)
        run.scheduler.step()  # after this epoch's optimizer.step() calls
        trained = time.perf_counter()
        val_loss, val_values = evaluate(run.model, run.val_batches, run.loss_fn, run.val_metric, run.device)
        run.epoch += 1
        run.lineage["epochs"].append({"epoch": run.epoch, "trial_number": run.config.trial_number,
                                      **{name: getattr(run.config, name) for name in MUTABLE}})
        end = time.perf_counter()
        if run.latency_ms is None:
            run.latency_ms = forward_latency_ms(run.model, run.config.batch_size, run.input_shape, run.device)
        record = EpochRecord(run.epoch, train_loss, train_values.get(ACCURACY), val_loss, val_values.get(ACCURACY),
                             epoch_lr, end - start, trained - start, end - trained, parameter_count(run.model),
                             run.latency_ms,
                             extra={f"{part}_{name}": value for part, values in (("train", train_values),
                                                                                 ("val", val_values))
                                    for name, value in values.items() if name != ACCURACY})
        yield record
        if record.diverged:
            return


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def forward_latency_ms(model: nn.Module, batch_size: int, input_shape: tuple[int, ...], device: torch.device,
                       warmup: int = 2, repeats: int = 5) -> float:
    """Median milliseconds of one forward pass on a batch of `batch_size`, in eval mode, after `warmup` passes.

    Measured after a run's first epoch (outside epoch_seconds), and given to every row of the run. The
    batch is zeros: drawing it would move the seeded RNGs, and a forward's time does not depend on the
    values. A few passes of one batch: about a millisecond for the MNIST MLP on a CPU.
    On an accelerator the work is queued, so each pass is timed to a synchronize.
    """
    model.eval()  # train() turns training mode back on; eval keeps batch norm's running stats unchanged
    batch = torch.zeros((batch_size, *input_shape), device=device)
    accelerated = device.type != "cpu"
    times = []
    with torch.inference_mode():
        for i in range(warmup + repeats):
            if accelerated:
                torch.accelerator.synchronize(device)
            start = time.perf_counter()
            model(batch)
            if accelerated:
                torch.accelerator.synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def evaluate_model(config: TrialConfig, model_state: dict[str, Any], input_shape: tuple[int, ...],
                   num_classes: int, arrays: Arrays, standardize: Standardize | None,
                   device: torch.device) -> tuple[float, float | None]:
    """Loss and accuracy (None without one: training.loss other than cross_entropy) on `arrays`."""
    values = metrics_on(config, model_state, input_shape, num_classes, arrays, standardize, device, prefix="")
    return values["loss"], values.get(ACCURACY)


def metrics_on(config: TrialConfig, model_state: dict[str, Any], input_shape: tuple[int, ...],
                 num_classes: int, arrays: Arrays, standardize: Standardize | None, device: torch.device,
                 prefix: str = "test_") -> dict[str, float]:
    """Every metric a run of `config` reports (loss, acc with cross_entropy, training.metrics) on `arrays`
    (e.g. the test part), of a model saved by that run: {test_loss: ..., test_acc: ..., test_f1_score: ...}."""
    model = build_model(config, input_shape, num_classes).to(device)
    model.load_state_dict(model_state)
    batches = make_batches(config, arrays, standardize, device, shuffle=False, generator=None)
    loss, values = evaluate(model, batches, build_loss(config.loss), build_metrics(config, num_classes, device), device)
    return {f"{prefix}{name}": value for name, value in {"loss": loss, **values}.items()}
