"""Successive halving that reproduces: which trials stop, and at which epoch, depends only on the seed.

Ray's ASHA judges a trial at a rung (an epoch grace_period * reduction_factor**k) against the
results that have arrived at that rung so far, so a different finishing order stops different
trials. OrderedHalving judges trial n at a rung against the trials numbered below n that reach
that rung (their value at it), whatever order they arrive in:

- the rule is ASHA's: trial n goes on if its value is at least the (1 - 1/reduction_factor)
  percentile of the lower-numbered trials' values at the rung (np.nanpercentile, as Ray's
  ASHA computes it), and always when none of them reached the rung; a value that is not
  finite (a diverged trial) is below every cutoff;
- trial n waits at a rung only while a lower-numbered trial it is compared with has not yet either
  reached the rung or ended short of it. While every such trial is running (each has a slot and gets
  there on its own), n is held where it is (`hold`: Tune's NOOP, its actor idle in its report) and
  goes on or stops when they arrive: no checkpoint, no restart. Otherwise Tune PAUSEs it (it
  checkpoints, frees its slot, and later resumes from that checkpoint bit for bit), and so does a
  held trial once a trial it waits for stops running. Holding matters for a function that saves no
  checkpoint, which a pause restarts from epoch 0: two trials started together on new actors reach
  the first rung in either order, and the later-numbered one then trained its first epochs twice
  (bench/short_trials.py, issue 49). The search gives no `hold` (search/execution/tuner.py) with
  experiment.trial_timeout, whose watchdog would take a long hold for a hung epoch, nor to trials of
  several workers, whose other ranks would wait at a collective with a timeout of their own. Those
  waits are counted (`waits`: trial number -> seconds) and said in the summary, as OrderedSearch's are;
- a lower-numbered trial that ends in ERROR (after its restarts) before the rung counts as
  ending short of it, with no value; so the search reproduces when its errors do;
- Hyperband (`brackets` > 1): trial n is in bracket n mod brackets; bracket s first judges
  its trials at epoch grace_period * reduction_factor**s, and compares a trial only with the
  lower-numbered trials of its own bracket.
- several objectives (MO-ASHA, arXiv 2106.12639): a rung value is each objective signed to maximise
  and the constraints' total violation; trial n goes on unless at least 1/reduction_factor of the
  lower-numbered trials at the rung lie on a strictly better front of a non-dominated sorting that
  puts feasible before infeasible (search/definition/objectives.py fronts), as pareto.yaml counts them;
- bohb is this scheduler with brackets=1; what makes it BOHB is the searcher's model, fit at a rung
  (search/searching/ordered.py MULTIFIDELITY "rung").

No deadlock: the lowest-numbered trial that has not passed a rung never waits, a paused trial holds
no slot, and a held one waits only for lower-numbered trials that hold theirs and are not paused (a
chain of holds ends at a trial that runs); the waiting trials are judged again at every result, at
every trial's end and in choose_trial_to_run; Tune resumes a paused trial only when choose_trial_to_run
picks it, and it picks those cleared to go on, lowest number first.

What TPE learns from a trial stopped here is OrderedSearch's part (search/searching/ordered.py
MULTIFIDELITY: PRUNED, with its curve), told in trial-number order like every result.

The decisions and waits are also written to `halving.json` in the run folder: the summary
reads the waits there, and a resumed search takes the decisions back (a trial rerun from an
earlier checkpoint reaches the same values, so the same decisions, but this saves its waits).
A decision on a running trial is written at most once a second (RECORD_EVERY_S) and when the search
ends (`flush_records`, after Tune returns): written at each rung it was a file replaced and synced per
decision, ~9 ms of the controller's turn per trial of one-epoch trials (bench/short_trials.py, py-spy),
an object-store upload per decision on a URI run. A driver killed within that second loses only what
the rerun decides again: Tune's record then predates the decision, so the trial reruns from a checkpoint
before the rung and reaches the same value. A decision on a paused trial is written at once: Tune may
restore that trial from a record that says PAUSED, past its rung, and only `stopped` keeps it there.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from search.definition.objectives import Objectives, first, fronts
from search.definition.ranking import signed
from search.store.storage import Storage

RECORD_FILE = "halving.json"  # in the run folder
RECORD_EVERY_S = 1.0  # a running trial's decisions reach halving.json at most this often (module docstring)
_unwritten: "weakref.WeakSet[OrderedHalving]" = weakref.WeakSet()  # schedulers holding decisions not yet written


def flush_records() -> None:
    """Write every decision a scheduler of this process holds back (after Tune returned)."""
    for scheduler in list(_unwritten):
        scheduler._save(now=True)


def milestones(first: int, max_t: int, reduction_factor: int) -> list[int]:
    """The rung epochs from `first` on, each reduction_factor times the last, below max_t."""
    rungs, epoch = [], first
    while epoch < max_t:
        rungs.append(epoch)
        epoch *= reduction_factor
    return rungs


def rung_epochs(scheduler: str, grace_period: int, max_t: int, reduction_factor: int) -> tuple[int, ...]:
    """Every epoch at which some trial of the search is judged (asha and bohb: one bracket; hyperband: all)."""
    brackets = bracket_count(grace_period, max_t, reduction_factor) if scheduler == "hyperband" else 1
    return tuple(sorted({r for s in range(brackets)
                         for r in milestones(grace_period * reduction_factor ** s, max_t, reduction_factor)}))


def bracket_count(grace_period: int, max_t: int, reduction_factor: int) -> int:
    """Hyperband's brackets: one per rung a bracket can start at (at least one)."""
    return max(1, len(milestones(grace_period, max_t, reduction_factor)))


