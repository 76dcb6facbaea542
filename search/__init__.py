"""The hpsearch driver: space file -> Ray Tune + Optuna search -> results.parquet, best.yaml.

`search.run(space, overrides=..., name=..., resume=...)` is the Python API (search/api.py), and
`search.load_best(run_folder)` returns a run's best model, `search.restore(run_folder)` its `tune.Tuner`;
importing this package loads neither Ray nor torch.
"""

from search.api import load_best, restore, run

__all__ = ["load_best", "restore", "run"]
