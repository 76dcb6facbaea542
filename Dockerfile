# The prebuilt node image, cluster.yaml's opt-in: Ray's GPU image plus torch, torchvision and the
# project's other dependencies, so a worker the autoscaler adds starts trials once the image is
# pulled, without pip-installing 3-4 GB of CUDA wheels first. cluster.yaml's default needs no
# build: it runs Ray's image (this FROM) and pip-installs the same pins in setup_commands.
#
# Build it from the repo root (.dockerignore keeps .venv, runs, data and .git out) and push it to
# a registry the nodes can pull from, then swap cluster.yaml's two docker.image lines (the commented one names this image):
#
#   docker build -t REGISTRY/hpsearch:2.60.0-py311-gpu .
#   docker push REGISTRY/hpsearch:2.60.0-py311-gpu
#
# The tag repeats the base image's Ray and Python; tests/project/test_docker_image.py checks that this
# FROM line, cluster.yaml, pyproject.toml's ray requirement and the venv's Ray agree. Rebuild
# after changing pyproject.toml's dependencies; a code change alone needs no rebuild (below).
FROM rayproject/ray:2.60.0-py311-gpu

# The versions the project is tested with (pyproject.toml sets only floors). The wheels bring
# their own CUDA; the host needs an NVIDIA driver recent enough for it (cluster.yaml's AMI).
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

# Ray's image runs as user ray (uid 1000, group users), with its conda Python under
# /home/ray/anaconda3 on the PATH: pip installs there, and ray owns the project's folder.
WORKDIR /home/ray

# 1. torch and torchvision, alone in the largest layer, which a change to anything else keeps.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

# 2. The other dependencies, read from pyproject.toml alone, so a code change keeps this layer too.
#    The constraint keeps the image's Ray: pip never swaps the Ray the cluster was built for.
COPY --chown=ray:users pyproject.toml /tmp/hpsearch/pyproject.toml
RUN python -c "import tomllib; print(*tomllib.load(open('/tmp/hpsearch/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > /tmp/hpsearch/requirements.txt \
    && python -c "import ray; print(f'ray=={ray.__version__}')" > /tmp/hpsearch/constraints.txt \
    && pip install --no-cache-dir -r /tmp/hpsearch/requirements.txt -c /tmp/hpsearch/constraints.txt \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && rm -rf /tmp/hpsearch

# 3. The project, editable, at the path where cluster.yaml's file_mounts put the repo. On a node
#    that folder is a bind mount of the synced repo over this copy: imports then read the synced
#    code (pip's metadata lives in site-packages, not in the mounted folder), so a re-sync needs
#    no reinstall and no rebuild. Without the mount (docker run) the image runs the copy below.
COPY --chown=ray:users . /home/ray/hpsearch
RUN pip install --no-cache-dir --no-deps -e /home/ray/hpsearch \
    && python -c "import ray, torch, torchvision, optuna, search, trainable; print('ray', ray.__version__, 'torch', torch.__version__)"

WORKDIR /home/ray/hpsearch
