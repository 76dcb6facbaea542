"""References to user code (FILE.py:NAME, package.module:NAME) and the built-ins beside them.

A reference is resolved and checked before anything expensive starts: the module
imports, the name exists and is callable, its signature takes the keyword arguments the
config gives, and (for models) one call on a tiny batch returns logits of the right shape.
Every failure is a ConfigError naming the key, with the file and line where the user's
code failed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from trainable.config import FACTORY_KEY, MODEL, REFERENCE, REGRESSION_LOSSES, TrialConfig, is_reference
from trainable.errors import ConfigError, problem
from trainable.model import WIDTHS, make_cnn, make_mlp, width_rule

BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": make_mlp, "cnn": make_cnn}
# keyword arguments a model factory gets from the data when its signature names them
DATA_ARGUMENTS = ("input_shape", "num_classes")


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
        return BUILTIN_MODELS[reference]
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


def model_keywords(function: Callable, config: TrialConfig, input_shape: tuple[int, ...],
                   num_classes: int) -> dict[str, Any]:
    """The factory's keyword arguments: the config's model.<key> plus the data's shape and classes."""
    names: Mapping[str, inspect.Parameter]
    try:
        names = inspect.signature(function).parameters
    except (TypeError, ValueError):
        names = {}
    data = {"input_shape": tuple(input_shape), "num_classes": num_classes}
    return {**{k: v for k, v in data.items() if k in names}, **config.model_args}


def build_model(config: TrialConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Call the factory of `config` (weights drawn from torch's global RNG, seeded by the caller)."""
    function = resolve(config.model, FACTORY_KEY)
    model = function(**model_keywords(function, config, input_shape, num_classes))
    if not isinstance(model, nn.Module):
        raise ConfigError([problem(FACTORY_KEY, "must return a torch.nn.Module",
                                   type(model).__name__)])
    return model


def width_problems(reference: str, keyword: str | None, values: Sequence[Any], path: str) -> list[str]:
    """Each value of a choice of a built-in model's width that the model would refuse: check_model
    builds the model with one value of each choice, so this says the others at once."""
    if reference not in WIDTHS or keyword not in WIDTHS[reference]:
        return []
    return [problem(f"{path}.values[{i}]", rule, value) for i, value in enumerate(values)
            if (rule := width_rule(keyword, value))]


def check_model(config: TrialConfig, sample: torch.Tensor, num_classes: int,
                searched: tuple[str, ...] = ()) -> None:
    """Resolve, check the signature, build once and run a tiny batch: logits must be (n, num_classes).

    `searched` are model keywords the search will set (their names are checked here; the
    config holds one of their values). Raises ConfigError naming the key.
    """
    key = FACTORY_KEY
    factory = resolve(config.model, key)
    given = tuple(n for n in DATA_ARGUMENTS if n in _parameter_names(factory))
    problems = keyword_problems(factory, {**config.model_args, **{k: "(searched in space)" for k in searched}},
                                f"{MODEL}.", config.model, given=given)
    if problems:
        raise ConfigError(problems)
    try:
        model = build_model(config, tuple(sample.shape[1:]), num_classes)
        model.eval()
        with torch.inference_mode():
            logits = model(sample)
    except ConfigError:
        raise
    except (Exception, SystemExit) as error:
        raise ConfigError([problem(key, f"building the model or running it on a batch of {tuple(sample.shape)} "
                                        f"failed: {what_happened(error)} ({where_it_failed(error)})",
                                   config.model)]) from None
    n = len(sample)
    got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if config.loss in REGRESSION_LOSSES:  # float targets (n,) take (n, 1) or (n,); (n, k) take (n, k)
        allowed = [(n, num_classes)] + ([(n,)] if num_classes == 1 else [])
        if got not in allowed:
            raise ConfigError([problem(key, f"the model must return outputs of shape {' or '.join(map(str, allowed))} "
                                            f"for a batch of {tuple(sample.shape)} ({num_classes} target column(s) "
                                            f"for training.loss {config.loss})", got)])
    elif is_reference(config.loss):  # a loss of the user's: the shape is between the model and it
        if not isinstance(logits, torch.Tensor) or logits.dim() == 0 or len(logits) != n:
            raise ConfigError([problem(key, f"the model must return a tensor of {n} rows for a batch of "
                                            f"{tuple(sample.shape)}", got)])
    elif got != (n, num_classes):
        raise ConfigError([problem(key, f"the model must return logits of shape {(n, num_classes)} for a batch of "
                                        f"{tuple(sample.shape)} ({num_classes} classes in the data)", got)])


def _parameter_names(function: Callable) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()
