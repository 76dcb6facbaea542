"""Ray's MLflow logger, with each run's metric at the run level the trial's value.

MLflow's runs table shows a metric's latest value, and Ray logs one per epoch, so a run would
show its last epoch's val_acc. hpsearch scores a trial by its best epoch (results.parquet,
best.yaml, the journal), so when a trial ends its value is logged again at its last step; the
metric's history keeps every epoch. (Imported only with `loggers: [mlflow]`.)
"""

from __future__ import annotations

from ray.air.integrations.mlflow import MLflowLoggerCallback

from search.definition.ranking import best_value


class TrialValueLogger(MLflowLoggerCallback):
    def __init__(self, metric: str, mode: str, **kwargs):
        super().__init__(**kwargs)
        self.metric, self.mode = metric, mode
        self._seen: dict[str, list[tuple[float, int]]] = {}  # trial id -> (metric, step) per report

    def log_trial_result(self, iteration, trial, result):
        super().log_trial_result(iteration, trial, result)
        self._seen.setdefault(trial.trial_id, []).append((result.get(self.metric), result["training_iteration"]))

    def log_trial_end(self, trial, failed: bool = False):
        seen = self._seen.pop(trial.trial_id, [])
        value = best_value([v for v, _ in seen], self.mode)
        if value is not None and value != seen[-1][0]:  # seen: the trial has a run (its results were logged)
            # through the callback's own public method, at the last step, so it is the run's latest value
            super().log_trial_result(seen[-1][1], trial, {self.metric: value, "training_iteration": seen[-1][1]})
        super().log_trial_end(trial, failed)
