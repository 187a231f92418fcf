"""Faults, run for real: a rank killed, a rank that raises, a rank that never arrives.

``python -m ringmpi reliability`` launches each case under ``mpirun`` (one job
per algorithm and fault), measures how long the job takes to end after the
fault and whether its output names the culprit, and prints the table of
docs/reliability.md (``--write FILE`` replaces the table between the file's
markers). tests/test_faults.py runs the same cases and asserts on them.

Each job (``python -m ringmpi.tools._reliability_job fault ALGORITHM FAULT CULPRIT``) calls
:func:`ringmpi.abort_on_error` and runs all-reduces of 8 MiB in a loop with
``RINGMPI_TIMEOUT`` set; the culprit rank, after the first call,

- ``kill``: sends itself SIGKILL 0.2 s into its next call (mid-collective):
  nothing of ringmpi runs in a killed process, and the launcher ends the job
  (MPICH's names a killed process, not necessarily the culprit; Open MPI's
  names its rank);
- ``raise``: raises an exception instead of calling;
- ``sleep``: sleeps instead of calling (a rank that never arrives).

Every rank first prints ``rank R pid P``, and the culprit ``fault F at T``
(T: wall-clock seconds), so that the outcome can be checked: the launcher's
report of a killed process names its PID (MPICH's) or rank (Open MPI's).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import command_parser, shm

__all__ = ["ALGORITHMS", "FAULTS", "Outcome", "launch", "main"]

FAULTS = ("kill", "raise", "sleep")
# Each algorithm with the settings that make it run its own code path at 4 ranks:
# hierarchical on two emulated nodes of 2 (node barriers and rails) and on one node.
ALGORITHMS: dict[str, tuple[str, dict[str, str]]] = {
    "ring": ("ring", {}),
    "recursive_doubling": ("recursive_doubling", {}),
    "rabenseifner": ("rabenseifner", {}),
    "hierarchical (2 nodes of 2)": ("hierarchical", {"RINGMPI_RANKS_PER_NODE": "2"}),
    "hierarchical (1 node)": ("hierarchical", {}),
    "shared_memory": ("shared_memory", {}),
    "mpi": ("mpi", {}),
    # 64 arrays fused into buckets, after the signature check all ranks make first
    "allreduce_many": ("allreduce_many", {}),
}
RANKS = 4
CULPRIT = 1
TIMEOUT = 3.0  # RINGMPI_TIMEOUT of the jobs, seconds
_LIMIT = 180.0  # a job still running this long after the fault has hung
BIG = 5 * 2**29  # bytes of int8 of --big: 2.5 GiB, past 2^31 elements and bytes
STRESS = ("tiny", "overhead", "interleaved", "user", "big")
_JOB = "ringmpi.tools._reliability_job"  # the MPI side, run under mpirun


@dataclass
class Outcome:
    """What a fault job did."""

    case: str
    fault: str
    returncode: int | None  # None: it had to be killed (it hung)
    seconds: float  # from the fault to the end of the job
    named: bool  # the output names the culprit (its rank, or its PID for a kill)
    message: str  # the line that names it (or, for a kill, reports one), or the output's end
    left: list[str]  # the MPI segments the job left in /dev/shm (removed afterwards)

    @property
    def ok(self) -> bool:
        return self.returncode not in (0, None) and (self.named or self.fault == "kill")


def mpirun() -> list[str]:
    """The launcher beside this interpreter (or on PATH), with Open MPI's flags."""
    here = Path(sys.executable).parent / "mpirun"
    exe = str(here) if here.exists() else shutil.which("mpirun")
    if exe is None:
        raise FileNotFoundError("no mpirun beside the interpreter or on PATH")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return [exe, "--allow-run-as-root", "--oversubscribe"]
    return [exe]


