# shellcheck shell=bash
# What the jobs/*.sbatch scripts share: settings, the launcher, the Numba cache, the JSON.
#
# Sourced by each script inside its allocation (sbatch runs a copy of the script, so the
# scripts find this file in $RINGMPI_JOBS_DIR, default $SLURM_SUBMIT_DIR/jobs, else
# $SLURM_SUBMIT_DIR: submit from the repository root or from jobs/).
#
# Variables (all optional):
#   PYTHON        the interpreter of the environment with ringmpi installed
#                 (default: $SLURM_SUBMIT_DIR/.venv/bin/python if there, else python3)
#   LAUNCHER      srun (default) or mpirun: how the ranks start inside the allocation
#   SRUN_MPI      srun's --mpi plugin, the PMI the MPI library speaks (default pmi2;
#                 pmix where the site's MPI was built with PMIx)
#   MPIRUN        the mpirun for LAUNCHER=mpirun (default: next to $PYTHON, else on PATH)
#   RESULTS       directory for the JSON results (default $SLURM_SUBMIT_DIR/results)
#   MINBYTES MAXBYTES STEPFACTOR ITERS WARMUP BUDGET DATATYPE OP ALGORITHMS
#                 the sweep: python -m ringmpi.allreduce's -b -e -f -n -w --budget -d -o -a
#                 (defaults: the command line's own, 8 to 16M by 8, sum on float32)
#   RINGMPI_TIMEOUT  seconds a rank of ringmpi's rows waits without progress before it
#                 raises, naming the rank it waits for, and the job aborts (default here
#                 120); the baseline rows (mpi, mpi4py) time the library's blocking call
#   NUMBA_CACHE_DIR  where the compiled kernels are kept (default: Numba's own, beside the
#                 installed package, or under ~/.cache where the install is read-only: one
#                 cache per install, kept for the next job); filled on the first node, then
#                 loaded on every other, before the sweep
# and every other RINGMPI_* setting the library reads (RINGMPI_TUNING, ...), passed on.

: "${SLURM_JOB_ID:?run this inside a Slurm allocation (sbatch)}"

submit_dir=${SLURM_SUBMIT_DIR:-$PWD}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x $submit_dir/.venv/bin/python ]] && PYTHON=$submit_dir/.venv/bin/python
fi
LAUNCHER=${LAUNCHER:-srun}
SRUN_MPI=${SRUN_MPI:-pmi2}
RESULTS=${RESULTS:-$submit_dir/results}
export RINGMPI_TIMEOUT=${RINGMPI_TIMEOUT:-120}
# One thread per rank: the ranks are the parallelism.
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1
nodes=$SLURM_NNODES
ntasks=${SLURM_NTASKS:-$((nodes * ${SLURM_NTASKS_PER_NODE:-1}))}
mkdir -p "$RESULTS"

case $LAUNCHER in
  srun) ;;
  mpirun)
    if [[ -z ${MPIRUN:-} ]]; then
      MPIRUN=mpirun
      [[ -x $(dirname "$PYTHON")/mpirun ]] && MPIRUN=$(dirname "$PYTHON")/mpirun
    fi
    ;;
  *)
    echo "LAUNCHER=$LAUNCHER: srun or mpirun" >&2
    exit 2
    ;;
esac

# launch NTASKS NODES COMMAND...: NTASKS ranks on the first NODES nodes of the allocation,
# block by node; the whole step ends when one rank fails.
launch() {
  local n=$1 m=$2
  shift 2
  if [[ $LAUNCHER == srun ]]; then
    srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1 --nodes="$m" --ntasks="$n" "$@"
  elif "$MPIRUN" --version 2>/dev/null | grep -q 'Open MPI'; then
    "$MPIRUN" -n "$n" --map-by "ppr:$(((n + m - 1) / m)):node" "$@"
  else  # MPICH's hydra: inside an allocation it starts its proxies with srun
    "$MPIRUN" -n "$n" -ppn "$(((n + m - 1) / m))" "$@"
  fi
}

