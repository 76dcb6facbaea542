"""k8s/rayjob.yaml: KubeRay accepts it, and the cluster it makes runs spaces/mnist.yaml's search.

No Kubernetes here: the manifest is checked against KubeRay v1.2's RayJob schema (required
fields and types, written from its published CRD into k8s/rayjob.schema.json), and what hpsearch
needs of it is checked by reading it: the entrypoint is a valid search command, trials go to GPU
workers that autoscaling adds, every pod mounts the storage, the image has the venv's Ray.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from search.cli import apply_overrides, parse_args
from search.definition.space import parse_space
from trainable.yaml_file import read_yaml_mapping

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "k8s" / "rayjob.yaml"
SCHEMA = json.loads((REPO / "k8s" / "rayjob.schema.json").read_text())
IN_IMAGE = "/home/ray/hpsearch/"  # where the Dockerfile puts the repo


@pytest.fixture
def job() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def pods(job: dict) -> dict[str, dict]:
    cluster = job["spec"]["rayClusterSpec"]
    return {"head": cluster["headGroupSpec"]["template"]["spec"],
            **{g["groupName"]: g["template"]["spec"] for g in cluster.get("workerGroupSpecs", [])}}


def test_the_manifest_meets_kuberays_schema(job):
    jsonschema.validate(job, SCHEMA)


BROKEN = {
    "worker group without a name": lambda j: j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"),
    "replicas as text": lambda j: j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(maxReplicas="4"),
    "a GPU count that is no quantity": lambda j: pods(j)["gpu"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "one"}),
    "misspelt key": lambda j: j["spec"].update(shutdownAfterJobFinish=j["spec"].pop("shutdownAfterJobFinishes")),
    "no head": lambda j: j["spec"]["rayClusterSpec"].pop("headGroupSpec"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_the_schema_refuses_a_broken_copy(job, name):
    broken = copy.deepcopy(job)
    BROKEN[name](broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)


def test_the_entrypoint_is_a_valid_search_on_shared_storage(job):
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", "search"], words
    args = parse_args(words[3:])
    assert args.space.startswith(IN_IMAGE) and args.address == "auto"
    space_file = REPO / args.space.removeprefix(IN_IMAGE)
    space = parse_space(apply_overrides(read_yaml_mapping(space_file), args), source=str(space_file))
    mounts = {pod: {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
              for pod, spec in pods(job).items()}
    storage = space.experiment.storage_path
    assert storage.startswith("s3://") or all(storage in paths for paths in mounts.values()), \
        f"{storage}: not on every pod ({mounts})"


def test_trials_go_to_gpu_workers_that_autoscaling_adds(job):
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "a trial on the head"
    (group,) = cluster["workerGroupSpecs"]
    assert group["minReplicas"] == 0 < group["maxReplicas"], "idle clusters cost only the head"
    (container,) = group["template"]["spec"]["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == container["resources"]["requests"]["nvidia.com/gpu"]


def test_every_pod_runs_the_project_image_with_the_venvs_ray(job):
    images = {c["image"] for spec in pods(job).values() for c in spec["containers"]}
    assert len(images) == 1, images
    assert images.pop().endswith(f"/hpsearch:{ray.__version__}-py311-gpu")
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == ray.__version__
