# Setup, demo and tests. `make demo` and `make test` are the README's two quickstart commands.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Installed first when the virtual environment has no torch, so that the wide torch range in
# pyproject.toml never pulls a multi-GB CUDA build on a CPU machine. GPU users: install your own
# torch into $(VENV) before `make setup`, or set TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: setup
	$(BIN)/longctx demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	for b in tests/benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf runs .pytest_cache
