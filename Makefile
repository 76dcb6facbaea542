# The two commands: `make run` (the search) and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Where datasets live; trainable/search read the same variable.
export HPSEARCH_DATA ?= $(HOME)/.cache/hpsearch
# Offline copies of MNIST's four raw files, used when present (see docs/your-model-and-data.md).
MNIST_RAW ?= ../shared/data/MNIST/raw

.PHONY: run test lint install browser data bench gpu-check clean

# Which PyTorch build .venv gets when it is made (an existing .venv keeps its build: `make clean`
# first to change it). TORCH=cpu: PyTorch's CPU-only wheels from PyTorch's own index (no CUDA
# libraries, which are over half of the ~6.5 GB venv). TORCH=cuda: pip's default wheel from PyPI,
# the CUDA build on Linux x86_64. TORCH=auto, the default: cpu on a machine with no NVIDIA GPU (no
# nvidia-smi, no /dev/nvidia*, no /proc/driver/nvidia) when PyTorch's CPU index answers, else cuda,
# said aloud. See docs/testing.md.
TORCH ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# The search needs the project; the tests add its test extra (pytest, mlflow-skinny, onnx, ...).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@torch="$(TORCH)"; \
	case "$$torch" in auto|cpu|cuda) ;; *) echo "TORCH must be auto, cpu or cuda, got '$$torch'"; exit 2;; esac; \
	if [ "$$torch" = auto ]; then \
	  if command -v nvidia-smi >/dev/null 2>&1 || ls /dev/nvidia[0-9]* >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; then torch=cuda; \
	  elif $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then torch=cpu; \
	  else torch=cuda; echo "No NVIDIA GPU here, but PyTorch's CPU index ($(TORCH_CPU_INDEX)) does not answer:" \
	    "installing pip's default torch (on Linux x86_64 the CUDA build, about 6.5 GB in .venv)."; fi; fi; \
	if [ "$$torch" = cpu ]; then echo "Installing PyTorch's CPU-only build from $(TORCH_CPU_INDEX) (TORCH=cuda for the CUDA build)."; \
	  $(PY) -m pip install --quiet --index-url $(TORCH_CPU_INDEX) torch torchvision; fi
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# Copy the raw files into the data root if they are at hand and not there yet;
# torchvision checks their md5 and unpacks them, so no network is needed.
data:
	@if [ -d "$(MNIST_RAW)" ] && [ ! -e "$(HPSEARCH_DATA)/MNIST/raw/train-images-idx3-ubyte.gz" ] \
	    && [ ! -e "$(HPSEARCH_DATA)/MNIST/raw/train-images-idx3-ubyte" ]; then \
	  mkdir -p "$(HPSEARCH_DATA)/MNIST/raw" && cp "$(MNIST_RAW)"/*.gz "$(HPSEARCH_DATA)/MNIST/raw/"; \
	  echo "copied MNIST raw files from $(MNIST_RAW) to $(HPSEARCH_DATA)/MNIST/raw"; fi

run: install data
	$(PY) -m search --space spaces/mnist.yaml

# report.html is tested in headless Chromium (Debian's package); installed here when missing and
# this user may (root, as in CI). Without it the browser test says so and fails.
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null) || \
	  echo "could not install chromium (apt-get); the report's browser test will fail"

# Two test files at a time (pytest-xdist, whole files per worker so module fixtures are made
# once): most of a test's time is Ray and processes starting, so two cores overlap it. The 20 slowest
# tests are printed at the end (docs/testing.md keeps them), so where the time goes shows in every run.
# --no-loadscope-reorder: xdist 3 hands out the files with the most tests first, which put the longest
# files (test_chaos.py: 2 tests, 5 minutes) last, on one worker alone; tests/conftest.py orders them.
# compileall: the project's bytecode, written once. Where PYTHONDONTWRITEBYTECODE is set (these machines set it)
# every process compiles the modules it imports from source: about 0.2 CPU-s of each `python -m search` the
# tests run (docs/testing.md). A changed file is compiled again in memory, as without it.
test: $(VENV)/.installed-test browser lint
	$(PY) -m compileall -q search trainable tests > /dev/null
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=20

# ruff's checks and mypy's ([tool.ruff], [tool.mypy] in pyproject.toml): about 2 minutes, mostly mypy
lint: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: install data
	$(PY) bench/epoch.py
	$(PY) bench/search.py

clean:
	rm -rf $(VENV) runs .pytest_cache

# On a machine with a GPU: steady trials per minute at 1, 2, 4, 8 trials per GPU and auto (under 8 minutes on an H200).
gpu-check: install data
	$(PY) bench/gpu_check.py
