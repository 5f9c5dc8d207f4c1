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
SLURM   ?=
SLURM_TASKS ?= 4
SBATCH_ARGS ?=
# grade-class: the term record it merges into, a roster CSV, a late policy (TOML), a gradebook
# CSV to write (ANONYMOUS=1: without names); ONLY=student re-grades that folder alone;
# EXERCISE=l1_identity re-grades that exercise alone (with ONLY, of those students);
# ALLOW_UNISOLATED=1 grades where nothing isolates the code (no root, no user namespaces).
# TERM is read only from make's command line: the environment's TERM is the terminal's type.
ALLOW_UNISOLATED ?=
ROSTER    ?=
POLICY    ?=
GRADEBOOK ?=
ANONYMOUS ?=
ONLY      ?=
EXERCISE  ?=
RELEASE ?= build/student-release
GRADER  ?=
CLASSROOM_WORKFLOW ?= build/classroom.yml
GRADESCOPE ?= build/gradescope

ARGS    ?=
# Empty: the scripts pick from the hardware (nccl on GPUs, else gloo). gloo: the CPU even on
# a GPU machine (the launcher hides the GPUs). nccl: refuse to run without GPUs.
BACKEND ?=
OPTS    := --nproc '$(NPROC)' --nnodes '$(NNODES)' --port '$(PORT)' --timeout '$(TIMEOUT)' \
           --backend '$(BACKEND)'
# Checks NPROC/NNODES/PORT with the system Python before anything is installed or started.
CHECK   := $(PYTHON) -m ddpcourse.cluster.launch --check $(OPTS)

.PHONY: help setup setup-lesson9 bench test test-busy test-fast test-grading test-drills test-cluster test-notebooks test-lesson9 test-lesson10 lint grade grade-class notebooks site site-test figures \
        student-release gradescope classroom-workflow clean

help: ## list the targets
	@echo "usage: make TARGET [NPROC=k] [NNODES=n] [BACKEND=gloo|nccl] [ARGS=...] ..."
	@$(PYTHON) -m ddpcourse.course.lessons help
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

# One pip run installs everything, the course's own package included. --no-compile: pip would
# byte-compile every module of torch (about a minute here); ddpcourse.course.bytecode then
# compiles just the modules the lessons import, so that the first run is as fast as later
# ones, even where PYTHONDONTWRITEBYTECODE=1 stops Python from writing bytecode as it imports.
# No `pip install --upgrade pip`: the venv's pip suffices.
$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11 or newer is needed")'
	@echo "setting up $(VENV) from requirements.txt (first time: about 1.5 minutes)"
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --no-compile -r requirements.txt -e . 2>&1 | { grep -v 'is ignored' || true; }
	$(VPY) -m ddpcourse.course.bytecode
	@touch $@

setup: $(VENV)/.installed ## create .venv from requirements.txt (again only when it changes)
	@:

# Every lesson's targets (lesson1, check-ddp, ...) come from its lessons/lessonN/lesson.toml:
# one rule runs them all. The arguments are checked with the system Python before anything is
# installed or started; then the target's lesson installs what it needs (`setup`, or the
# lesson.toml's own, as lesson 9's setup-lesson9) and ddpcourse.course.lessons runs each step.
LESSON_TARGETS := $(shell $(PYTHON) -m ddpcourse.course.lessons targets)
BENCH_TARGETS  := $(shell $(PYTHON) -m ddpcourse.course.lessons targets --bench)
ifeq ($(strip $(LESSON_TARGETS)),)
$(error cannot read the lessons' targets: `$(PYTHON) -m ddpcourse.course.lessons targets` failed (Python 3.11 or newer is needed))
endif
.PHONY: $(LESSON_TARGETS)
$(LESSON_TARGETS):
	@$(CHECK)
	@$(MAKE) --no-print-directory "$$($(PYTHON) -m ddpcourse.course.lessons setup-of $@)"
	@$(VPY) -m ddpcourse.course.lessons run $@ $(OPTS) --args='$(subst ','\'',$(ARGS))'

bench: $(BENCH_TARGETS) ## every lesson's benchmark

