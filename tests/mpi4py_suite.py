"""mpi4py's own collective tests, on communicators wrapped in ringmpi.Comm.

    mpirun -n N python tests/mpi4py_suite.py DIR [MODULE ...]

DIR is the ``test/`` folder of mpi4py's source release (``make test-mpi4py``
downloads the release of the installed mpi4py); its real-GPU array backends
(CuPy, Numba's CUDA) are dropped, as there is no GPU here. Each module runs with
every test class's communicator wrapped (``COMM = ringmpi.Comm(COMM)``, and the
``...Dup`` classes' duplicate wrapped after their ``setUp``); the reduce-scatters
and all-gathers run ringmpi's ring at every size (auto takes the library's call
for small buffers). A test passes where it passes on every rank. A test that
fails wrapped runs again as released: exits 1 if it passes there (ringmpi broke
it); one that fails both ways is the library's, and is listed.
"""

from __future__ import annotations

import importlib
import sys
import unittest

from mpi4py import MPI

import ringmpi

MODULES = ["test_cco_buf", "test_cco_nb_buf", "test_cco_pr_buf", "test_cco_obj", "test_cco_vec",
           "test_cco_nb_vec", "test_cco_buf_inter", "test_cco_obj_inter"]  # fmt: skip


class _Outcomes(unittest.TestResult):
    """Each test's outcome: "pass", "fail" (a failure or error, its subtests' too) or "skip"."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome: dict[str, str] = {}
        self.first: dict[str, str] = {}  # a failing test's first message

    def _set(self, test: unittest.TestCase, what: str, err=None) -> None:
        name = test.id()
        if self.outcome.get(name) != "fail":
            self.outcome[name] = what
        if err is not None and name not in self.first:
            self.first[name] = str(err[1]).splitlines()[0][:200] if str(err[1]) else err[0].__name__

    def addSuccess(self, test):
        self._set(test, "pass")

    def addFailure(self, test, err):
        self._set(test, "fail", err)

    def addError(self, test, err):
        self._set(test, "fail", err)

    def addSkip(self, test, reason):
        self._set(test, "skip")

    def addExpectedFailure(self, test, err):
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test):
        self._set(test, "fail", (AssertionError, AssertionError("unexpected success"), None))

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._set(test, "fail", err)


def _wrap(module) -> None:
    """Wrap every test class's communicator in ringmpi.Comm."""
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            continue
        comm = cls.__dict__.get("COMM")
        if isinstance(comm, MPI.Intracomm) and comm != MPI.COMM_NULL:
            cls.COMM = ringmpi.Comm(comm)
        if "setUp" in cls.__dict__:
            cls.setUp = _wrapped_setup(cls.__dict__["setUp"])


def _wrapped_setup(setup):
    def setUp(self):
        setup(self)
        comm = self.__dict__.get("COMM")
        if isinstance(comm, MPI.Intracomm) and comm != MPI.COMM_NULL:
            self.COMM = ringmpi.Comm(comm)

    return setUp


def _run(name: str, wrapped: bool, only: list[str] | None = None):
    """(outcome, first message) per test of module ``name`` (those in ``only``, if
    given), its communicators wrapped or as released."""
    module = importlib.reload(importlib.import_module(name))
    if wrapped:
        _wrap(module)
    loader = unittest.defaultTestLoader
    if only is None:
        suite = loader.loadTestsFromModule(module)
    else:
        suite = unittest.TestSuite(loader.loadTestsFromName(t[len(name) + 1 :], module)
                                   for t in only)  # fmt: skip
    result = _Outcomes()
    suite.run(result)
    return result.outcome, result.first


def _everywhere(outcome: dict[str, str]) -> dict[str, str]:
    """A test passes where it passes on every rank; fails where it fails on one."""
    merged: dict[str, str] = {}
    for theirs in MPI.COMM_WORLD.allgather(outcome):
        for name, what in theirs.items():
            now = merged.get(name)
            if "fail" in (what, now):
                merged[name] = "fail"
            else:
                merged[name] = "pass" if "pass" in (what, now) else "skip"
    return merged


def _count(outcome: dict[str, str]) -> str:
    said = {k: sum(1 for v in outcome.values() if v == k) for k in ("pass", "fail", "skip")}
    return f"{said['pass']} passed, {said['fail']} failed, {said['skip']} skipped"


def main(argv: list[str]) -> int:
    folder, names = argv[0], argv[1:] or MODULES
    sys.path.insert(0, folder)
    import arrayimpl  # mpi4py's array backends

    from ringmpi import _halves

    _halves.RING_FROM_BYTES = 0  # ringmpi's own halves at every size (auto: from 64 KiB)

    # No GPU here: the real-GPU backends (as mpi4py's own is_mpi_gpu names them) go.
    arrayimpl.ArrayBackends[:] = [
        a for a in arrayimpl.ArrayBackends if a.backend not in ("cupy", "numba", "dlpack-cupy")
    ]
    world = MPI.COMM_WORLD
    plain: dict[str, str] = {}
    wrapped: dict[str, str] = {}
    messages: dict[str, str] = {}
    for name in names:
        outcome, first = _run(name, wrapped=True)
        mine = _everywhere(outcome)
        wrapped.update(mine)
        messages.update(first)
        failed = sorted(t for t, v in mine.items() if v == "fail")  # the same on every rank
        if failed:  # as released: mpi4py's own test of the library, where it matters
            outcome, _ = _run(name, wrapped=False, only=failed)
            plain.update(_everywhere(outcome))
    broken = sorted(t for t, v in plain.items() if v == "pass")
    size = world.Get_size()
    for rank, said in enumerate(world.allgather({t: messages.get(t, "") for t in broken})):
        if world.Get_rank() == 0:
            for test, message in said.items():
                if message:
                    print(f"  rank {rank}: {test}: {message}")
    if world.Get_rank() == 0:
        vendor, version = MPI.get_vendor()
        print(f"{vendor} {'.'.join(map(str, version))} at {size} rank(s): {' '.join(names)}")
        print(f"wrapped: {_count(wrapped)}")
        for test in sorted(t for t, v in plain.items() if v != "pass"):
            print(f"  fails plain too: {test}")
        for test in broken:
            print(f"  passes plain, fails wrapped: {test}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
