# `make test` works on a fresh machine: it creates .venv when missing and installs the project.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv test test-all demo lint format docs docs-build gallery bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	# ultralytics, a test and benchmark oracle only, pins opencv-python, which would replace
	# the headless OpenCV of the dev extra: installed without its requirements, then the ones
	# its loss and assigner modules import.
	$(PY) -m pip install --quiet --no-deps "ultralytics==8.4.190"
	$(PY) -m pip install --quiet pyyaml requests psutil polars ultralytics-thop
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

docs-build: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# pytest-xdist: one worker per core. The suite builds the docs site (mkdocs build --strict) once.
PYTEST_WORKERS ?= auto

# The contributor's command (under 10 minutes on 2 cores): every package's tests but those
# marked slow; docs pages that train a model run with their quick settings.
test: lint $(STAMP)
	VISIONBLOCKS_QUICK=1 $(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow"

# Everything (CI: .ci/run): `make test`'s tests, the slow ones, and the training pages in full.
test-all: lint $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS)

# Train the reference detector on synthetic COCO and evaluate it (a few minutes on a CPU);
# writes demo-out/metrics.json, model.pt, model.onnx, predictions.png and loss.png.
demo: $(STAMP)
	$(PY) -m visionblocks demo --out demo-out

docs: $(STAMP)
	$(PY) -m mkdocs serve

# Redraw the pictures of docs/gallery.md (trains the demo detector first: a few minutes).
gallery: $(STAMP)
	$(PY) docs/scripts/make_gallery.py

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf site .pytest_cache .hypothesis build dist demo-out examples-out
