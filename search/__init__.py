"""The hpsearch driver: space file -> Ray Tune + Optuna search -> results.parquet, best.yaml."""
