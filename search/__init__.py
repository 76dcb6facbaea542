"""The hpsearch driver: space file -> Ray Tune + Optuna search -> results.parquet, best.yaml.

`search.run(space, overrides=..., name=..., resume=...)` is the Python API (search/api.py), and
`search.restore(run_folder)` gives its `tune.Tuner`;
importing this package loads neither Ray nor torch.
"""

from search.api import restore, run

__all__ = ["restore", "run"]
