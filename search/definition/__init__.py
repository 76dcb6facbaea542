"""The space file -> a validated Space: what a search asks for, checked before anything starts.

schema (each setting's type, rule and default; the one value <-> Optuna distribution mapping),
space (one parse path for the canonical loop and a function trainable), overrides (--set and
flags), enqueue (configs to run first), objectives (metrics, modes, constraints, a trial's point,
the Pareto front) and ranking (which result is best: defined once).

May import: trainable/ only; nothing else of search/. Imports neither Ray nor torch's models.
"""