def launch(case: str, fault: str, timeout: float = TIMEOUT) -> Outcome:
    """Run one fault job of ``case`` (a key of :data:`ALGORITHMS`) and judge it."""
    algorithm, settings = ALGORITHMS[case]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "RINGMPI_TIMEOUT": repr(timeout), **settings}
    cmd = [*mpirun(), "-n", str(RANKS), sys.executable, "-m", _JOB,
           "fault", algorithm, fault, str(CULPRIT)]  # fmt: skip
    with shm.swept() as left:  # the killed ranks' segments: removed once the job is gone
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=_LIMIT + 60)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            code = None
        ended = time.time()
    at = re.search(r"^fault \w+ at ([0-9.]+)$", out, re.M)
    seconds = ended - float(at.group(1)) if at else float("nan")
    pid = re.search(rf"^rank {CULPRIT} pid (\d+)$", out, re.M)
    reported = None
    if fault == "kill":  # only the launcher can report a killed process
        said = rf".*(\bPID {pid.group(1) if pid else '-'}\b|process rank {CULPRIT}\b).*"
        reported = re.search(r".*([Ss]ignal 9|Killed|KILLED).*", out, re.M)
    elif fault == "raise":
        said = rf"ringmpi: rank {CULPRIT} failed.*"
    elif algorithm == "mpi":  # MPI_Iallreduce cannot say whom it waits for
        said = r".*RingMPIError: .*MPI does not say which.*"
    else:
        said = rf".*RingMPIError: .* for rank {CULPRIT}\b.*"
    found = re.search(said, out, re.M)
    line = found or reported
    message = line.group(0).strip() if line else out.strip()[-300:]
    return Outcome(case, fault, code, seconds, found is not None, message, left)


