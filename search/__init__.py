"""The hpsearch driver: space file -> Ray Tune + Optuna search -> results.parquet, best.yaml.

`search.run(space, overrides=..., name=..., resume=...)` is the Python API (search/api.py);
importing this package loads neither Ray nor torch.
"""

from search.api import run

__all__ = ["run"]
