"""`scheduler: fifo`: every trial runs all its epochs, and a trial's reports reach the driver in batches.

Tune asks a trial's actor for each report in its own call (`train`), and a function trainable's thread waits
in its `report` until the driver has handled that one and asked for the next: about 5 ms an epoch on two
busy cores, against 13 ms of work in the short-trial bench's epochs (bench/short_trials.py, docs/performance.md).
Under this scheduler the driver asks instead for what a trial reported in the next BATCH_SECONDS (at least one
report, at most BATCH_MOST; search/execution/ray_internals.py `batched_results`, trainable/adapter.py
`train_batch`), so the function goes on without waiting; an epoch longer than that, and a report with a
checkpoint, is one report a call, as before. Each report is handled by Tune, the searcher and the callbacks
as before, in its order, so nothing of a search changes but when its reports arrive: the live journal and
the progress lines at most that much later, and a failing trial's reports before its error all kept.

Only while nothing may stop a trial at one of its reports: a Tune stop at report n of a batch drops the reports
after it, epochs the trial ran (and may have checkpointed) that no record shows. So a search with a
time_budget or a stop_when target gets Tune's FIFOScheduler, one report a call; so do Tune's other schedulers,
which decide at reports. A search that ends early for another reason (its first trials all failing, a full disk,
a --resume that adds a budget) stops its running trials at most one batch later.
"""

from __future__ import annotations

from ray.tune.schedulers import FIFOScheduler

BATCH_SECONDS = 0.1  #: a trial's reports of this long reach the driver in one call (a progress line's delay)
BATCH_MOST = 64  #: and at most this many: Tune handles them in one go, between other trials' reports


class BatchingFIFO(FIFOScheduler):
    """Tune's FIFOScheduler, whose trials' reports reach the driver in batches (see the module docstring)."""

    result_batch = (BATCH_SECONDS, BATCH_MOST)  #: read by search/execution/ray_internals.py batched_results


def fifo_scheduler(experiment) -> FIFOScheduler:
    """BatchingFIFO, or Tune's own where the search may stop a trial at a report (see the module docstring)."""
    if experiment.time_budget is not None or experiment.stop_when:
        return FIFOScheduler()
    return BatchingFIFO()
