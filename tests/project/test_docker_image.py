"""Dockerfile and cluster.yaml: the node image has the Ray and Python the project is tested with.

A Ray cluster needs one Ray version and one Python (major.minor) on every node and on the
machine that drives it. The Dockerfile builds hpsearch's node image FROM Ray's image, cluster.yaml
runs it (and Ray's stock image in the pip fallback), and the tags name both versions. Every
expected value here is read from its source (the FROM line, cluster.yaml, pyproject.toml, the
venv) and compared, so a version bump in one place and not the others fails. No docker needed.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CLUSTER_YAML = REPO / "cluster.yaml"
PYPROJECT = REPO / "pyproject.toml"

# rayproject/ray:2.60.0-py311-gpu, rayproject/ray:2.60.0-py311-cu128, REGISTRY/hpsearch:2.60.0-py311-gpu
TAG = re.compile(r"(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3)(?P<minor>\d+)-(?P<accel>gpu|cu\d+)")


# --- parsing ------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"[ \t]*\\[ \t]*\n[ \t]*", " ", "\n".join(lines))
    return [(m[1].upper(), m[2].strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.M)]


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG defaults: ARG NAME=value."""
    args = {}
    for instruction, rest in dockerfile_instructions(text):
        if instruction == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip().strip("\"'")
    return args


def base_image(text: str) -> str:
    """The image the final stage builds FROM, with ARG defaults substituted."""
    froms = [rest for instruction, rest in dockerfile_instructions(text) if instruction == "FROM"]
    assert froms, "the Dockerfile has no FROM"
    image = next(token for token in froms[-1].split() if not token.startswith("--"))
    return re.sub(r"\$\{?(\w+)\}?", lambda m: dockerfile_args(text)[m[1]], image)


def image_tag(image: str) -> str:
    """The tag of NAME:TAG (a registry's host:port before the last / is not a tag)."""
    name = image.rsplit("/", 1)[-1]
    assert ":" in name, f"{image}: no tag; the tag names the Ray and Python versions"
    return name.rsplit(":", 1)[1]


def versions(image: str) -> dict[str, str]:
    """Ray version, Python version and accelerator that an image's tag names."""
    m = TAG.fullmatch(image_tag(image))
    assert m, f"{image}: tag is not RAY-pyXY-gpu (or -cuNNN)"
    return {"ray": m["ray"], "python": f"{m['py']}.{m['minor']}", "accel": m["accel"]}


def load_cluster() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def requirement(name: str) -> Requirement:
    reqs = [Requirement(r) for r in project()["dependencies"]]
    found = [r for r in reqs if r.name == name]
    assert found, f"pyproject.toml does not depend on {name}"
    return found[0]


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def docker() -> dict[str, Any]:
    return load_cluster()["docker"]


def node_images(docker: dict[str, Any]) -> dict[str, str]:
    """The image each kind of node runs: head_image / worker_image override image."""
    return {kind: docker.get(f"{kind}_image", docker["image"]) for kind in ("head", "worker")}


def prebuilt_image() -> str:
    """The image of cluster.yaml's commented opt-in line (`# image: REGISTRY/hpsearch:TAG`)."""
    found = re.findall(r"^\s*# image: (\S+)", CLUSTER_YAML.read_text(), re.M)
    assert len(found) == 1, found
    return found[0]


# --- the parsing itself -------------------------------------------------------------------


def test_parsers_read_what_they_should():
    text = "ARG BASE=rayproject/ray:2.1.0-py310-cu121\n# FROM nope:1\nFROM --platform=linux/amd64 ${BASE} AS build\n" \
           "RUN a \\\n    b\nFROM $BASE\n"
    assert base_image(text) == "rayproject/ray:2.1.0-py310-cu121"
    assert ("RUN", "a b") in dockerfile_instructions(text)
    assert versions("localhost:5000/team/hpsearch:2.60.0-py311-gpu") == {"ray": "2.60.0", "python": "3.11", "accel": "gpu"}
    assert versions(base_image(text)) == {"ray": "2.1.0", "python": "3.10", "accel": "cu121"}
    with pytest.raises(AssertionError):
        versions("localhost:5000/hpsearch")  # no tag: the port is not one
    with pytest.raises(AssertionError):
        versions("rayproject/ray:latest-gpu")


# --- the Dockerfile's base: Ray's GPU image of the venv's Ray and Python ------------------