class OrderedHalving(FIFOScheduler):
    """Tune scheduler: reproducible successive halving (brackets=1) or Hyperband (brackets>1)."""

    # Tune may otherwise hand a trial's results over in batches, past the rung it should stop at
    _supports_buffered_results = False
    objectives: Objectives | None = None  # a scheduler pickled before MO-ASHA (a run resumed from then) has none

    def __init__(self, *, metric: str, mode: str, max_t: int, grace_period: int, reduction_factor: int,
                 brackets: int = 1, storage: Storage | None = None, record: str = RECORD_FILE,
                 objectives: Objectives | None = None, hold: Callable[[Any, Trial], None] | None = None,
                 park: Callable[[Any, Trial], None] | None = None):
        super().__init__()
        # how a trial held at a rung goes on (search/execution/ray_internals.py continue_held_trial: Tune has no
        # public way); None: a waiting trial is always paused (module docstring)
        self.hold = hold
        # how a trial Tune requeues with a rung undecided waits PAUSED for it (ray_internals.park_requeued_trial)
        self.park = park
        self._metric, self.mode, self.reduction_factor = first(metric), first(mode), reduction_factor
        # several objectives: a rung is ranked by non-dominated sorting (MO-ASHA), constraints counted
        self.objectives = objectives if objectives is not None and objectives.several else None
        self.rungs = [milestones(grace_period * reduction_factor ** s, max_t, reduction_factor)
                      for s in range(brackets)]
        self.storage, self.record = storage, record  # where halving.json goes (None: nowhere)
        # n -> rung epoch -> measured(): signed score, or with several objectives their list (None: not finite)
        self.values: dict[int, dict[int, float | list[float] | None]] = {}
        self.decided: dict[int, dict[int, str]] = {}  # n -> rung epoch -> CONTINUE | STOP
        self.stopped: dict[int, int] = {}  # n -> the rung epoch it was stopped at
        self.waits: dict[int, float] = {}  # n -> seconds it waited at rungs, in all
        self._trials: dict[int, Trial] = {}
        self._ended: set[int] = set()  # completed, stopped or removed: reaches no further rung
        self._waiting: dict[int, tuple[int, float]] = {}  # n -> (rung epoch, monotonic time it paused)
        self._ready: set[int] = set()  # paused, cleared to go on, not yet resumed
        self._held: dict[int, tuple[int, float]] = {}  # n -> (rung epoch, monotonic time): waiting on its actor
        self._loaded = False
        self._settling = False
        self._written_at = 0.0  # when halving.json was last written (wall clock: a resumed pickle compares)

    def __setstate__(self, state: dict[str, Any]) -> None:  # a scheduler pickled by an earlier release
        self.__dict__.update({"hold": None, "park": None, "_held": {}, "_written_at": 0.0, **state})

    # ---- what Tune calls ---------------------------------------------------------------

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._load()
        n = self.number(trial)
        self._trials[n] = trial
        self._ended.discard(n)  # a trial restarted after an error is live again
        rung = self._undecided_rung(trial)
        if rung is not None and trial.status == Trial.PENDING and self.park is not None:
            # requeued (its process died) or resumed while held or paused at this rung: restored from the rung's
            # checkpoint, its next report would be past the rung, and nothing would judge it there (a trial killed
            # while held ran on to the next rung where the undisturbed run stopped it: tests/searches/test_chaos.py).
            # It waits PAUSED for the rung's decision, as a trial paused there does (_settle).
            self._waiting[n] = (rung, time.monotonic())
            self.park(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        n, epoch = self.number(trial), result.get("epoch")
        self._trials[n] = trial
        self._ready.discard(n)  # it runs again
        if epoch is None or int(epoch) not in self.rungs[self.bracket(n)]:
            return TrialScheduler.CONTINUE
        rung = int(epoch)
        self.values.setdefault(n, {}).setdefault(rung, self.measured(result))
        decision = self.decided.get(n, {}).get(rung)
        if decision is None and (rung >= int(trial.config.get("epochs", rung + 1)) or result.get("diverged")):
            decision = TrialScheduler.CONTINUE  # its last epoch: it ends anyway; its value counts for later trials
        if decision is None and self._comparable(n, rung):
            decision = self._decide(n, rung)
            self._save(now=False)
        self._settle(tune_controller)  # its value may clear trials waiting at this rung
        if decision is None and self.hold is not None and self._holdable(n, rung):
            self._held[n] = (rung, time.monotonic())
            return TrialScheduler.NOOP
        if decision is None:
            self._waiting[n] = (rung, time.monotonic())
            return TrialScheduler.PAUSE
        if decision == TrialScheduler.STOP:
            self._ended.add(n)
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self._end(trial)
        # the trials waiting for this one are judged at its end, not only at the next result or choose_trial_to_run:
        # Tune asks the latter at every step, but a caller that asks it only for a free slot (bench/schedules.py's
        # simulator, where a held trial keeps its slot) would leave a trial held for this one held
        self._settle(tune_controller)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._end(trial)
        self._settle(tune_controller)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        # called before a restart too (then on_trial_add follows); a final ERROR is read from
        # the trial's status when the waiting trials are next settled
        self._waiting.pop(self.number(trial), None)
        self._held.pop(self.number(trial), None)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        self._settle(tune_controller)
        if self in _unwritten:
            self._save(now=False)  # decisions held back: written once their second has passed
        for n in sorted(self._ready):  # cleared to go on: lowest number first, it may clear others
            if self._trials[n].status == Trial.PAUSED:
                return self._trials[n]
        for trial in tune_controller.get_trials():
            if trial.status == Trial.PENDING and self._stopped_already(trial):
                # a resume of a trial stopped while it waited at a rung: Tune snapshots a trial again
                # only when it has an actor, so its record may still say PAUSED, and Tune restores
                # that as PENDING. Stopped again, not run on past the rung it was stopped at.
                self._ended.add(self.number(trial))
                tune_controller.stop_trial(trial)
            elif trial.status == Trial.PENDING:
                return trial
        return None

    def _undecided_rung(self, trial: Trial) -> int | None:
        """The rung at which trial's value is recorded and no decision was made (None: none): a rung it left undecided."""
        n = self.number(trial)
        decided, last = self.decided.get(n, {}), int(trial.config.get("epochs", 0) or 0)
        open_rungs = [r for r in self.values.get(n, {}) if r not in decided and (not last or r < last)]
        return max(open_rungs, default=None)

    def _stopped_already(self, trial: Trial) -> bool:
        n = self.number(trial)
        return n in self.stopped and int((trial.last_result or {}).get("epoch") or 0) >= self.stopped[n]

    def debug_string(self) -> str:
        return (f"Reproducible successive halving, rungs {self.rungs}; "
                f"{len(self._waiting) + len(self._held)} trial(s) waiting")

    # ---- the rule ----------------------------------------------------------------------

    @staticmethod
    def number(trial: Trial) -> int:
        return int(trial.config["trial_number"])

    def bracket(self, n: int) -> int:
        return n % len(self.rungs)

    def signed(self, value: Any) -> float | None:
        """A score to maximise: the metric, negated for mode min; None if it does not score (search/definition/ranking.py)."""
        return signed(value, self.mode)

    def measured(self, result: dict) -> float | list[float] | None:
        """A trial's value at a rung: signed(metric); with several objectives, each objective signed, then the
        total violation of the constraints (0: feasible), or None where an objective is not finite."""
        if self.objectives is None:
            return self.signed(result.get(self._metric))
        values = [signed(result.get(m), mode) for m, mode in zip(self.objectives.metrics, self.objectives.modes)]
        scores = [v for v in values if v is not None]
        if len(scores) < len(values):
            return None
        return [*scores, float(sum(max(0.0, v) for v in self.objectives.violations(result)))]

    def _peers(self, n: int) -> range:
        """The lower-numbered trials of n's bracket."""
        return range(self.bracket(n), n, len(self.rungs))

    def _comparable(self, n: int, rung: int) -> bool:
        """Whether every lower-numbered trial of n's bracket has reached `rung` or ended short of it."""
        return all(rung in self.values.get(k, {}) or self._has_ended(k) for k in self._peers(n))

    def _holdable(self, n: int, rung: int) -> bool:
        """Whether every trial n waits for at `rung` is running and not paused (so it gets there holding its slot)."""
        awaited = [k for k in self._peers(n) if rung not in self.values.get(k, {}) and not self._has_ended(k)]
        return all(k in self._trials and self._trials[k].status == Trial.RUNNING and k not in self._waiting
                   for k in awaited)

    def _has_ended(self, k: int) -> bool:
        trial = self._trials.get(k)
        return k in self._ended or (trial is not None and trial.status in (Trial.ERROR, Trial.TERMINATED))

    def _decide(self, n: int, rung: int) -> str:
        """ASHA's rule over the lower-numbered trials at the rung; remembered, so a rerun epoch gets the same."""
        others = [self.values[k][rung] for k in self._peers(n) if rung in self.values.get(k, {})]
        finite = [v for v in others if v is not None]
        value = self.values[n][rung]
        decision = TrialScheduler.CONTINUE
        if self.objectives is not None:  # MO-ASHA: n goes on while fewer than 1/rf of the others are on a better front
            everyone = cast("list[list[float] | None]", [*others, value])  # measured() gave each a list
            front = fronts([None if v is None else v[:-1] for v in everyone],
                           [math.inf if v is None else v[-1] for v in everyone])
            better = sum(1 for f in front[:-1] if f < front[-1])
            if others and better >= len(others) / self.reduction_factor:
                decision = TrialScheduler.STOP
        elif finite:
            cutoff = float(np.nanpercentile(finite, (1 - 1 / self.reduction_factor) * 100))
            if value is None or cast(float, value) < cutoff:  # one objective: measured() gave a float
                decision = TrialScheduler.STOP
        elif others and value is None:
            decision = TrialScheduler.STOP
        self.decided.setdefault(n, {})[rung] = decision
        if decision == TrialScheduler.STOP:
            self.stopped[n] = rung
        return decision

    def _settle(self, tune_controller) -> None:
        """Decide for the paused trials whose comparison is now complete: stop them or clear them to go on."""
        if self._settling:  # stop_trial calls back into this scheduler
            return
        self._settling = True
        changed = False
        try:
            for n in sorted({*self._waiting, *self._held}):  # lower numbers first: stopping one can clear a higher one
                trial = self._trials[n]
                if n in self._held:
                    rung, since = self._held[n]
                    if trial.status != Trial.RUNNING:  # Tune stopped it meanwhile (the search's stop)
                        del self._held[n]
                        continue
                    if not self._comparable(n, rung):
                        if not self._holdable(n, rung):  # a trial it waits for stopped running: free the slot
                            del self._held[n]
                            self._waiting[n] = (rung, since)
                            tune_controller.pause_trial(trial)
                        continue
                    del self._held[n]
                else:
                    rung, since = self._waiting[n]
                    if trial.status != Trial.PAUSED or not self._comparable(n, rung):
                        continue  # still saving its checkpoint, or still waiting
                    del self._waiting[n]
                held = trial.status == Trial.RUNNING
                self.waits[n] = self.waits.get(n, 0.0) + time.monotonic() - since
                changed = True
                if self._decide(n, rung) == TrialScheduler.STOP:
                    self._ended.add(n)
                    tune_controller.stop_trial(trial)
                elif held and self.hold is not None:
                    self.hold(tune_controller, trial)
                else:
                    self._ready.add(n)
        finally:
            self._settling = False
        if changed:
            self._save()

    def _end(self, trial: Trial) -> None:
        n = self.number(trial)
        self._ended.add(n)
        self._waiting.pop(n, None)
        self._held.pop(n, None)
        self._ready.discard(n)

    # ---- the record in the run folder ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"values": self.values, "decided": self.decided, "stopped": self.stopped, "waits": self.waits}

    def _save(self, now: bool = True) -> None:
        """Write halving.json; `now` False: only if the last write is RECORD_EVERY_S old, else at the next."""
        if self.storage is None:
            return
        at = time.time()
        if not now and 0 <= at - self._written_at < RECORD_EVERY_S:
            _unwritten.add(self)
            return
        _unwritten.discard(self)
        self._written_at = at
        self.storage.write(self.record, json.dumps(self.state()).encode())

    def _load(self) -> None:
        """A resumed search: the decisions and waits of the run before (once, before the first trial is added)."""
        if self._loaded or self.storage is None:
            return
        self._loaded = True
        saved = read_record(self.storage, self.record)
        self.values, self.decided = saved["values"], saved["decided"]
        self.stopped, self.waits = saved["stopped"], saved["waits"]


def read_record(storage: Storage, relative: str) -> dict[str, Any]:
    """halving.json as the scheduler holds it (int keys); empty if there is none or it does not read."""
    empty: dict[str, Any] = {"values": {}, "decided": {}, "stopped": {}, "waits": {}}
    data = storage.read(relative)
    if data is None:
        return empty
    try:
        raw = json.loads(data)
        ints = lambda mapping: {int(k): v for k, v in mapping.items()}  # noqa: E731
        return {"values": {int(n): ints(v) for n, v in raw["values"].items()},
                "decided": {int(n): ints(v) for n, v in raw["decided"].items()},
                "stopped": ints(raw["stopped"]), "waits": ints(raw["waits"])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return empty


def summary_note(storage: Storage, record: str, scheduler: str) -> str:
    """The summary's line for a reproducible halving search (with its leading newline and indent): the rule,
    the trials stopped early, and the rungs' waits, from halving.json at `record`."""
    halving = read_record(storage, record)
    held = sum(halving["waits"].values())
    return (f"\n      {scheduler}: reproducible: trial n is judged at a rung against the trials "
            f"numbered below it; {len(halving['stopped'])} trial(s) stopped early; "
            f"{len(halving['waits'])} waited at a rung for lower-numbered ones, {held:.1f} s in all")
