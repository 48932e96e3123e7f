# asrtrain: `make smoke` installs and runs the tiny recipe; `make test` installs and runs the tests.
# One target per stage runs exactly that stage:  make features RECIPE=recipes/tiny ARGS="nj=4"
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
RECIPE ?= recipes/tiny
ARGS ?=
ASRTRAIN := $(VENV)/bin/asrtrain
# The stage table of asrtrain/stages/__init__.py, in its order (tests/test_pipeline.py checks it).
STAGES := prepare lang features train decode score lm mfcc align fmllr decode_gmm ivectors train_hybrid decode_hybrid

.PHONY: help install system-deps slurm smoke test lint bench clean $(STAGES)

help:
	@echo "make smoke       set up, then run the tiny recipe end to end (asrtrain run $(RECIPE))"
	@echo "make test        set up, then run the test suite"
	@echo "make STAGE       run one stage of RECIPE (default $(RECIPE)), ARGS=\"overrides\":"
	@echo "                 $(STAGES)"
	@echo "make slurm       a one-node SLURM cluster on this machine, for cmd=slurm (root, Debian)"
	@echo "make lint | bench | clean"

install: $(VENV)/.installed

# torch from PyPI brings its CUDA libraries (3.2 of the venv's 5.5 GB), used or not. On a machine
# without a GPU, TORCH_INDEX=<PyTorch's CPU-only wheel index> installs the CPU build of the
# pinned torch first; pip then keeps it. (Not tried here: these machines reach PyPI only.)
TORCH_INDEX ?=
TORCH_PIN = $(shell grep -o 'torch==[0-9.]*' setup.cfg)

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(VENV)/bin/pip install --quiet '$(TORCH_PIN)' --index-url $(TORCH_INDEX))
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

# Debian packages: sox (picks a channel of 2-channel SPHERE in wav.scp pipes, as Kaldi's
# sph2pipe does) and SCTK (sclite, hubscr.pl: score.backend=sclite and the parity tests) are
# required. espeak-ng is not: only regenerating data/tiny (data/tiny/make_tiny.py) and
# tests/test_align.py, which speaks its own sentences, need it; it is installed along when
# apt-get can run here, and otherwise named in a note.
DEBS := sox sctk
OPTIONAL_DEBS := espeak-ng
system-deps:
	@if ! command -v sox >/dev/null || ! [ -x /usr/lib/sctk/bin/hubscr.pl ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq $(DEBS)) >/dev/null; \
	  else echo "please install: sudo apt-get install $(DEBS)"; exit 1; fi; \
	fi
	@if ! command -v espeak-ng >/dev/null; then \
	  if ! { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	         && (apt-get update -qq && apt-get install -y -qq $(OPTIONAL_DEBS)) >/dev/null 2>&1; }; \
	  then echo "note: espeak-ng is not installed: data/tiny/make_tiny.py and" \
	    "tests/test_align.py need it (sudo apt-get install $(OPTIONAL_DEBS))"; fi; \
	fi

# slurmctld, slurmd and munge on this machine, partition `debug` (tests/slurm/start_slurm.sh,
# idempotent; installs them with apt-get). tests/test_slurm.py runs the same script itself, so
# `make test` needs no separate step.
slurm:
	bash tests/slurm/start_slurm.sh

smoke: install system-deps
	$(ASRTRAIN) run $(RECIPE) $(ARGS)

# TEST_WORKERS=N runs the suite in N pytest-xdist processes (at most 4 on a small machine: a
# test may start 8 learners), each test file whole in one of them (--dist loadfile: a file's
# module fixtures are built once); tests/conftest.py builds the session experiments once for all
# of them. Fresh clones on an idle 2-core machine: one process (0) 32 min 41 s (22e73d0); 2
# workers 19 min 32 s (4406aa8) and 22 min 6 s (f438670); 3 workers 18 min 35 s (d6f19d8): the
# suite is CPU-bound (~32-36 CPU-min), so more than 2 gain little. 2 workers with the CLI
# commands forked warm (bench/forked_cli.py): 17 min 15 s (fa2fd77); 18 min 24 s (671c369);
# with the SLURM arrays of nj tasks and the merged fault tests 15 min 33 s (710c7b4, all
# passed; 14 min 32 s and 14 min 51 s in two runs before it that had flaky failures); 15 min
# 12 s (42b3c4a) and, with one more SLURM test and the files in SLOW_FIRST's order, 15 min 57 s
# (46d4cc9), both all passed; 17 min 4 s (eac28fe, all passed). Of the suite's ~1,800-1,900
# CPU-s about a third was its ~160 torchrun learners importing torch (bench/suite_cpu.py); with
# the learners forked warm (asrtrain/distributed/warm.py) 16 min 10 s (4ca8168, all passed):
# 1,676 CPU-s, the learners' part 348 (132 learners 152, their 43 fork servers 196).
# Another day's host, slower: 14 min 21 s at 4c0697b (1,563 CPU-s); with bench/scale.py's
# stages forked warm and a faster fMLLR, 13 min 14 s at 03f0bd6 (all passed, 1,436 CPU-s).
# A slower host (AMD EPYC without AVX-512, 2026-11-28): 23 min 56 s at 523c88b (2,579 CPU-s
# besides pip); with every forked training command forking its own learners' fork server and
# the signalled, killed and multi-node runs forked warm (forked_cli.popen), 19 min 31 s at
# faa0c71 (all passed, 2,083 CPU-s besides pip). The same host, with the forked commands' lazy
# imports and first compose in their fork server, the curves' PNG without tight_layout and two
# real runs fewer in bench/science.py's small plan: 19 min 15 s (4c89a9b), 19 min 9 s (ed554fa),
# 17 min 52 s (9a32b2a, no ../shared), all passed (20 min 5 s at 1d88a97 before them; this
# host's run-to-run spread is ~10%). 3 workers at 5d49ac2: 19 min 55 s (CPU use 98%, slower
# than 2). With the recipe compositions kept (asrtrain/recipe.py): 18 min 50 s (27d4f8e) and
# 20 min 34 s (8662940, no ../shared: every file slower than at 9a32b2a, those that never
# compose too, on a disk that filled up during or just after it; 19 min 59 s at d30955a); the same two compose-heavy
# files with and without: 161-165 vs 170 CPU-s.
# 0: one process (-n 0).
TEST_WORKERS ?= 2
# compileall: the suite starts ~300 interpreters that import asrtrain; where the environment sets
# PYTHONDONTWRITEBYTECODE (as these machines' shells do) none writes its bytecode, and each
# compiled every module it imported again (~0.5 CPU-s for the whole package). Up-to-date files
# are skipped.
test: install system-deps
	$(VENV)/bin/python -m compileall -q asrtrain bench >/dev/null
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check asrtrain tests bench

bench: install
	$(VENV)/bin/python bench/run.py all $(BENCH_ARGS)

$(STAGES): install system-deps
	$(ASRTRAIN) run $(RECIPE) --stage $@ --to $@ $(ARGS)

clean:
	rm -rf exp
