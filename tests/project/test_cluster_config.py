"""cluster.yaml: Ray accepts it, and its GPU workers can hold the trials spaces/mnist.yaml asks for.

`ray up` first runs `prepare_config` (fill in the AWS defaults, merge setup commands, check
the docker section, set per-type worker limits) and `validate_config` (Ray's JSON schema plus
its cross-field rules), then hands the config to the AWS provider. The provider steps
(`fillout_available_node_types_resources`, `bootstrap_config`) import boto3 and call AWS
(instance types, IAM, key pairs, subnets, security groups), so they are left out here: these
tests need no credentials and no network, and check everything up to the first AWS call.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from search.cli import apply_overrides, parse_args
from search.definition.schema import Resources
from search.definition.space import parse_space
from search.execution.capacity import trials_fit
from trainable.yaml_file import read_yaml_mapping

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "cluster.yaml"
SPACE = REPO / "spaces" / "mnist.yaml"
REMOTE_REPO = "/home/ray/hpsearch"


def load_cluster() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def prebuilt_image_text(text: str) -> str:
    """cluster.yaml as a user makes it for the prebuilt image: the commented docker.image line
    uncommented, the active one commented out (the header says: swap the two lines)."""
    active = re.compile(r"^(\s*)(image: rayproject/ray:\S+)", re.M)
    opt_in = re.compile(r"^(\s*)# (image: \S+)", re.M)
    assert len(active.findall(text)) == 1 and len(opt_in.findall(text)) == 1, "not one image line and one opt-in"
    return opt_in.sub(r"\1\2", active.sub(r"\1# \2", text))


def ray_up_checks(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does to the config before it calls AWS; raises on a bad config."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def prepared() -> dict[str, Any]:
    return ray_up_checks(load_cluster())


def gpu_worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: node for name, node in config["available_node_types"].items()
            if name != config["head_node_type"] and node["resources"].get("GPU", 0) >= 1}


def trials_per_node(node_resources: dict[str, float], cpus: float, gpus: float) -> int:
    """Trials of `cpus` CPU and `gpus` GPU that one node of these resources holds at once."""
    return trials_fit(node_resources, Resources(cpus=cpus, gpus=gpus))


def space_with(**resources: float):
    raw = read_yaml_mapping(SPACE)
    raw.setdefault("resources", {}).update(resources)
    return parse_space(raw, source=str(SPACE))


# --- Ray's own validation ---------------------------------------------------------------


def test_ray_up_accepts_the_config(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_default_image_is_public_and_the_prebuilt_one_is_a_commented_line():
    """As shipped, every node runs Ray's public image (no build step); the opt-in swaps one
    commented line for the Dockerfile's image, and Ray's checks pass on both."""
    text = CLUSTER_YAML.read_text()
    default, prebuilt = yaml.safe_load(text), yaml.safe_load(prebuilt_image_text(text))
    images = {key: value for key, value in default["docker"].items() if key.endswith("image")}
    assert images == {"image": f"rayproject/ray:{ray.__version__}-py311-gpu"}, "a node image anyone can pull"
    assert prebuilt["docker"]["image"].endswith(f"/hpsearch:{ray.__version__}-py311-gpu")
    for config in (default, prebuilt):
        ray_up_checks(config)


def test_pip_installs_the_torch_the_dockerfile_pins(prepared):
    """The default path installs the versions the prebuilt image bakes in (Dockerfile's ARGs)."""
    pins = dict(re.findall(r"^ARG (TORCH_VERSION|TORCHVISION_VERSION)=(\S+)", (REPO / "Dockerfile").read_text(), re.M))
    setup = " ".join(prepared["setup_commands"])
    assert f'"torch=={pins["TORCH_VERSION"]}"' in setup and f'"torchvision=={pins["TORCHVISION_VERSION"]}"' in setup


def test_pip_cache_is_on_the_nodes_disk(prepared):
    mounts = [o for o in prepared["docker"]["run_options"] if o.startswith("-v ")]
    host, container = mounts[0].split()[1].split(":")
    assert container == "/home/ray/.cache/pip", "pip in Ray's image (user ray) caches there"
    assert any(f"mkdir -p {host}" in c for c in prepared["initialization_commands"]), \
        "the host folder is made before docker mounts it as root's"


BROKEN = {
    # resources are whole numbers in Ray's schema; fractions belong to trials, not nodes
    "fractional node GPU": (lambda c: c["available_node_types"]["gpu"]["resources"].update(GPU=0.5),
                            jsonschema.ValidationError, "0.5"),
    "misspelt top-level key": (lambda c: c.update(setup_command=c.pop("setup_commands")),
                               jsonschema.ValidationError, "setup_command"),
    "head type not defined": (lambda c: c.update(head_node_type="ray.head.default"),
                              ValueError, "head_node_type"),
    "more min than max workers": (lambda c: c["available_node_types"]["gpu"].update(min_workers=5),
                                  ValueError, "min_workers"),
    "docker image without container": (lambda c: c["docker"].update(container_name=""),
                                       AssertionError, "container"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_ray_up_rejects_a_broken_copy(name):
    """The same checks fail on a config broken on purpose, so the test above can fail too."""
    breaks, error, message = BROKEN[name]
    config = load_cluster()
    breaks(config)
    with pytest.raises(error, match=message):
        ray_up_checks(config)


# --- node types -------------------------------------------------------------------------


def test_head_runs_the_driver_and_no_trials(prepared):
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    # CPU 0: not even a CPU-only trial is placed on the head; trials go to the workers
    assert trials_per_node(head["resources"], cpus=space_with().resources.cpus, gpus=0) == 0
    assert head["max_workers"] == 0


def test_gpu_workers_scale_from_zero(prepared):
    workers = gpu_worker_types(prepared)
    assert workers, "no worker type offers a whole GPU"
    for name, node in workers.items():
        assert node["min_workers"] == 0, f"{name}: idle clusters should cost only the head"
        assert node["max_workers"] >= 1, name
    assert prepared["max_workers"] >= 1


@pytest.mark.parametrize("gpus, cpus, packed", [(0, 1, 1), (1, 1, 1), (0.5, 1, 2), (0.25, 1, 4), (0.125, 0.5, 8)])
def test_gpu_worker_holds_the_trials_of_mnist_yaml(prepared, gpus, cpus, packed):
    """A worker holds at least one trial of spaces/mnist.yaml, and with a GPU fraction, as many
    as the fraction packs (its CPUs don't cap the packing at one trial per CPU, 1 by default)."""
    space = space_with(gpus=gpus, cpus=cpus)
    for name, node in gpu_worker_types(prepared).items():
        fits = trials_per_node(node["resources"], space.resources.cpus, space.resources.gpus)
        assert fits >= packed, (f"{name} ({node['resources']}) holds {fits} trial(s) of "
                                f"{space.resources.cpus:g} CPU + {space.resources.gpus:g} GPU")


def test_workers_can_write_checkpoints_to_s3(prepared):
    for name, node in gpu_worker_types(prepared).items():
        assert "IamInstanceProfile" in node["node_config"], f"{name}: no S3 credentials for trials"


# --- software on the nodes --------------------------------------------------------------


def test_every_node_gets_and_installs_the_project(prepared):
    # "." is where `ray up` runs: the repo root, as cluster.yaml's header says
    assert prepared["file_mounts"].get(REMOTE_REPO) == ".", "the repo is not copied to the nodes"
    # after prepare_config, setup_commands are merged into both lists
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert any(re.search(rf"pip install (-e )?{REMOTE_REPO}\b", c) for c in prepared[key]), key
    # the rsync honours .gitignore, which must keep the local venv (GBs of wheels) at home
    assert ".gitignore" in prepared["rsync_filter"]
    assert ".venv/" in (REPO / ".gitignore").read_text().split()


def test_head_can_launch_workers(prepared):
    assert any("boto3" in c for c in prepared["head_setup_commands"])


def test_image_runs_the_ray_we_test_with(prepared):
    image = prepared["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{ray.__version__}-"), (image, ray.__version__)
    assert image.endswith("-gpu") or re.search(r"-cu\d+$", image), image


# --- the commands the file documents ----------------------------------------------------


def documented_search_commands() -> list[str]:
    """`python -m search ...` commands in cluster.yaml's header and docs/cluster.md."""
    commands = []
    for path in (CLUSTER_YAML, REPO / "docs" / "cluster.md"):
        if not path.exists():
            continue
        text = path.read_text()
        text = re.sub(r"\\\n[#\s]*", " ", text)  # join continued lines (also inside # comments)
        commands += re.findall(r"python -m search ([^\"\n`]*--space[^\"\n`]*)", text)
    return commands


def test_documented_search_commands_are_valid():
    commands = documented_search_commands()
    assert commands, "no `python -m search --space ...` command found in cluster.yaml"
    for command in commands:
        args = parse_args(shlex.split(command.split("&&")[0].replace("BUCKET", "bucket")))
        space = parse_space(apply_overrides(read_yaml_mapping(REPO / args.space), args), source=args.space)
        assert space.experiment.storage_path.startswith(("s3://", "gs://")), command
        assert args.address == "auto", command
