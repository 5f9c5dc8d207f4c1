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
# a GPU machine (the launcher hides the GPUs from torchrun jobs, HIDDEN from the commands
# make runs itself). nccl: refuse to run without GPUs.
BACKEND ?=
ifeq ($(strip $(BACKEND)),gloo)
HIDDEN  := CUDA_VISIBLE_DEVICES= # (ends in a space: it prefixes a command)
endif
OPTS    := --nproc '$(NPROC)' --nnodes '$(NNODES)' --port '$(PORT)' --timeout '$(TIMEOUT)' \
           --backend '$(BACKEND)'
# Checks NPROC/NNODES/PORT with the system Python before anything is installed or started.
CHECK   := $(PYTHON) -m ddpcourse.launch --check $(OPTS)
LAUNCH  := $(VPY) -m ddpcourse.launch $(OPTS)

.PHONY: help setup lesson1 lesson2 lesson3 check-ddp bench-ddp lesson4 lesson4-hang bench-allreduce bench test lint grade grade-class notebooks figures student-release clean

help: ## list the targets
	@echo "usage: make TARGET [NPROC=k] [NNODES=n] [BACKEND=gloo|nccl] [ARGS=...] ..."
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

$(VENV)/.installed: requirements.txt
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
	@$(LAUNCH) scripts/lesson1_whoami.py $(ARGS)

lesson2: ## one device, then DataParallel (one process, one thread per GPU): the same training
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@echo '$$ $(HIDDEN)$(VPY) scripts/lesson2_single_device.py $(ARGS)'
	@$(HIDDEN)$(VPY) scripts/lesson2_single_device.py $(ARGS)
	@echo '$$ $(HIDDEN)$(VPY) scripts/lesson2_data_parallel.py $(ARGS)'
	@$(HIDDEN)$(VPY) scripts/lesson2_data_parallel.py $(ARGS)

lesson3: ## DDP with torchrun on NPROC x NNODES, then mp.spawn [ARGS="--batch-size 255"]
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@$(LAUNCH) scripts/lesson3_ddp.py $(ARGS)
	@# mp.spawn starts every process on this one machine: NPROC x NNODES of them
	@echo "\$$ $(HIDDEN)$(VPY) scripts/lesson3_ddp_spawn.py --nproc $$(( $(NPROC) * $(NNODES) )) $(ARGS)"
	@$(HIDDEN)$(VPY) scripts/lesson3_ddp_spawn.py --nproc "$$(( $(NPROC) * $(NNODES) ))" $(ARGS)

check-ddp: ## DDP on NPROC processes reproduces one-process training (and BatchNorm does not)
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@$(LAUNCH) scripts/lesson3_check_equivalence.py $(ARGS)

bench-ddp: ## samples/s and wall time: one device vs DDP on 2 and 4 processes; start-up cost
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@echo '$$ $(HIDDEN)$(VPY) scripts/lesson3_benchmark.py'
	@$(HIDDEN)$(VPY) scripts/lesson3_benchmark.py

lesson4: ## collectives and process groups: every collective, then groups, on NPROC x NNODES
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@$(LAUNCH) scripts/lesson4_collectives.py $(ARGS)
	@$(LAUNCH) scripts/lesson4_groups.py $(ARGS)

lesson4-hang: ## failure drill: only rank 0 calls all_reduce; a 5 s timeout ends it; then the fix
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@# torchrun exits 1 when a worker fails, as the broken runs must (with NPROC=1 they
	@# finish, status 0). The launcher's own errors (2 bad input, 124 time limit, 130
	@# interrupted) and anything else stop make.
	@rc=0; $(LAUNCH) scripts/lesson4_hang.py --timeout 5 || rc=$$?; \
		case $$rc in 0) ;; 1) echo "(that failure was the drill)" ;; *) exit $$rc ;; esac
	@rc=0; $(LAUNCH) scripts/lesson4_hang.py --timeout 5 --detail || rc=$$?; \
		case $$rc in 0) ;; 1) echo "(DETAIL names it at once)" ;; *) exit $$rc ;; esac
	@$(LAUNCH) scripts/lesson4_hang.py --timeout 5 --fixed

bench-allreduce: ## all-reduce time, algbw, busbw from 1 KB to 256 MB on 2 and 4 processes
	@$(CHECK)
	@$(MAKE) --no-print-directory setup
	@echo '$$ $(HIDDEN)$(VPY) scripts/lesson4_allreduce_bench.py'
	@$(HIDDEN)$(VPY) scripts/lesson4_allreduce_bench.py

bench: bench-ddp bench-allreduce ## every benchmark: DDP throughput, then all-reduce cost

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
	$(VPY) -m jupyter nbconvert --to html --embed-images --execute --ExecutePreprocessor.timeout=600 \
		--output-dir build/notebooks notebooks/*.ipynb

figures: setup ## regenerate the lesson figures in lessons/*/figures
	$(VPY) -m ddpcourse.figures

student-release: ## copy the course without solutions/ to RELEASE (default build/student-release)
	@rm -rf '$(RELEASE)' && mkdir -p '$(RELEASE)'
	@git ls-files | grep -v '^solutions/' | tar -cf - -T - | tar -xf - -C '$(RELEASE)'
	@echo "student copy written to $(RELEASE) (no solutions/); there: make lesson1, make grade"

clean: ## remove build outputs and runs (keeps .venv)
	rm -rf build runs .pytest_cache .ruff_cache
