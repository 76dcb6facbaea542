"""The hpsearch driver: space file -> Ray Tune + Optuna search -> results.parquet, best.yaml.

`search.run(space, overrides=..., name=..., resume=...)` is the Python API (search/api.py), and
`search.load_best(run_folder)` returns a run's best model, `search.restore(run_folder)` its `tune.Tuner`;
importing this package loads neither Ray nor torch.

The layers, each allowed to import only those listed before it (tests/project/test_layout.py checks it):

    definition/  the space file -> Space: schema, space, overrides, objectives, ranking ("best")
    store/       the run folder on a disk or an object store: spec.yaml, results.parquet's rows, checkpoints
                 (not `run/`: a subpackage of that name would replace `search.run`, the API, once imported)
    searching/   what to try next: the searcher, reproducible order, halving, PBT, budgets, warm start
    outputs/     what a search leaves: finish, summary, report, pareto.yaml, export, runs, the journal
    execution/   running on Ray: session, tuner, capacity, GPU probe, preflight, callbacks, Ray internals
    cli.py, api.py, driver.py   the top: commands, the Python API, the story of one search

trainable/ never imports search/.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from search.api import load_best, restore, run

__all__ = ["load_best", "restore", "run"]

# The flat layout of release 0.1.0 -> where each module lives now. Tune pickles a run's searcher,
# scheduler, stopper and callbacks by module path (tuner.pkl, search_gen_state-*.json), so a run folder
# made by 0.1.0 unpickles `search.ordered.OrderedSearch` on --resume: these names stay importable for
# one release (they are the same module objects as the new paths). `search.outputs` is now a package:
# its __init__ answers the old module's names.
MOVED = {
    "schema": "definition.schema", "space": "definition.space", "overrides": "definition.overrides",
    "objectives": "definition.objectives",
    "storage": "store.storage", "run_folder": "store.run_folder", "results": "store.results", "retention": "store.retention",
    "searcher": "searching.searcher", "ordered": "searching.ordered", "halving": "searching.halving",
    "pbt": "searching.pbt", "budget": "searching.budget", "study": "searching.study",
    "warm_start": "searching.warm_start", "summary": "outputs.summary", "report": "outputs.report",
    "pareto": "outputs.pareto", "export": "outputs.export", "runs": "outputs.runs", "journal": "outputs.journal",
    "phases": "outputs.phases", "session": "execution.session", "local_ray": "execution.session",
    "tuner": "execution.tuner", "capacity": "execution.capacity", "gpu_probe": "execution.gpu_probe",
    "preflight": "execution.preflight", "progress": "execution.progress", "disk_guard": "execution.disk_guard",
    "mlflow_logger": "execution.mlflow_logger",
    # search/spec/, the package's name until search/definition/ (a folder named spec/ reads as tests), and its modules
    "spec": "definition", **{f"spec.{name}": f"definition.{name}" for name in (
        "enqueue", "objectives", "overrides", "ranking", "reserved", "schema", "space", "status", "user_code")},
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `search.<old>` as the module at its new path (one module object under both names)."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.partition("search.")[2] if fullname.startswith("search.") else None
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(f"search.{MOVED[spec.name.partition('.')[2]]}")

    def exec_module(self, module):
        pass  # already executed under its new name


# first: `search.spec.schema`'s parent is search/definition/, where the path finder would load schema.py a second
# time as a new module, and an editable install's finder or a leftover search/spec/__pycache__ answers `search.spec`
if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Moved())
