# Setup, demo and tests. `make demo` and `make test` are the README's two quickstart commands.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Installed first when the virtual environment has no torch, so that the wide torch range in
# pyproject.toml never pulls a multi-GB CUDA build on a CPU machine. GPU users: install your own
# torch into $(VENV) before `make setup`, or set TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint docs bench gpu-check gpu-wheels clean

setup: $(VENV)/.installed

# The package alone: all the demo needs (the test extra, moto, wandb, boto3..., is for `make test`).
$(VENV)/.installed-base: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-base
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed-base
	$(BIN)/longctx demo

# Lint first: a style finding stops `make test` (CI's command) before the suite runs. The suite runs on
# TEST_WORKERS pytest-xdist workers (a 2-core CI machine: 2), one thread each, a file per worker at a
# time (--dist loadfile: the session's Ray cluster serves test_ray.py on one worker). TEST_WORKERS=0 runs
# it in this process.
TEST_WORKERS ?= 2
test: setup lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The project's style, configured in pyproject.toml ([tool.ruff], 110 columns): lint and formatting.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# docs/configuration.md from the config models (tests/docs/test_config_reference.py fails when it is stale).
docs: setup
	$(BIN)/python -m longctx.config_reference docs/configuration.md

bench: setup
	for b in tests/benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The CUDA paths on one GPU (tests/benchmarks/gpu_suite.py): a JSON report and a table, under 8 minutes.
gpu-check: setup
	$(BIN)/python tests/benchmarks/gpu_suite.py --out runs/gpu_suite.json

# Wheels for a GPU machine that has PyTorch but cannot install packages (pydantic and its needs, and
# this checkout's own wheel), checked for a complete dependency set; see docs/gpu-check.md.
gpu-wheels: setup
	$(BIN)/python tests/benchmarks/gpu_wheels.py download --dest .whl

clean:
	rm -rf runs .pytest_cache
