"""What to try next: the searcher Tune asks, and the schedulers that stop or change trials.

searcher (which searcher a space gets), ordered (the reproducible OrderedSearch), halving
(reproducible ASHA and Hyperband), pbt, budget (time_budget and stop_when), study (the search as
an Optuna study), warm_start (enqueued configs and an earlier run's trials).

May import: search.store, search.definition and trainable/. Tune pickles these classes by module path
(search/__init__.py keeps 0.1.0's paths importable).
"""
