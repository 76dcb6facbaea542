"""References to user code (FILE.py:NAME, package.module:NAME): import, find and check the callable named.

A reference is resolved before anything expensive starts: the module imports, the name exists, is
callable and is defined where the reference says. Every failure is a ConfigError naming the key, with
the file and line where the user's code failed. Nothing here imports torch: the driver of a search of
a function trainable resolves the function and has no other use for torch (about 1.5 s of its start);
the model factories that need it are trainable/factories.py.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

from trainable.config import BUILTIN_MODELS, MODEL, REFERENCE
from trainable.errors import ConfigError, problem


def where_it_failed(error: BaseException, files: tuple[str, ...] = ()) -> str:
    """'file.py, line 12' of the deepest frame in the user's files (else the deepest frame)."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if f.filename in files] or [
        f for f in frames if "/site-packages/" not in f.filename and "/trainable/" not in f.filename] or frames
    return f"{mine[-1].filename}, line {mine[-1].lineno}" if mine else "unknown place"


def _import_file(path: Path, key: str, reference: str):
    if not path.is_file():
        raise ConfigError([problem(key, f"file {path} not found (a relative FILE.py is relative to the "
                                        "space file)", reference)])
    # one module per file path, registered so that pickling and a second resolve find it
    name = "hpsearch_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    # the file's folder first on the path, as `python FILE.py` has it: its `import data` finds data.py beside
    # it whatever folder the search (a trial, a replay) started in; every process that resolves it does this
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # no loader for the suffix: FILE.py a link to a file not named .py
        raise ConfigError([problem(key, f"cannot import {path}: its name must end in .py", reference)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # SystemExit: the search would end with its code, silently
        del sys.modules[name]
        raise ConfigError([problem(key, f"cannot import {path}: {what_happened(error)} "
                                        f"({where_it_failed(error, (str(path),))})", reference)]) from None
    return module


def what_happened(error: BaseException) -> str:
    """`ValueError: message`, or for SystemExit `the code called sys.exit(0)`."""
    if isinstance(error, SystemExit):
        return f"the code called sys.exit({error.code!r})"
    return f"{type(error).__name__}: {error}"


def _import_module(module_name: str, key: str, reference: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise ConfigError([problem(key, f"no module named {error.name!r} (is it installed, or on "
                                            "PYTHONPATH?)", reference)]) from None
        raise ConfigError([problem(key, f"cannot import {module_name}: {error} ({where_it_failed(error)})",
                                   reference)]) from None
    except (Exception, SystemExit) as error:
        raise ConfigError([problem(key, f"cannot import {module_name}: {what_happened(error)} "
                                        f"({where_it_failed(error)})", reference)]) from None


def resolve(reference: str, key: str) -> Callable[..., Any]:
    """The callable `reference` names; a built-in model name gives the built-in factory."""
    if reference in BUILTIN_MODELS and key.startswith(MODEL):
        from trainable.model import make_cnn, make_mlp  # torch: only where a built-in model is asked for

        builtin: dict[str, Callable[..., Any]] = {"mlp": make_mlp, "cnn": make_cnn}
        return builtin[reference]
    match = REFERENCE.fullmatch(reference)
    if match is None:
        raise ConfigError([problem(key, "must be a built-in name, FILE.py:NAME or package.module:NAME", reference)])
    module_part, name = match["module"], match["name"]
    is_file = module_part.endswith(".py")
    top = module_part.split(".")[0]
    if not is_file and top in sys.stdlib_module_names:  # refused before importing: some run code at import
        raise ConfigError([problem(key, f"must not name the standard library ({top}): a reference names a "
                                        "model factory or dataset function of yours or of an installed package",
                                   reference)])
    if is_file:
        try:
            path = Path(module_part).expanduser().resolve()
        except RuntimeError:  # ~user of a user without a home
            raise ConfigError([problem(key, "~user must name a user with a home folder", reference)]) from None
        module = _import_file(path, key, reference)
    else:
        module = _import_module(module_part, key, reference)
    found = getattr(module, name, None)
    if found is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError([problem(key, f"{module_part} defines no {name} (callables there: "
                                        f"{', '.join(defined[:12]) or 'none'})", reference)])
    if not callable(found):
        raise ConfigError([problem(key, f"{name} in {module_part} is not callable", reference)])
    return own_code(found, module, module_part, name, key, reference)


def own_code(found: Any, module: Any, module_part: str, name: str, key: str, reference: str) -> Callable[..., Any]:
    """`found` if it is a function or class defined in the module named (for a package.module, or
    in one of its submodules: torch.nn:Linear lives in torch.nn.modules.linear).

    A reference in best.yaml or spec.yaml is code that runs; this keeps it to code the user
    named, so `os:system` or an `eval` imported into a file cannot be reached through one.
    """
    if not (inspect.isfunction(found) or inspect.isclass(found)):
        raise ConfigError([problem(key, f"{name} in {module_part} must be a function or a class defined "
                                        f"there (it is a {type(found).__name__} object)", reference)])
    defined_in = getattr(found, "__module__", None) or "?"
    package = not module_part.endswith(".py")
    if defined_in == module.__name__ or (package and defined_in.startswith(module.__name__ + ".")):
        return found
    raise ConfigError([problem(key, f"{name} is not defined in {module_part} (it comes from {defined_in}); "
                                    f"name it where it is defined: {defined_in}:{found.__name__}", reference)])


def keyword_problems(function: Callable, keywords: Mapping[str, Any] | list[str], prefix: str,
                     reference: str, *, given: tuple[str, ...] = ()) -> list[str]:
    """Keywords `function` does not accept, and required parameters nobody gives."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []  # a builtin without a signature: the call itself will tell
    parameters = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    accepted = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    problems = [problem(f"{prefix}{k}", f"is not a keyword argument of {reference} (it takes: "
                                         f"{', '.join(a for a in accepted if a not in given) or 'none'})",
                        keywords[k] if isinstance(keywords, Mapping) else "searched")
                for k in keywords if k not in accepted or k in given]
    for n, p in parameters.items():
        if (p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and n not in keywords and n not in given):
            problems.append(problem(f"{prefix}{n}", f"is required by {reference} (no default); set it", None))
    return problems
