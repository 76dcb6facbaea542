"""What a search leaves, derived from the run folder: never the truth itself, always rebuildable.

finish (results.parquet, best.yaml and the summary at a search's end), summary, report
(report.html), pareto (pareto.yaml), export (a run's model), runs (`runs`, `compare`), journal
(optuna.journal), phases (where the command's time went: timing.yaml).

May import: search.searching, search.store, search.definition and trainable/.

Release 0.1.0 had a module `search.outputs` (now search.outputs.finish): its names still resolve
here, for one release.
"""


def __getattr__(name: str):
    # 0.1.0's `from search.outputs import Outcome, finish`; loaded on use, so importing
    # search.outputs.phases does not load pandas and pyarrow
    import importlib

    finish = importlib.import_module("search.outputs.finish")
    try:
        return getattr(finish, name)
    except AttributeError:
        raise AttributeError(f"module 'search.outputs' has no attribute {name!r}") from None
