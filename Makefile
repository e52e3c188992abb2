# The workbench. `make lab` sets everything up and opens JupyterLab; `make test` runs the tests.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup lab demo test test-fast lint notebooks benchmarks clean chromium

$(STAMP): requirements.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=python3"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# JupyterLab refuses to start as root (usual in containers) without --allow-root
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter-lab $(LAB_FLAGS) notebooks/

demo: $(STAMP)
	$(PY) -m workbench demo --out build/demo

# The linter (ruff: pyflakes, pycodestyle, import order; pyproject.toml), then unit tests, doctests and every
# notebook (quick settings), in one pytest run.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	WORKBENCH_QUICK=1 $(PY) -m pytest -q --nbmake tests workbench notebooks

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser"

notebooks: $(STAMP)
	WORKBENCH_QUICK=1 $(PY) -m pytest -q --nbmake notebooks/

benchmarks: $(STAMP)
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

# Debian's Chromium, for static figure export (kaleido) and the browser test.
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends chromium)

clean:
	rm -rf $(VENV) build .pytest_cache
