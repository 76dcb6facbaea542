"""The layout of search/ and trainable/, read from the source: layers that import one way, no cycles,
one home for "best", and a run folder made by release 0.1.0's flat layout resuming after the move."""

from __future__ import annotations

import ast
import os
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import TOY_FUNCTION, assert_outputs_agree

REPO = Path(__file__).resolve().parents[2]
# search/'s layers, lowest first: a module may import only its own layer and those before it
LAYERS = ["definition", "store", "searching", "outputs", "execution"]


def modules() -> dict[str, Path]:
    out = {}
    for package in ("search", "trainable"):
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imported(path: Path, name: str, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of search/ or trainable/, line) for every import in the file, at any depth (in a function too),
    except those under `if TYPE_CHECKING:`, which never run: a kind of trial names the Space it is asked about
    (search/definition/kind.py) while space.py asks the kind."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {target for target, _ in imported(path, name, known)} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of the graph once, as a path that comes back to its start (depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "search":
        return None
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def test_the_graph_finds_a_cycle_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_search_and_trainable_have_no_import_cycle():
    assert cycles(graph()) == []


def test_layers_import_only_downward_and_trainable_never_imports_search():
    wrong = []
    for name, targets in graph().items():
        for target in targets:
            if name.startswith("trainable") and target.startswith("search"):
                wrong.append(f"{name} -> {target}")
            elif layer(name) is not None and layer(target) is not None and layer(target) > layer(name):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_search_has_at_most_six_top_level_modules_and_each_layer_says_what_it_holds():
    top = sorted(p.name for p in (REPO / "search").glob("*.py"))
    assert len(top) <= 6, top
    packages = sorted(p.parent.name for p in (REPO / "search").glob("*/__init__.py"))
    assert packages == sorted(LAYERS)
    for package in packages:
        doc = ast.get_docstring(ast.parse((REPO / "search" / package / "__init__.py").read_text()))
        assert doc and "May import" in doc, package


def test_best_is_defined_once():
    pattern = re.compile(r"^\s*def (best_of|ranked|best_row)\(", re.M)
    found = [(p.relative_to(REPO), m.group(1)) for p in (REPO / "search").rglob("*.py")
             for m in pattern.finditer(p.read_text())]
    assert found == [(Path("search/definition/ranking.py"), "ranked")]


def test_search_run_stays_the_api_after_every_module_is_imported():
    """A subpackage is set as an attribute of its parent when imported: none may be named like the API."""
    import importlib
    import pkgutil

    import search
    from search.api import run

    for found in pkgutil.walk_packages(search.__path__, "search."):
        if not found.name.endswith("__main__"):  # that one runs the CLI
            importlib.import_module(found.name)
    assert search.run is run and search.load_best and search.restore