# Three tests at a time (pytest-xdist) on 2 cores: many tests spend part of their time waiting
# (a timeout, a rendezvous, SLURM's daemons), and a third keeps the cores busy meanwhile.
# Measured with all eight lessons (270 tests): 4m05s and, from a fresh clone, 4m42s with 3;
# 4m31s with 4 (more contention). --dist loadgroup: the tests that share a module's job
# run on one worker, so the job runs once (tests/project/conftest.py groups them).
# Executing the notebooks (lessons 1-8 and 10: about 4 minutes of test time) is left to
# test-notebooks, and lessons 9's and 10's runs and grader checks to test-lesson9 and
# test-lesson10, all of which CI runs as well, so that make test stays under 5 minutes with
# ten lessons (4m55s from a fresh clone; 4m59s-5m01s with lesson 9's grader checks); make test
# still checks every lesson's registration, diffs, readings and notebooks stored without
# outputs. Lessons 6-8's wrong submissions (jobs that restart, kill and shard: 2.5 minutes of
# test time) went to test-grading, which CI runs too, when a fresh clone's make test reached
# 5m10s-5m17s; make test still grades every lesson's solutions and stubs and lessons 1-5's
# wrong submissions.
TEST_WORKERS ?= 3
test: setup ## lint, then the test suite (solutions full marks, stubs zero, every script and drill)
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 \
		-m "not notebook and not lesson9 and not lesson10 and not grading_heavy and not drills and not cluster"

test-drills: setup ## the error index's reproductions and lesson 6's drills (main first, a node lost, a SLURM requeue), run whole (about 3 minutes)
	$(VPY) -m pytest -q -n 2 -m drills

test-cluster: setup ## lesson 5's separate hosts and SLURM cluster, the SLURM grading array (root, iproute2, slurm-wlm, munge; else they skip)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m cluster

test-grading: setup ## lessons 6-8's wrong submissions and every lesson's process-ending mistake graded: each loses exactly its points
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m grading_heavy

test-notebooks: setup ## execute the notebooks of lessons 1-8 and 10 top to bottom (notebook 9: test-lesson9)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m notebook

# Lesson 10: its steps, experiments and grader checks (jobs of 3 to 8 processes), apart from
# make test, whose five minutes the other nine lessons fill; CI runs both.
test-lesson10: setup ## lesson 10's steps, experiments and grader checks (every parallelism, equal to one process)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m lesson10

# The suite on a loaded machine: one spinning process per core beside it, as on a busy laptop.
test-busy: setup ## make test with every core kept busy by another program
	@pids=""; for i in $$(seq $$(nproc)); do $(PYTHON) -c 'while True: pass' & pids="$$pids $$!"; done; \
	trap 'kill $$pids' EXIT; $(MAKE) --no-print-directory test

test-fast: setup ## lint and the tests that start no job (under a minute): the edit-run loop
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q -m "not slow" --durations=5

lint: setup ## ruff on the whole course
	$(VPY) -m ruff check .

grade: setup ## grade exercises: [LESSON=n] [IMPL=student|solutions] [SUBMISSION=folder]
	@$(VPY) -m ddpcourse.course.grading grade --lesson '$(LESSON)' --impl '$(IMPL)' \
		$(if $(SUBMISSION),--submission '$(SUBMISSION)')

# SLURM=1: one array job of SLURM_TASKS tasks on the cluster this machine is a login node of,
# merged into the same CSV and JSON; SBATCH_ARGS adds what the site needs (--partition=...).
# Each run merges into the term record (TERM, default build/grades/term.json): only the
# students and lessons it graded are replaced; class.csv is the whole term.
grade-class: setup ## grade every folder under SUBMISSIONS=dir, merged into the term record and build/grades/class.csv [ONLY= EXERCISE= ROSTER= POLICY= GRADEBOOK= SLURM=1]
	@$(VPY) -m ddpcourse.course.grading class '$(SUBMISSIONS)' --lesson '$(LESSON)' \
		$(if $(filter command line,$(origin TERM)),--term '$(TERM)') \
		$(if $(ROSTER),--roster '$(ROSTER)') \
		$(if $(POLICY),--policy '$(POLICY)') $(if $(GRADEBOOK),--gradebook '$(GRADEBOOK)') \
		$(if $(filter 1,$(ANONYMOUS)),--anonymous) $(if $(ONLY),--only '$(ONLY)') \
		$(if $(EXERCISE),--exercise '$(EXERCISE)') \
		$(if $(filter 1,$(ALLOW_UNISOLATED)),--allow-unisolated) \
		$(if $(filter 1,$(SLURM)),--slurm --tasks '$(SLURM_TASKS)' --sbatch-args '$(SBATCH_ARGS)')

