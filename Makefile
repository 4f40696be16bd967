# Two entry points for a newcomer: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-8)
MODEL ?= candy
BUDGET ?= 10m

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip==25.3
	# torch first, pinned: the CPU wheel (an unpinned torch pulls GBs of CUDA packages)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/tensorplan optimize $(MODEL) -o reports/$(MODEL) --budget $(BUDGET)

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# every benchmark behind docs/results.md (hours); BENCH_ARGS="--only korch" or "--list"
bench: setup
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .tensorplan-cache
