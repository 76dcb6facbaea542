"""Model factories: built-ins, a user's FILE.py:NAME and package.module:NAME, checked before anything trains.

Every failure is a ConfigError naming the key (model.factory or model.<key>) and, for a user's
file, the file and line where it failed. No data is loaded here: a zero batch stands in for it.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from trainable.config import TrialConfig
from trainable.errors import ConfigError
from trainable.config import absolute_reference
from trainable.factories import build_model, check_model
from trainable.references import resolve
from trainable.model import make_cnn, make_mlp

BATCH = torch.zeros(2, 1, 28, 28)  # what MNIST gives a model

MODELS_PY = '''
import math

import torch
from torch import nn


def net(input_shape, num_classes, width=8):
    """Gets the data's shape and classes because it names them."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def three_classes(width=8):
    """Always 3 logits, whatever the data has."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 3))


def needs_depth(depth, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))


def not_a_module():
    return "a string"


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)  # line 33: a (2, 784) input does not fit


def flexible(**settings):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


from os import system  # imported names are not the file's own: a reference to one is refused
from shutil import rmtree
from torch.nn import Linear
instance = Broken  # an alias of the file's own class is fine
called = nn.Flatten()  # an object, not a function or class


class Exits(nn.Module):
    def forward(self, x):
        import sys
        sys.exit(0)
'''


@pytest.fixture
def models(tmp_path):
    """A model file the test wrote: FILE.py references to its callables."""
    path = tmp_path / "models.py"
    path.write_text(textwrap.dedent(MODELS_PY))
    return lambda name: f"{path}:{name}"


def check_problems(model: str, model_args=None, searched=(), num_classes: int = 10, batch=BATCH) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        check_model(TrialConfig(model=model, model_args=model_args or {}), batch, num_classes, searched)
    return caught.value.problems


# --- built-ins ----------------------------------------------------------------------------------

def test_builtin_factories_take_the_data_shape_and_their_settings():
    mlp = build_model(TrialConfig(model_args={"hidden_sizes": [64, 32]}), (3, 8, 8), 5)
    assert [m.out_features for m in mlp if isinstance(m, nn.Linear)] == [64, 32, 5]
    assert mlp[1].in_features == 3 * 8 * 8
    cnn = build_model(TrialConfig(model="cnn", model_args={"channels": [4, 8], "hidden": 16}), (3, 32, 32), 7)
    assert [m.out_channels for m in cnn if isinstance(m, nn.Conv2d)] == [4, 8]
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    # the defaults: the template 784-128-10 MLP and pytorch/examples' MNIST CNN
    assert [m.out_features for m in make_mlp() if isinstance(m, nn.Linear)] == [128, 10]
    assert [m.out_channels for m in make_cnn() if isinstance(m, nn.Conv2d)] == [32, 64]
    assert resolve("mlp", "model.factory") is make_mlp and resolve("cnn", "model.factory") is make_cnn


def test_builtin_models_pass_the_check():
    check_model(TrialConfig(), BATCH, 10)
    check_model(TrialConfig(model="cnn", model_args={"channels": [4], "hidden": 8}), BATCH, 10, ("dropout",))


@pytest.mark.parametrize("hidden_sizes", [[], [64, 0], [64, 12.5], "128"])
def test_bad_mlp_widths_are_a_config_error(hidden_sizes):
    (message,) = check_problems("mlp", {"hidden_sizes": hidden_sizes})
    assert message.startswith("model.factory: building the model or running it on a batch of (2, 1, 28, 28) "
                              "failed: ValueError: hidden_sizes must be a non-empty list of integers")


def test_cnn_too_deep_for_its_input_is_a_config_error():
    (message,) = check_problems("cnn", {"channels": [4] * 14})
    assert "ValueError: 14 conv layers leave nothing of a (1, 28, 28) input" in message


def test_an_unknown_keyword_of_a_builtin_names_it_and_what_it_takes():
    assert check_problems("mlp", {"widths": [64]}) == [
        "model.widths: is not a keyword argument of mlp (it takes: hidden_sizes), got [64]"]
    # the data's shape and classes are not the config's to set
    assert check_problems("mlp", {"num_classes": 3}) == [
        "model.num_classes: is not a keyword argument of mlp (it takes: hidden_sizes), got 3"]


# --- a user's file --------------------------------------------------------------------------------

def test_a_user_factory_gets_the_data_shape_classes_and_its_keywords(models):
    config = TrialConfig(model=models("net"), model_args={"width": 5})
    check_model(config, torch.zeros(3, 4), 3)
    model = build_model(config, (4,), 3)
    assert model[1].in_features == 4 and model[1].out_features == 5 and model[3].out_features == 3
    # resolved once per file: a second resolve (and pickling by Ray) finds the same function
    assert resolve(models("net"), "model.factory") is resolve(models("net"), "model.factory")


def test_an_unknown_keyword_of_a_user_factory_names_model_key(models):
    (message,) = check_problems(models("net"), {"depth": 3})
    assert message == f"model.depth: is not a keyword argument of {models('net')} (it takes: width), got 3"


def test_an_unknown_searched_keyword_is_named_too(models):
    (message,) = check_problems(models("net"), searched=("dropout",))
    assert message.startswith("model.dropout: is not a keyword argument of")


def test_a_required_parameter_nobody_gives_is_named(models):
    (message,) = check_problems(models("needs_depth"))
    assert message.startswith(f"model.depth: is required by {models('needs_depth')} (no default); set it")
    check_model(TrialConfig(model=models("needs_depth"), model_args={"depth": 2}), BATCH, 10)


def test_a_factory_taking_any_keywords_accepts_them(models):
    check_model(TrialConfig(model=models("flexible"), model_args={"anything": 1}), BATCH, 10)


def test_logits_of_the_wrong_shape_are_reported(models):
    (message,) = check_problems(models("three_classes"))
    assert message == ("model.factory: the model must return logits of shape (2, 10) for a batch of "
                       "(2, 1, 28, 28) (10 classes in the data), got (2, 3)")


def test_a_factory_that_returns_no_module_is_reported(models):
    assert check_problems(models("not_a_module")) == ["model.factory: must return a torch.nn.Module, got 'str'"]


def test_a_model_that_fails_on_a_batch_names_the_file_and_line(models, tmp_path):
    (message,) = check_problems(models("Broken"))
    assert message.startswith("model.factory: building the model or running it on a batch of (2, 1, 28, 28) "
                              "failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert f"({tmp_path / 'models.py'}, line 33)" in message


def test_a_file_that_raises_at_import_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import torch\n\n1 / 0\n")
    (message,) = check_problems(f"{path}:Net")
    assert message == (f"model.factory: cannot import {path}: ZeroDivisionError: division by zero "
                       f"({path}, line 3), got '{path}:Net'")
    # and a syntax error, too
    syntax = tmp_path / "syntax.py"
    syntax.write_text("import torch\ndef net(:\n    pass\n")
    (message,) = check_problems(f"{syntax}:net")
    assert f"cannot import {syntax}: SyntaxError" in message and f"({syntax}, line 2)" in message


def test_a_file_reference_linked_to_a_file_not_named_py_is_a_config_error(tmp_path):
    # Python imports the link's target, whose name has no .py: there is no loader for it
    target = tmp_path / "net.txt"
    target.write_text("import torch\n\ndef net(**kwargs):\n    return torch.nn.LazyLinear(10)\n")
    (tmp_path / "net.py").symlink_to(target)
    (message,) = check_problems(f"{tmp_path / 'net.py'}:net")
    assert message.startswith(f"model.factory: cannot import {target}: its name must end in .py")


def test_a_missing_file_or_name_is_a_config_error(models, tmp_path):
    (message,) = check_problems(f"{tmp_path / 'nope.py'}:Net")
    assert message.startswith(f"model.factory: file {tmp_path / 'nope.py'} not found")
    (message,) = check_problems(models("Missing"))
    assert message.startswith("model.factory: ") and "defines no Missing" in message
    assert "net" in message and "three_classes" in message  # what it does define


# --- package.module:NAME --------------------------------------------------------------------------

def test_a_module_reference_resolves_like_a_file():
    assert resolve("trainable.model:make_cnn", "model.factory") is make_cnn
    check_model(TrialConfig(model="trainable.model:make_mlp", model_args={"hidden_sizes": [8]}), BATCH, 10)


@pytest.mark.parametrize("reference, expected", [
    ("no_such_package.models:Net", "no module named 'no_such_package' (is it installed, or on PYTHONPATH?)"),
    ("trainable.no_such_module:Net", "no module named 'trainable.no_such_module'"),
    ("trainable.model:NoSuchNet", "trainable.model defines no NoSuchNet (callables there:"),
    ("trainable.model:MAX_WIDTH", "MAX_WIDTH in trainable.model is not callable"),
])
def test_a_module_reference_that_does_not_exist_is_a_config_error(reference, expected):
    (message,) = check_problems(reference)
    assert message.startswith(f"model.factory: {expected}")
    assert message.endswith(f"got '{reference}'")


def test_absolute_reference_anchors_files_and_leaves_modules(tmp_path):
    assert absolute_reference("models/net.py:Net", tmp_path) == f"{tmp_path.resolve() / 'models' / 'net.py'}:Net"
    assert absolute_reference("pkg.models:Net", tmp_path) == "pkg.models:Net"
    assert absolute_reference("mlp", tmp_path) == "mlp"


# --- a reference is code: what it may name ----------------------------------------------------------

@pytest.mark.parametrize("reference, expected", [
    ("os:system", "must not name the standard library (os)"),
    ("builtins:eval", "must not name the standard library (builtins)"),
    ("subprocess:run", "must not name the standard library (subprocess)"),
    ("shutil:rmtree", "must not name the standard library (shutil)"),
    ("os.path:join", "must not name the standard library (os)"),
    ("sys:exit", "must not name the standard library (sys)"),
])
def test_references_into_the_standard_library_are_refused_before_anything_runs(reference, expected):
    with pytest.raises(ConfigError) as caught:
        resolve(reference, "model.factory")
    (message,) = caught.value.problems
    assert message.startswith(f"model.factory: {expected}") and message.endswith(f"got '{reference}'")


def test_a_file_reference_must_name_a_function_or_class_the_file_defines(models):
    assert resolve(models("instance"), "model.factory").__name__ == "Broken"
    (message,) = check_problems(models("system"))
    assert "system in " in message and "must be a function or a class defined there" in message
    (message,) = check_problems(models("rmtree"))
    assert "rmtree is not defined in " in message and "name it where it is defined: shutil:rmtree" in message
    (message,) = check_problems(models("Linear"))
    assert "Linear is not defined in" in message and "torch.nn.modules.linear:Linear" in message
    (message,) = check_problems(models("called"))
    assert "must be a function or a class" in message and "Flatten" in message


def test_a_package_reference_may_name_what_the_package_defines_in_its_modules():
    # torch.nn re-exports Linear from torch.nn.modules.linear: still code of the package named
    assert resolve("torch.nn:Linear", "model.factory") is nn.Linear
    # but not what a module imported from elsewhere (torch.Tensor, imported by torch.nn.functional)
    with pytest.raises(ConfigError, match="Tensor is not defined in torch.nn.functional"):
        resolve("torch.nn.functional:Tensor", "model.factory")


def test_a_model_that_calls_sys_exit_is_a_config_error_not_a_silent_exit(models, tmp_path):
    (message,) = check_problems(models("Exits"))
    assert message.startswith("model.factory: building the model or running it on a batch of (2, 1, 28, 28) "
                              "failed: the code called sys.exit(0)")
    exits_at_import = tmp_path / "exits.py"
    exits_at_import.write_text("import sys\nsys.exit(3)\n")
    (message,) = check_problems(f"{exits_at_import}:Net")
    assert message.startswith(f"model.factory: cannot import {exits_at_import}: the code called sys.exit(3)")