notebooks: setup $(VENV)/.lesson9-installed ## execute every notebook and render HTML into build/notebooks
	$(VPY) -m jupyter nbconvert --to html --embed-images --execute --ExecutePreprocessor.timeout=600 \
		--output-dir build/notebooks notebooks/*.ipynb

# The website's packages (requirements-site.txt) go into .venv only for these two targets.
$(VENV)/.site-installed: requirements-site.txt $(VENV)/.installed
	$(VPY) -m pip install -q --no-compile -r requirements-site.txt 2>&1 | { grep -v 'is ignored' || true; }
	@touch $@

# Lesson 9's libraries (requirements-lesson9.txt) likewise; requirements.txt as constraints keeps
# pip from replacing torch with another release.
$(VENV)/.lesson9-installed: requirements-lesson9.txt $(VENV)/.installed
	@echo "installing lesson 9's libraries into $(VENV) (first time: about 2.5 minutes)"
	$(VPY) -m pip install -q --no-compile -r requirements-lesson9.txt -c requirements.txt 2>&1 \
		| { grep -v 'is ignored' || true; }
	@echo "building DeepSpeed's CPU communication operator (about 75 s), not at its first use"
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(VPY) -m pip install -q --no-compile --no-cache-dir \
		--no-build-isolation --no-deps --force-reinstall "$$(grep '^deepspeed==' requirements-lesson9.txt)" \
		2>&1 | { grep -v 'is ignored' || true; }
	@touch $@

setup-lesson9: setup $(VENV)/.lesson9-installed ## add lesson 9's libraries (Lightning, Accelerate, DeepSpeed, Dask) to .venv
	@:

# Outside `make test` and its 5 minutes (about 4 minutes on 2 cores): each run imports Lightning
# or starts a Dask cluster.
test-lesson9: setup-lesson9 ## lesson 9's libraries train to lesson 3's DDP weights, bit for bit; its grader's checks
	$(VPY) -m pytest -q -n 2 tests/lesson9
	$(VPY) -m pytest -q -n 2 --dist loadgroup -m lesson9

# Executes every notebook from the repository root, as `make notebooks` does (notebook 9 with
# lesson 9's libraries, installed first), then MkDocs builds
# the pages (ddpcourse/course/site.py, mkdocs.yml). 8.5 minutes on 2 busy cores, nearly all of
# it the notebooks (lesson 7's: 3 minutes); the MkDocs build itself takes about 10 s.
site: setup $(VENV)/.site-installed $(VENV)/.lesson9-installed ## the course as a website in build/site: readings, executed notebooks, appendix
	$(VPY) -m ddpcourse.course.site

site-test: setup $(VENV)/.site-installed ## read build/site (make site first) in headless Chromium: pages, links, images
	$(VPY) -m pytest -q tests/site

figures: setup ## regenerate the lesson figures in lessons/*/figures
	$(VPY) -m ddpcourse.course.lessons figures

# What git tracks (an untracked folder in the checkout, a class's submissions say, stays
# out), less solutions/, the wrong submissions and tracked files deleted but not committed.
# With GRADER, the release carries GitHub Classroom's workflow, pinned to that grader.
student-release: ## copy the course's tracked files without solutions/ to RELEASE [GRADER=owner/repo@commit]
	@$(if $(GRADER),$(PYTHON) -m ddpcourse.course.classroom check-grader -- '$(GRADER)')
	@rm -rf '$(RELEASE)' && mkdir -p '$(RELEASE)'
	@LC_ALL=C comm -23 <(git ls-files --cached) <(git ls-files --deleted) \
		| grep -v -e '^solutions/' -e '^tests/project/wrong_submissions/' | tar -cf - -T - | tar -xf - -C '$(RELEASE)'
	@echo "student copy written to $(RELEASE) (no solutions/); there: make lesson1, make grade"
	@$(if $(GRADER),$(MAKE) --no-print-directory classroom-workflow \
		CLASSROOM_WORKFLOW='$(RELEASE)/.github/workflows/classroom.yml',\
		echo "no GitHub Classroom workflow in it: make student-release GRADER=owner/repo@commit adds one")

# Gradescope's zip is the student release plus its setup.sh and run_autograder
# (ddpcourse/course/gradescope.py says what each does).
gradescope: ## Gradescope's autograder for [LESSON=n]: build/gradescope/autograder[-lessonN].zip
	@$(MAKE) --no-print-directory student-release RELEASE='$(GRADESCOPE)/source' GRADER= >/dev/null
	@$(PYTHON) -m ddpcourse.course.gradescope build '$(GRADESCOPE)/source' --lesson '$(LESSON)' \
		--zip '$(GRADESCOPE)/autograder$(if $(LESSON),-lesson$(LESSON)).zip'

# Checked with the system Python before `setup` installs anything.
classroom-workflow: ## GitHub Classroom's workflow, GRADER=owner/repo@commit [LESSON=n: that lesson alone], to CLASSROOM_WORKFLOW (build/classroom.yml)
	@$(PYTHON) -m ddpcourse.course.classroom check-grader -- '$(GRADER)'
	@$(MAKE) --no-print-directory setup
	@$(VPY) -m ddpcourse.course.classroom workflow --grader='$(GRADER)' --lesson '$(LESSON)' --out '$(CLASSROOM_WORKFLOW)'

clean: ## remove build outputs and runs (keeps .venv)
	rm -rf build runs .pytest_cache .ruff_cache