# warm_on NODES [--relative=1]: one task on each of NODES nodes loads the kernels and
# compiled loops the sweep's op and dtype need from Numba's cache, compiling into it
# what it lacks; prints where the cache is. MPI is not initialised.
warm_on() {
  local n=$1
  shift
  MPI4PY_RC_INITIALIZE=0 srun --mpi=none --nodes="$n" --ntasks="$n" --ntasks-per-node=1 \
    "$@" "$PYTHON" -c '
import sys
from ringmpi import _copy, algorithms, kernels
red = kernels.reduction(kernels.op_from_name(sys.argv[1]), sys.argv[2])
red.warm()
algorithms.warm(red)
print(getattr(getattr(_copy.copy_bytes, "_cache", None), "_cache_path", "?"))
' "${OP:-sum}" "${DATATYPE:-float32}"
}

# Before the sweep, so that no rank of it waits on a compile: the first node fills the
# cache (a first job compiles, for about a minute; a later one loads in seconds), then
# the others load it (a cache on a shared file system is written by one node alone;
# Numba keys each entry by the CPU, so a node of another kind adds its own).
warm_cache() {
  local t0=$SECONDS where
  where=$(warm_on 1 | tail -n 1)
  ((nodes > 1)) && warm_on "$((nodes - 1))" --relative=1 >/dev/null
  echo "# Numba cache $where ready on $nodes node(s) in $((SECONDS - t0)) s"
}

# The sweep's arguments from the variables above.
sweep_args() {
  args=()
  [[ -n ${MINBYTES:-} ]] && args+=(-b "$MINBYTES")
  [[ -n ${MAXBYTES:-} ]] && args+=(-e "$MAXBYTES")
  [[ -n ${STEPFACTOR:-} ]] && args+=(-f "$STEPFACTOR")
  [[ -n ${ITERS:-} ]] && args+=(-n "$ITERS")
  [[ -n ${WARMUP:-} ]] && args+=(-w "$WARMUP")
  [[ -n ${BUDGET:-} ]] && args+=(--budget "$BUDGET")
  [[ -n ${DATATYPE:-} ]] && args+=(-d "$DATATYPE")
  [[ -n ${OP:-} ]] && args+=(-o "$OP")
  [[ -n ${ALGORITHMS:-} ]] && args+=(-a "$ALGORITHMS")
  return 0
}

# stamp FILE [KEY=VALUE...]: record the job (id, name, nodes, launcher, host, ringmpi's
# commit where it is a git checkout) in the JSON header as "job", for python -m ringmpi report.
stamp() {
  "$PYTHON" - "$@" <<'EOF'
import json, os, socket, subprocess, sys

import ringmpi

path, extra = sys.argv[1], dict(kv.split("=", 1) for kv in sys.argv[2:])
src = os.path.dirname(os.path.abspath(ringmpi.__file__))
try:
    commit = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, timeout=10).stdout.strip()
except OSError:
    commit = ""
env = os.environ.get
with open(path) as fh:
    data = json.load(fh)
data["header"]["job"] = {
    "id": env("SLURM_JOB_ID"), "name": env("SLURM_JOB_NAME"),
    "nodelist": env("SLURM_JOB_NODELIST"), "host": socket.gethostname(),
    "launcher": env("LAUNCHER"), "srun_mpi": env("SRUN_MPI"),
    "timeout_s": env("RINGMPI_TIMEOUT"), "commit": commit or None, **extra,
}
with open(path, "w") as fh:
    json.dump(data, fh, indent=1)
EOF
}

export LAUNCHER SRUN_MPI PYTHON
echo "# job $SLURM_JOB_ID: $nodes node(s) ($SLURM_JOB_NODELIST), $ntasks task(s)," \
  "LAUNCHER=$LAUNCHER$([[ $LAUNCHER == srun ]] && echo " --mpi=$SRUN_MPI")," \
  "RINGMPI_TIMEOUT=$RINGMPI_TIMEOUT, PYTHON=$PYTHON"