def measured(nranks: int = 3, *job: str) -> list[dict]:
    """The cases of one measuring job of ``nranks`` ranks (``job``: its arguments, by
    default the mismatch, value, stress and overhead cases): one dict per case, as
    the job's rank 0 printed them."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    cmd = [*mpirun(), "-n", str(nranks), sys.executable, "-m", _JOB,
           *(job or ("measure",))]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800,
                          check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring job failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]


def fault_table(outcomes: list[Outcome], timeout: float) -> str:
    lines = [
        f"| algorithm | fault | exit status | job ended after the fault | culprit named | "
        f"message (RINGMPI_TIMEOUT={timeout:g}) |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        status = "hung (killed)" if o.returncode is None else str(o.returncode)
        shown = o.message.replace("|", "\\|")
        if len(shown) > 160:
            shown = shown[:157] + "..."
        named = "yes" if o.named else "launcher's report" if o.fault == "kill" else "NO"
        lines.append(f"| {o.case} | {o.fault} | {status} | {o.seconds:.1f} s | {named} | "
                     f"`{shown}` |")  # fmt: skip
    return "\n".join(lines)


def mismatch_table(rows: list[dict]) -> str:
    lines = [
        "| algorithm | rank 1 differs in | validate | returned a result | raised: the "
        "disagreement | raised: timeout | memory past recvbuf | slowest rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        other = f" (other: {r['other']})" if r["other"] else ""
        lines.append(
            f"| {r['algorithm']} | {r['field']} | {'on' if r['validate'] else 'off'} | "
            f"{r['returned']} of {r['ranks']} | {r['disagreement']}{other} | {r['timeout']} | "
            f"{'intact' if r['intact'] else 'WRITTEN'} | {r['seconds']:.2f} s |"
        )
    return "\n".join(lines)


def bad_table(rows: list[dict]) -> str:
    lines = ["| mistake (every rank makes it) | error |", "|---|---|"]
    for r in rows:
        error = r["error"].replace("|", "\\|")
        if len(error) > 150:
            error = error[:147] + "..."
        lines.append(f"| {r['case']} | `{error}` |")
    return "\n".join(lines)


def values_table(rows: list[dict]) -> str:
    lines = [
        "| algorithm | op | result | IEEE (NumPy) | like comm.Allreduce (MPI's own) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["family"] == "special":
            lines.append(f"| {r['algorithm']} | {r['op']} | `{r['got']}` | "
                         f"{'same' if r['ieee'] else 'DIFFERS'} | "
                         f"{'same' if r['like_mpi'] else 'MPI: `' + r['mpi'] + '`'} |")  # fmt: skip
        else:
            lines.append(f"| {r['algorithm']} | sum, {r['dtype']} overflow | `{r['got']}` | "
                         f"{'wraps as NumPy' if r['wraps'] else 'DIFFERS'} | - |")  # fmt: skip
    return "\n".join(lines)


def stress_table(rows: list[dict]) -> str:
    lines = ["| case | algorithm | ranks | outcome |", "|---|---|---|---|"]
    for r in rows:
        if r["family"] == "tiny":
            said = (f"{r['calls']:,} calls of 8 B: resident memory grew {r['rss_growth_kib']} KiB "
                    f"(largest over the ranks), {r['us_per_call']:.1f} us a call, "
                    f"result {'right' if r['right'] else 'WRONG'}")  # fmt: skip
            lines.append(f"| many tiny calls | {r['algorithm']} | {r['ranks']} | {said} |")
        elif r["family"] == "interleaved":
            lines.append(f"| two communicators called in turn ({r['rounds']} rounds each) | auto "
                         f"| {r['ranks']} | {r['wrong']} wrong elements |")  # fmt: skip
        elif r["family"] == "user":
            said = (
                "the user's receive got the user's message" if r["right"] else "MATCHED ringmpi's"
            )
            lines.append(f"| an ANY_SOURCE/ANY_TAG receive of the user's across the call "
                         f"| {r['algorithm']} | {r['ranks']} | {said} |")  # fmt: skip
        elif r["family"] == "big":
            said = (f"{r['nbytes'] / 2**30:.1f} GiB of int8 in place: {r['seconds']:.1f} s, "
                    f"{r['wrong']} wrong elements")  # fmt: skip
            lines.append(f"| a count past 2^31 | {r['algorithm']} | {r['ranks']} | {said} |")
        elif r["family"] == "overhead":
            ratio = r["us_timeout"] / r["us_none"]
            lines.append(f"| an 8-byte call with a timeout set ({r['rounds']} rounds of "
                         f"{r['calls']} calls, medians) | {r['algorithm']} | {r['ranks']} | "
                         f"{r['us_none']:.2f} us without, {r['us_timeout']:.2f} us with "
                         f"({ratio:.2f}x) |")  # fmt: skip
    return "\n".join(lines)


def _replace(doc: str, name: str, text: str) -> str:
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    if begin not in doc or end not in doc:
        raise ValueError(f"no {begin} ... {end} in the file")
    head, _, rest = doc.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{text}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = command_parser("reliability", __doc__)
    p.add_argument("--write", metavar="FILE", help="replace the tables in FILE (between markers)")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="RINGMPI_TIMEOUT of the fault jobs, seconds"
    )
    p.add_argument("--big", action="store_true",
                   help=f"also all-reduce {BIG / 2**30:.1f} GiB of int8 per algorithm at 2 ranks "
                   "(about 3 minutes, 6 GiB of memory)")  # fmt: skip
    args = p.parse_args(argv)
    outcomes = []
    for case in ALGORITHMS:
        for fault in FAULTS:
            outcomes.append(launch(case, fault, args.timeout))
            o = outcomes[-1]
            print(f"# {case} {fault}: exit {o.returncode}, {o.seconds:.1f} s, named {o.named}",
                  file=sys.stderr, flush=True)  # fmt: skip
    rows = measured()
    if args.big:
        rows += measured(2, "big", str(BIG))
    day = time.strftime("%Y-%m-%d")
    tables = {
        "faults": f"Measured {day}, {RANKS} ranks, culprit rank {CULPRIT}.\n\n"
        + fault_table(outcomes, args.timeout),
        "mismatch": f"Measured {day}, 3 ranks, timeout 2 s.\n\n"
        + mismatch_table([r for r in rows if r["family"] == "mismatch"]),
        "bad": f"Measured {day}, 3 ranks.\n\n"
        + bad_table([r for r in rows if r["family"] == "bad"]),
        "values": f"Measured {day}, 3 ranks (inputs: see the text above).\n\n"
        + values_table([r for r in rows if r["family"] in ("special", "overflow")]),
        "stress": f"Measured {day}.\n\n" + stress_table([r for r in rows if r["family"] in STRESS]),
    }
    if args.write:
        path = Path(args.write)
        doc = path.read_text()
        for name, text in tables.items():
            doc = _replace(doc, name, text)
        path.write_text(doc)
    for text in tables.values():
        print(text + "\n")
    bad = [r for r in rows if r["family"] == "mismatch" and (r["returned"] or not r["intact"])]
    bad += [r for r in rows if r.get("wrong") or r.get("right") is False or r.get("wraps") is False]
    return 0 if all(o.ok for o in outcomes) and not bad else 1


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("reliability")
