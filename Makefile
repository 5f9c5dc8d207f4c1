# The course's commands. `make help` lists them. Every target builds .venv first if needed.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON  ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
NPROC   ?= 2
NNODES  ?= 1
PORT    ?=
TIMEOUT ?= 600
LESSON  ?=
IMPL    ?= student
SUBMISSION  ?=
SUBMISSIONS ?= submissions
RELEASE ?= build/student-release

ARGS    := --nproc '$(NPROC)' --nnodes '$(NNODES)' --port '$(PORT)' --timeout '$(TIMEOUT)'
# Checks NPROC/NNODES/PORT with the system Python before anything is installed or started.
CHECK   := $(PYTHON) -m ddpcourse.launch --check $(ARGS)
LAUNCH  := $(VPY) -m ddpcourse.launch $(ARGS)

.PHONY: help setup lesson1 test lint grade grade-class notebooks figures student-release clean

help: ## list the targets
	@echo "usage: make TARGET [NPROC=k] [NNODES=n] ..."
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

$(VENV)/.installed: requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11 or newer is needed")'
	@echo "setting up $(VENV) from requirements.txt (first time: about 3 minutes)"
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip 2>&1 | { grep -v 'is ignored' || true; }
	$(VPY) -m pip install -q -r requirements.txt 2>&1 | { grep -v 'is ignored' || true; }
	$(VPY) -m pip install -q --no-deps -e . 2>&1 | { grep -vE 'is ignored|^ *$$' || true; } >/dev/null
	@touch $@

setup: $(VENV)/.installed ## create .venv from requirements.txt (again only when it changes)

lesson1: ## nodes, ranks, world size: whoami on NPROC processes x NNODES simulated nodes
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@$(LAUNCH) scripts/lesson1_whoami.py

test: setup ## lint, then the whole test suite (solutions full marks, stubs zero, notebooks run)
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q --durations=15

lint: setup ## ruff on the whole course
	$(VPY) -m ruff check .

grade: setup ## grade exercises: [LESSON=n] [IMPL=student|solutions] [SUBMISSION=folder]
	@$(VPY) -m ddpcourse.grading grade --lesson '$(LESSON)' --impl '$(IMPL)' \
		$(if $(SUBMISSION),--submission '$(SUBMISSION)')

grade-class: setup ## grade every folder under SUBMISSIONS=dir into build/grades/class.csv
	@$(VPY) -m ddpcourse.grading class '$(SUBMISSIONS)' --lesson '$(LESSON)'

notebooks: setup ## execute every notebook and render HTML into build/notebooks
	$(VPY) -m jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=600 \
		--output-dir build/notebooks notebooks/*.ipynb

figures: setup ## regenerate the lesson figures in lessons/*/figures
	$(VPY) -m ddpcourse.figures

student-release: ## copy the course without solutions/ to RELEASE (default build/student-release)
	@rm -rf '$(RELEASE)' && mkdir -p '$(RELEASE)'
	@git ls-files | grep -v '^solutions/' | tar -cf - -T - | tar -xf - -C '$(RELEASE)'
	@echo "student copy written to $(RELEASE) (no solutions/); there: make lesson1, make grade"

clean: ## remove build outputs and runs (keeps .venv)
	rm -rf build runs .pytest_cache .ruff_cache
