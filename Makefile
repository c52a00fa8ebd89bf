# Set-up and the two everyday commands on a fresh Linux machine with only Python 3 and make:
#
#   make run     # create .venv if missing, install the project, run the main job (ar vs sd_ngram)
#   make test    # same set-up, then the test suite (what .ci/run runs; ~13 min on 2 free cores)
#   make test-quick  # a subset of fast test files (QUICK_TESTS: the acceptance rules, methods, store, config
#                    # checks), a few minutes
#   make report  # python -m experiments.report $(ARGS) inside .venv (tables and figures from the run stores)
#   make notebook    # execute notebooks/ablations.ipynb headless into notebooks/out/ (plots the committed runs)
#
# Knobs (on the command line: `make test TORCH=cuda PYTEST_ARGS="tests/test_rules.py -x"`):
#   TORCH        auto (default: cuda when `nvidia-smi` works, else cpu) | cpu | cuda
#   TORCH_SPEC   the torch requirement installed first (default torch==2.13.0)
#   TORCH_INDEX  extra package index for the cpu wheel (default PyTorch's CPU index)
#   ARGS         Hydra overrides for `make run` instead of the main job, e.g. ARGS="pair=tiny-llama method=sd"
#   PYTEST_ARGS  arguments for pytest in `make test`
#   TEST_WORKERS pytest-xdist workers for `make test` (default 2: the CI machine's cores; whole files per worker,
#                in file order; 0 runs in one process)
#   PYTHON       the interpreter that creates .venv (default python3)
#   QUICK_TESTS  the test files of `make test-quick`
# The install step runs again only when pyproject.toml changes or TORCH changes (stamp file).

PYTHON      ?= python3
VENV        ?= .venv
TORCH       ?= auto
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
ARGS        ?=
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
QUICK_TESTS ?= tests/test_rules.py tests/test_sampling.py tests/test_tiers.py tests/test_lossless.py \
               tests/test_registry.py tests/test_errors.py tests/test_config_schema.py tests/test_structure.py \
               tests/test_store.py tests/test_stats.py tests/test_fs.py
# Progress while the suite runs: a running count of tests per line ([ n/total]), the slowest tests at the end.
PYTEST_PROGRESS := -o console_output_style=count --durations=10

ifeq ($(TORCH),auto)
TORCH_KIND := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
else
TORCH_KIND := $(TORCH)
endif
ifeq ($(TORCH_KIND),cpu)
# torch alone from the CPU index; its dependencies come from the package index with the project's.
TORCH_PIP_ARGS := --no-deps --extra-index-url $(TORCH_INDEX)
else ifeq ($(TORCH_KIND),cuda)
TORCH_PIP_ARGS :=
else
$(error TORCH must be auto, cpu or cuda (got '$(TORCH)'))
endif

VPY   := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(TORCH_KIND)
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: run test test-quick report notebook install clean-venv help
.DEFAULT_GOAL := help

help:
	@sed -n '2,20p' Makefile | sed 's/^# \{0,1\}//'

# No ARGS: the main job (conf/exp/main.yaml: ar and sd_ngram interleaved on the built-in prompts).
run: $(STAMP)
	$(VPY) -m experiments.run $(if $(strip $(ARGS)),$(ARGS),+exp=main)

test: $(STAMP)
	@echo "[make] the test suite: ~13 min on 2 free cores (longer on a loaded machine; \`make test-quick\`: a few minutes)"
	WANDB_MODE=disabled $(VPY) -m pytest $(PYTEST_PROGRESS) $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

test-quick: $(STAMP)
	WANDB_MODE=disabled $(VPY) -m pytest $(PYTEST_PROGRESS) $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(QUICK_TESTS) $(PYTEST_ARGS)

report: $(STAMP)
	$(VPY) -m experiments.report $(ARGS)

notebook: $(STAMP)
	$(VPY) -m experiments.notebook $(ARGS)

install: $(STAMP)

$(VPY):
	@$(PYTHON) -m venv $(VENV) || { echo "error: '$(PYTHON) -m venv' failed; install the venv module (Debian/Ubuntu: apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2; exit 1; }

$(STAMP): pyproject.toml | $(VPY)
	@echo "[make] installing $(TORCH_SPEC) ($(TORCH_KIND)) and the project into $(VENV)"
	$(VPY) -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(VPY) -m pip install --quiet -e ".[dev]"
	@rm -f $(VENV)/.installed-*
	@touch $@

clean-venv:
	rm -rf $(VENV)