def test_the_driver_imports_neither_torchvision_nor_torchmetrics_until_the_canonical_loop_needs_them():
    """A function trainable's driver reads no built-in dataset and builds no metric: torchvision and torchmetrics
    (about 250 MB of its memory and 3 s of its imports) come in only where a canonical loop's driver needs them."""
    probe = ("import sys, search.driver, search.outputs.report, search.execution.preflight\n"
             "print(sorted(m for m in ('torchvision', 'torchmetrics') if m in sys.modules))\n"
             "from trainable.data import torchvision_class\n"
             "from trainable.measures import metric_class\n"
             "torchvision_class('mnist'), metric_class('MulticlassF1Score')\n"
             "print(sorted(m for m in ('torchvision', 'torchmetrics') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "['torchmetrics', 'torchvision']"], done.stdout


def test_old_module_paths_are_the_new_modules():
    """Tune unpickles a run's searcher, scheduler and callbacks by 0.1.0's module paths."""
    import importlib

    import search

    for old, new in search.MOVED.items():
        assert importlib.import_module(f"search.{old}") is importlib.import_module(f"search.{new}"), old
    from search.outputs import Outcome
    from search.outputs.finish import Outcome as moved

    assert Outcome is moved


def test_search_spec_is_search_definition_for_run_folders_pickled_before_the_rename():
    """search/spec/ is now search/definition/: every module of it answers to its old path too, as the same
    module, and an object pickled under the old path loads (a fresh interpreter: nothing imported yet)."""
    import search

    since = {"kind", "loop_kind", "function_kind"}  # written after the rename: no run folder names their old path
    defined = sorted(p.stem for p in (REPO / "search" / "definition").glob("*.py") if p.stem not in {"__init__", *since})
    assert [old for old in search.MOVED if old.startswith("spec.")] == [f"spec.{name}" for name in defined]
    from search.definition.objectives import Bound, Objectives

    old = pickle.dumps(Objectives(("loss",), ("min",), (Bound("params", "<=", 2.0),)), protocol=2)
    assert old.count(b"search.definition.objectives\n") == 2
    old = old.replace(b"search.definition.objectives\n", b"search.spec.objectives\n")
    probe = ("import pickle, sys\n"
             f"got = pickle.loads({old!r})\n"
             "import search.spec.objectives\n"
             "from search.spec.objectives import Objectives\n"
             "import search.definition, search.definition.objectives as new\n"
             "assert search.spec is search.definition and search.spec.objectives is new, sys.modules['search.spec']\n"
             "assert type(got) is Objectives is new.Objectives, type(got)\n"
             "print(got.measured, new.__file__)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["('loss',", "'params')", str(REPO / "search" / "definition" / "objectives.py")]


TOY = TOY_FUNCTION


@pytest.mark.slow
def test_a_run_folder_made_by_the_flat_layout_resumes_after_the_move(tmp_path):
    """Release 0.1.0's search/ (tests/fixtures/search-0.1.0.tar.xz, its flat modules) makes a run: its
    tuner.pkl names search.ordered, search.halving, search.budget, search.progress... Today's code resumes
    it with two more trials, through Tune's unpickling of those paths, and the outputs agree."""
    old = tmp_path / "old"
    with tarfile.open(REPO / "tests" / "fixtures" / "search-0.1.0.tar.xz") as archive:
        archive.extractall(old, filter="data")
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "old_layout_toy.py").write_text(TOY)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "trainable": "old_layout_toy:train",  # a module on PYTHONPATH: the same reference for both releases
        "experiment": {"name": "old", "metric": "score", "mode": "max", "num_samples": 2, "max_concurrent": 1,
                       "seed": 3, "scheduler": "asha", "grace_period": 1, "time_budget": 3600,
                       "storage_path": str(tmp_path / "runs")},
        "training": {"epochs": 3},
        "space": {"lr": {"distribution": "float", "low": 0.05, "high": 0.9, "log": True}}}))

    def search(pythonpath: list[Path], *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
        # run from tmp_path: the working directory comes first on sys.path, and the repo's search/ must not
        return subprocess.run([sys.executable, "-m", "search", "--space", str(space), "--name", "run", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    made = search([old, mods])
    assert made.returncode == 0, made.stderr[-3000:]
    run = tmp_path / "runs" / "run"
    pickled = (run / "tuner.pkl").read_bytes()
    assert b"search.ordered" in pickled and b"search.searching" not in pickled, "made by the flat layout"

    resumed = search([mods], "--resume", "--more-trials", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    # issue 49 item 8: the unpickled Progress held 0.1.0's Space (no resources.workers): a note per trial, and
    # the live journal and results parts stayed off for the whole resume
    assert "AttributeError" not in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    assert "not kept up to date" not in resumed.stderr
    import pandas as pd

    frame = pd.read_parquet(run / "results.parquet")
    assert sorted(frame["trial_number"].unique()) == [0, 1, 2, 3]
    assert_outputs_agree(run)


# The kind of trial (search/definition/kind.py) and its two implementations: the one place that tells them apart
KIND_MODULES = {"search/definition/kind.py", "search/definition/loop_kind.py", "search/definition/function_kind.py"}
KIND_CLASSES = {"FunctionConfig", "OwnFunction", "CanonicalLoop"}


def tells_kinds_apart(test: ast.AST) -> bool:
    """Whether an expression asks which kind of trial runs: a space's (or kind's) `trainable` or `reference`
    read, `is_function(...)`, a flag named `function` or `free_names`, `TRAINABLE_KEY in ...`, or an
    isinstance of a kind's class or config."""
    for n in ast.walk(test):
        if isinstance(n, ast.Attribute) and n.attr in ("trainable", "reference") and isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "is_function":
            return True
        if isinstance(n, ast.Name) and n.id in ("function", "free_names"):  # a flag that carries the kind
            return True
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops) and any(
                isinstance(side, ast.Name) and side.id == "TRAINABLE_KEY" for side in [n.left, *n.comparators]):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance" and \
                len(n.args) == 2 and any(isinstance(c, ast.Name) and c.id in KIND_CLASSES for c in ast.walk(n.args[1])):
            return True
    return False


def branches_on_the_kind(source: str) -> list[int]:
    """The lines of every if, conditional expression, while, assert, comprehension filter and and/or whose
    condition tells the kinds apart."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = list(node.ifs)
        elif isinstance(node, ast.BoolOp):
            tests = list(node.values)
        else:
            continue
        if any(tells_kinds_apart(t) for t in tests):
            lines.add(getattr(node, "lineno", None) or tests[0].lineno)
    return sorted(lines)


def test_the_counter_finds_each_way_of_branching_on_the_kind():
    source = ("if space.trainable:\n    pass\n"
              "x = a if is_function(config) else b\n"
              "y = [n for n in names if TRAINABLE_KEY not in n]\n"
              "z = kind.reference or isinstance(config, FunctionConfig)\n"
              "v = 1 if function else 2\n"
              "w = space.kind.trainable(space, given)\n")  # asking the kind: no branch
    assert branches_on_the_kind(source) == [1, 3, 4, 5, 6]


def test_code_asks_the_kind_of_trial_instead_of_branching_on_it():
    """Fewer than 10 branches on the kind of trial outside search/definition/kind.py and its two implementations
    (each left is said here: a function's data and code are its own, and python -m trainable reads a file)."""
    found = []
    for package in ("search", "trainable"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative not in KIND_MODULES:
                found += [f"{relative}:{line}" for line in branches_on_the_kind(path.read_text())]
    assert len(found) < 10, found
    # search/execution/preflight.py (a function imports now, loads no data), trainable/__main__.py (a best.yaml
    # of either kind), trainable/function.py (a Tune config of either kind): the three there are today
    assert {f.split(":")[0] for f in found} <= {"search/execution/preflight.py", "trainable/__main__.py",
                                                 "trainable/function.py"}, found


# What runs a whole search in a test: hpsearch's driver in-process, its Python API, a resume, the command
# (as a subprocess, directly or through a file's helper), or a driver script a cluster test starts
RUNS_A_SEARCH = re.compile(r"run_search\(|search\.run\(|resume_in_process\(|\"-m\", \"search\", \"--space\"|"
                           r"search_cli\(\"--space\"|run_search_cli\(|barrier_driver|tune_run")


def test_unit_tests_run_no_search_and_each_file_of_whole_searches_runs_one():
    """tests/units/<package>/ holds one package's units, tests/searches/ the whole searches (docs/testing.md)."""
    units = sorted((REPO / "tests" / "units").rglob("test_*.py"))
    searches = sorted((REPO / "tests" / "searches").glob("test_*.py"))
    assert len(units) > 20 and len(searches) > 20
    packages = {p.parent.name for p in units}
    assert packages <= {"definition", "searching", "store", "outputs", "execution", "trainable", "bench"}, packages
    assert [str(p) for p in units if RUNS_A_SEARCH.search(p.read_text())] == []
    assert [str(p) for p in searches if not RUNS_A_SEARCH.search(p.read_text())] == []
    assert not list((REPO / "tests").glob("test_*.py")), "each test file in one of the three folders"
