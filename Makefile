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

ARGS    ?=
# Empty: the scripts pick from the hardware (nccl on GPUs, else gloo). gloo: the CPU even on
# a GPU machine (the launcher hides the GPUs). nccl: refuse to run without GPUs.
BACKEND ?=
OPTS    := --nproc '$(NPROC)' --nnodes '$(NNODES)' --port '$(PORT)' --timeout '$(TIMEOUT)' \
           --backend '$(BACKEND)'
# Checks NPROC/NNODES/PORT with the system Python before anything is installed or started.
CHECK   := $(PYTHON) -m ddpcourse.cluster.launch --check $(OPTS)

.PHONY: help setup bench test test-fast lint grade grade-class notebooks figures student-release clean

help: ## list the targets
	@echo "usage: make TARGET [NPROC=k] [NNODES=n] [BACKEND=gloo|nccl] [ARGS=...] ..."
	@$(PYTHON) -m ddpcourse.course.lessons help
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

# One pip run installs everything, the course's own package included. --no-compile: pip would
# byte-compile every module of torch (about a minute here); Python compiles the few that
# are imported, once, on first use. No `pip install --upgrade pip`: the venv's pip suffices.
$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11 or newer is needed")'
	@echo "setting up $(VENV) from requirements.txt (first time: about 1.5 minutes)"
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --no-compile -r requirements.txt -e . 2>&1 | { grep -v 'is ignored' || true; }
	@touch $@

setup: $(VENV)/.installed ## create .venv from requirements.txt (again only when it changes)
	@:

# Every lesson's targets (lesson1, check-ddp, ...) come from its lessons/lessonN/lesson.toml:
# one rule runs them all. The arguments are checked with the system Python before anything is
# installed or started; then ddpcourse.course.lessons prints and runs each step.
LESSON_TARGETS := $(shell $(PYTHON) -m ddpcourse.course.lessons targets)
BENCH_TARGETS  := $(shell $(PYTHON) -m ddpcourse.course.lessons targets --bench)
ifeq ($(strip $(LESSON_TARGETS)),)
$(error cannot read the lessons' targets: `$(PYTHON) -m ddpcourse.course.lessons targets` failed (Python 3.11 or newer is needed))
endif
.PHONY: $(LESSON_TARGETS)
$(LESSON_TARGETS):
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@$(VPY) -m ddpcourse.course.lessons run $@ $(OPTS) --args='$(subst ','\'',$(ARGS))'

bench: $(BENCH_TARGETS) ## every lesson's benchmark

# Three tests at a time (pytest-xdist) on 2 cores: many tests spend part of their time waiting
# (a timeout, a rendezvous, SLURM's daemons), and a third keeps the cores busy meanwhile.
# Measured with all eight lessons (270 tests): 4m05s and, from a fresh clone, 4m42s with 3;
# 4m31s with 4 (more contention). --dist loadgroup: the tests that share a module's job
# run on one worker, so the job runs once (tests/project/conftest.py groups them).
TEST_WORKERS ?= 3
test: setup ## lint, then the whole test suite (solutions full marks, stubs zero, notebooks run)
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

test-fast: setup ## lint and the tests that start no job (under a minute): the edit-run loop
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q -m "not slow" --durations=5

lint: setup ## ruff on the whole course
	$(VPY) -m ruff check .

grade: setup ## grade exercises: [LESSON=n] [IMPL=student|solutions] [SUBMISSION=folder]
	@$(VPY) -m ddpcourse.course.grading grade --lesson '$(LESSON)' --impl '$(IMPL)' \
		$(if $(SUBMISSION),--submission '$(SUBMISSION)')

grade-class: setup ## grade every folder under SUBMISSIONS=dir into build/grades/class.csv
	@$(VPY) -m ddpcourse.course.grading class '$(SUBMISSIONS)' --lesson '$(LESSON)'

notebooks: setup ## execute every notebook and render HTML into build/notebooks
	$(VPY) -m jupyter nbconvert --to html --embed-images --execute --ExecutePreprocessor.timeout=600 \
		--output-dir build/notebooks notebooks/*.ipynb

figures: setup ## regenerate the lesson figures in lessons/*/figures
	$(VPY) -m ddpcourse.figures

student-release: ## copy the course without solutions/ to RELEASE (default build/student-release)
	@rm -rf '$(RELEASE)' && mkdir -p '$(RELEASE)'
	@git ls-files | grep -v -e '^solutions/' -e '^tests/project/wrong_submissions/' | tar -cf - -T - | tar -xf - -C '$(RELEASE)'
	@echo "student copy written to $(RELEASE) (no solutions/); there: make lesson1, make grade"

clean: ## remove build outputs and runs (keeps .venv)
	rm -rf build runs .pytest_cache .ruff_cache