def test_base_is_rays_gpu_image(dockerfile):
    image = base_image(dockerfile)
    assert image.startswith("rayproject/ray:"), image
    versions(image)  # a tag that names both versions, and a GPU (CUDA) build


def test_base_ray_is_the_venvs_and_meets_pyproject(dockerfile):
    ray_version = versions(base_image(dockerfile))["ray"]
    assert ray_version == ray.__version__, (base_image(dockerfile), ray.__version__)
    spec = requirement("ray").specifier
    assert spec.contains(ray_version), f"pyproject.toml wants ray{spec}; the image has {ray_version}"
    assert {"default", "tune"} <= requirement("ray").extras  # the image's Ray must bring both


def test_base_python_is_the_venvs_and_meets_pyproject(dockerfile):
    """Ray needs the same Python major.minor on the nodes and where the venv's Ray drives them."""
    python = versions(base_image(dockerfile))["python"]
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}", (python, sys.version)
    assert SpecifierSet(project()["requires-python"]).contains(python + ".0"), python


@pytest.mark.parametrize("package, arg", [("torch", "TORCH_VERSION"), ("torchvision", "TORCHVISION_VERSION")])
def test_image_pins_the_torch_the_venv_tests_with(dockerfile, package, arg):
    pinned = dockerfile_args(dockerfile)[arg]
    assert f'"{package}==${{{arg}}}"' in dockerfile, f"the Dockerfile does not install {package}=={arg}"
    venv = Version(importlib.metadata.version(package)).public  # 2.14.1, not 2.14.1+cu130
    assert pinned == venv, f"Dockerfile pins {package}=={pinned}; the venv tests with {venv}"
    assert requirement(package).specifier.contains(pinned), (package, pinned)


# --- cluster.yaml runs images of the same versions ----------------------------------------


def test_cluster_default_image_is_the_dockerfiles_base(docker, dockerfile):
    assert node_images(docker) == {"head": base_image(dockerfile), "worker": base_image(dockerfile)}


def test_cluster_opt_in_is_the_project_image():
    name = prebuilt_image().rsplit(":", 1)[0].rsplit("/", 1)[-1]
    assert name == "hpsearch", prebuilt_image()


def test_every_image_has_the_same_ray_and_python(docker, dockerfile):
    expected = versions(base_image(dockerfile))
    for kind, image in {**node_images(docker), "prebuilt": prebuilt_image()}.items():
        assert versions(image) == expected, (kind, image, base_image(dockerfile))


def test_documented_build_commands_tag_the_same_versions(dockerfile):
    """`docker build -t ...:TAG .` in the Dockerfile, cluster.yaml and README name FROM's versions."""
    expected = versions(base_image(dockerfile))
    found = 0
    for path in (DOCKERFILE, CLUSTER_YAML, REPO / "README.md"):
        for image in re.findall(r"docker build -t (\S+) \.", path.read_text()):
            found += 1
            assert versions(image) == expected, (path.name, image)
    assert found >= 3, "each of Dockerfile, cluster.yaml and README should show the build command"


# --- the project inside the image is the one file_mounts syncs ----------------------------


def test_image_installs_the_project_where_file_mounts_put_it(dockerfile):
    config = load_cluster()
    mounts = [remote for remote, local in config["file_mounts"].items() if local in (".", "./")]
    assert len(mounts) == 1, config["file_mounts"]
    remote = mounts[0]
    runs = [rest for instruction, rest in dockerfile_instructions(dockerfile) if instruction == "RUN"]
    copies = [rest for instruction, rest in dockerfile_instructions(dockerfile) if instruction == "COPY"]
    # editable at the mount path: on a node the synced repo is mounted over it and imports read it
    assert any(re.search(rf"pip install\b.*-e {re.escape(remote)}(\s|$)", r) for r in runs), runs
    assert any(re.search(rf"\s\.\s+{re.escape(remote)}/?$", c) for c in copies), copies
    # and setup_commands re-point it at the synced repo (seconds: the dependencies are there)
    assert any(re.search(rf"pip install (-e )?{re.escape(remote)}\b", c) for c in config["setup_commands"])


def test_dockerignore_keeps_the_venv_data_and_history_out():
    patterns = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")}
    for path in (".venv", "runs", "data", ".git", "**/__pycache__", ".pytest_cache", "*.egg-info"):
        assert path in patterns, f".dockerignore does not exclude {path}"
