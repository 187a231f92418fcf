"""Persistent and nonblocking collectives: Allreduce_init & co., Ireduce_scatter_block & co.

Each is started many times with new contents between starts; every result is
checked exactly (small integers, exact in any order), under both ways of
carrying the calls out (a progress thread, or the completion calls).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import _comm, _progress, _requests
from ringmpi.algorithms import registry

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
BIG = 1 << 18  # float64 elements: 2 MiB, ringmpi's own under auto in every family
STARTS = 4


@pytest.fixture(params=["thread", "wait"])
def comm(request, settings):
    """A wrapped duplicate of WORLD whose calls are carried out as the param says."""
    settings(progress=request.param)
    dup = WORLD.Dup()
    yield ringmpi.Comm(dup)
    dup.Free()


def ints(count: int, k: int, rank: int = RANK) -> np.ndarray:
    """Rank ``rank``'s input of start ``k``: small integers, as float64."""
    return ((np.arange(count) % 13) + rank + k).astype(np.float64)


def summed(count: int, k: int) -> np.ndarray:
    return sum(ints(count, k, r) for r in range(SIZE))


def mismatch(what: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    if got.tobytes() != want.tobytes():
        return [f"{what}: got {got.ravel()[:3]}..., expected {want.ravel()[:3]}..."]
    return []


@pytest.mark.parametrize("algorithm", ["auto", "ring", "shared_memory"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
def test_allreduce_init_runs_ringmpi_exactly_start_after_start(comm, algorithm, in_place):
    recv = np.zeros(BIG)
    send = MPI.IN_PLACE if in_place else np.zeros(BIG)
    if algorithm == "auto":
        req = comm.Allreduce_init(send, recv)
    else:
        req = ringmpi.Allreduce_init(send, recv, comm=comm, algorithm=algorithm)
    problems = [] if isinstance(req, ringmpi.Prequest) else [f"a {type(req).__name__}"]
    with ringmpi.trace() as seen:
        for k in range(STARTS):
            (recv if in_place else send)[...] = ints(BIG, k)
            req.Start()
            req.Wait()
            problems += mismatch(f"start {k}", recv, summed(BIG, k))
    req.Free()
    if seen.calls != STARTS:  # auto's choice may be the library's: its tuner tries it
        problems.append(f"the trace counts {seen.calls} calls, not {STARTS}: {seen.ran}")
    if algorithm != "auto" and set(seen.ran) != {algorithm}:
        problems.append(f"ran {seen.ran}, not {algorithm}")
    agree(WORLD, problems)


def test_the_halves_init_calls_are_exact_start_after_start(comm):
    block = BIG // SIZE
    mine, counts = np.zeros(block), [block] * SIZE
    source = np.zeros(block * SIZE)
    rsb = comm.Reduce_scatter_block_init(source, mine)
    rs = comm.Reduce_scatter_init(source, mine, counts)
    gathered = np.zeros(block * SIZE)
    ag = comm.Allgather_init(mine, gathered)
    problems = []
    for k in range(STARTS):
        source[...] = ints(block * SIZE, k)
        want = summed(block * SIZE, k)
        for name, req in (("Reduce_scatter_block", rsb), ("Reduce_scatter", rs)):
            mine[...] = -1
            req.Start()
            req.Wait()
            problems += mismatch(f"{name} start {k}", mine, want[RANK * block : (RANK + 1) * block])
        ringmpi.Prequest.Startall([ag])
        ag.Wait()
        problems += mismatch(f"Allgather start {k}", gathered, want)
    for req in (rsb, rs, ag):
        req.Free()
    agree(WORLD, problems)


def test_the_nonblocking_halves_are_exact(comm):
    block = BIG // SIZE
    source, mine, gathered = ints(block * SIZE, 3), np.zeros(block), np.zeros(block * SIZE)
    ringmpi.Ireduce_scatter_block(source, mine, comm=comm).Wait()
    want = summed(block * SIZE, 3)
    problems = mismatch("Ireduce_scatter_block", mine, want[RANK * block : (RANK + 1) * block])
    comm.Iallgather(mine, gathered).Wait()
    problems += mismatch("Iallgather", gathered, want)
    mine[...] = 0
    comm.Ireduce_scatter(source, mine, [block] * SIZE).Wait()
    problems += mismatch("Ireduce_scatter", mine, want[RANK * block : (RANK + 1) * block])
    agree(WORLD, problems)


def test_requests_mix_with_mpis_own(comm):
    if not comm_carried_by_mpi(comm):
        pytest.skip("MPI's own completion calls cannot carry out these calls here")
    ours, theirs = np.zeros(BIG), np.zeros(5)
    mine = ringmpi.Allreduce_init(MPI.IN_PLACE, ours, comm=comm)
    library = WORLD.Allreduce_init(MPI.IN_PLACE, theirs)
    problems = []
    for k in range(STARTS):
        ours[...], theirs[...] = ints(BIG, k), ints(5, k)
        ringmpi.Prequest.Startall([mine, library])
        MPI.Request.Waitall([mine, library])
        problems += mismatch(f"ringmpi's, start {k}", ours, summed(BIG, k))
        problems += mismatch(f"MPI's, start {k}", theirs, summed(5, k))
    nonblocking = [ringmpi.Iallreduce(MPI.IN_PLACE, ours, comm=comm),
                   WORLD.Iallreduce(MPI.IN_PLACE, theirs)]  # fmt: skip
    MPI.Request.Waitall(nonblocking)
    problems += mismatch("Iallreduce", ours, SIZE * summed(BIG, STARTS - 1))
    mine.Free()
    library.Free()
    agree(WORLD, problems)


def comm_carried_by_mpi(comm) -> bool:
    """Whether MPI.Request.Waitall completes ringmpi's requests on ``comm``: a thread
    carries them out, or MPI calls back (MPIX_Grequest_start)."""
    return _progress.threaded(_comm.context(comm)) or _progress._MPIX.usable()


def starts_in_c(comm) -> bool:
    """Whether a repeated all-reduce of arrays may start in C on ``comm`` (then auto
    takes ringmpi's request at every size)."""
    return _progress.mode(_comm.context(comm)) == "wait" and _progress._MPIX.usable()


def test_small_buffers_get_the_librarys_own_request(comm):
    x = ints(4, 0)
    req = comm.Allreduce_init(MPI.IN_PLACE, [x, MPI.DOUBLE])  # a buffer spec: never in C
    problems = [] if req._library is not None else ["not the library's own request"]
    with ringmpi.trace() as seen:
        req.Start()
        req.Wait()
        MPI.Prequest.Startall([req])  # its handle is the library's: MPI's calls take it
        MPI.Request.Waitall([req])
    if seen.ran != ["mpi"]:  # the trace counts the starts it sees
        problems.append(f"the trace saw {seen.ran}, not ['mpi']")
    x[...] = ints(4, 0)
    req.Start()
    req.Wait()
    req.Free()
    agree(WORLD, problems + mismatch("small", x, summed(4, 0)))


def test_auto_takes_its_own_request_from_the_familys_size(comm):
    """Under auto a request is ringmpi's from 64 KiB (MPICH), 2 MiB (Intel MPI) or
    1 MiB (Open MPI), the library's below unless its starts may be made in C; exact
    either way, and again on the same arrays (the second Iallreduce takes what the
    first one checked)."""
    version = MPI.Get_library_version()
    want = (64 << 10 if version.startswith("MPICH") else
            2 << 20 if version.startswith("Intel") else 1 << 20)  # fmt: skip
    problems = (
        []
        if _requests.own_from_bytes() == want
        else [f"own_from_bytes() = {_requests.own_from_bytes()}, expected {want} ({version[:20]})"]
    )
    own = _progress.mode(_comm.context(comm)) != "library"
    for nbytes, mine in ((want, own), (want - 8, starts_in_c(comm))):
        x = ints(nbytes // 8, 0)
        req = comm.Allreduce_init(MPI.IN_PLACE, x)
        if (req._library is None) != mine:
            problems.append(f"{nbytes} B: {'not ' * mine}the library's own request")
        req.Start()
        req.Wait()
        req.Free()
        problems += mismatch(f"{nbytes} B persistent", x, summed(x.size, 0))
        for k in (1, 2):
            x[...] = ints(x.size, k)
            comm.Iallreduce(MPI.IN_PLACE, x).Wait()
            problems += mismatch(f"{nbytes} B nonblocking {k}", x, summed(x.size, k))
    agree(WORLD, problems)


# Each setting as a blocking call sees it; 2 KiB of float32, where plain auto's
# nonblocking and persistent calls are the library's own requests.
SETTINGS = [{"algorithm": "ring"}, {"algorithm": "mpi"}, {"reproducible": True},
            {"validate": True}, {"timeout": 60.0}]  # fmt: skip


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(map(str, s.items())))
def test_every_kind_of_call_follows_the_settings_as_the_blocking_call(settings, setting):
    settings(**setting)
    count = 512
    rng = np.random.default_rng(RANK)
    mine = rng.standard_normal(count).astype(np.float32)
    ran, bits, problems = {}, {}, []
    for kind in ("blocking", "nonblocking", "persistent"):
        dup = WORLD.Dup()
        x = mine.copy()
        with ringmpi.trace() as seen:
            if kind == "blocking":
                ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, dup)
            elif kind == "nonblocking":
                ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, dup).Wait()
            else:
                req = ringmpi.Allreduce_init(MPI.IN_PLACE, x, MPI.SUM, dup)
                req.Start()
                req.Wait()
                req.Free()
        dup.Free()
        ran[kind], bits[kind] = seen.ran, x.tobytes()
    if ran["blocking"] != ran["nonblocking"] or ran["blocking"] != ran["persistent"]:
        problems.append(f"the calls ran {ran}")
    if "algorithm" in setting and ran["blocking"] != [setting["algorithm"]]:
        problems.append(f"the blocking call ran {ran['blocking']}")
    if len(set(bits.values())) != 1:
        problems.append("the kinds of call gave different bits")
    if setting.get("reproducible"):  # the left fold in rank order, bitwise
        inputs = WORLD.allgather(mine)
        want = inputs[0].copy()
        for other in inputs[1:]:
            want += other
        problems += mismatch("reproducible", np.frombuffer(bits["persistent"], np.float32), want)
    agree(WORLD, problems)


# The calls that stop at a wait and go on later: those of every own record that makes
# its call ready itself (a plan's, or its own prepare; not symmetric, which reads the
# other ranks' arrays where they lie, and so waits for their start).
RESUMABLE = [a.name for a in registry.records() if a.own and a.prepare is not None]
HALVES_RESUMABLE = [(c, a.name) for c in ("reduce_scatter", "allgather")
                    for a in registry.records(c) if a.own and a.prepare is not None]  # fmt: skip


def late_rank(start, fill, result) -> list[str]:
    """Start after start of ``start()`` (``fill(k)`` first; ``result(what, k)`` checks
    it): three completed with Wait (the communicator set up, the call remembered),
    then three that rank 0 tests before the other ranks start (they start only once
    told its first Test returned), completed by Tests alone. A Test that ran the call
    to its end would wait for ranks that never start, until the timeout named them."""
    problems = []
    for k in range(3):
        fill(k)
        start().Wait()
        problems += result(f"call {k}", k)
    for k in range(3, 6):
        fill(k)
        problems += started_late(k, lambda: [start()])[0]
        problems += result(f"start {k}", k)
    return problems


def started_late(k: int, start) -> tuple[list[str], list[MPI.Request]]:
    """Rank 0 starts ``start()``'s requests and tests the last once; the other ranks
    start theirs only once told that Test returned (it must not have completed);
    then Tests of the last alone, on every rank, until it completes. Returns the
    problems and the requests."""
    if RANK != 0:
        WORLD.recv(source=0, tag=k)
    requests = start()
    last = requests[-1]
    problems = []
    if RANK == 0:
        first = last.Test()
        for r in range(1, SIZE):
            WORLD.send(first, dest=r, tag=k)
        if first:
            problems.append(f"start {k}: the first Test completed before the others started")
    while not last.Test():
        pass
    return problems, requests


# hierarchical also across emulated nodes (at 3 ranks one of two, one of one): its
# node passes and its rails' messages
RESUMABLE_ON = [pytest.param(a, None, id=a) for a in RESUMABLE] + [
    pytest.param("hierarchical", (SIZE + 1) // 2, id="hierarchical-across-nodes")
]


@pytest.mark.parametrize("segment", [None, 8 << 10], ids=["segments-default", "segments-8KiB"])
@pytest.mark.parametrize(("algorithm", "nodes"), RESUMABLE_ON)
def test_a_started_call_goes_on_in_test_without_waiting_for_a_late_rank(settings, algorithm,
                                                                        nodes, segment):  # fmt: skip
    """Under ``progress="wait"`` a started all-reduce (the step engine's, shared memory,
    hierarchical) goes as far as it can in each Test, which never waits for another
    rank (nor does the start): :func:`late_rank`, exact. With 8 KiB segments a step's
    message goes in many pieces, and a call stops between them too."""
    if SIZE == 1:
        pytest.skip("needs a rank that starts late")
    settings(progress="wait", segment_bytes=segment, ranks_per_node=nodes)
    dup = WORLD.Dup()
    x = np.zeros(BIG)

    def start():
        return ringmpi.Iallreduce(MPI.IN_PLACE, x, comm=dup, algorithm=algorithm, timeout=20)

    def fill(k: int) -> None:
        x[...] = ints(BIG, k)

    problems = late_rank(start, fill, lambda what, k: mismatch(what, x, summed(BIG, k)))
    dup.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", RESUMABLE)
def test_any_of_two_started_calls_is_tested_without_waiting_for_a_late_rank(settings,
                                                                             algorithm):  # fmt: skip
    """Two all-reduces started on one communicator under ``progress="wait"``: a Test
    of the second carries the first on as far as it goes and never waits for
    another rank (the others start both only once rank 0's first Test of the
    second returned); Tests of the second alone then complete both, exact. A Test
    that ran the first call to its end would wait for ranks that never start,
    until the timeout named them."""
    if SIZE == 1:
        pytest.skip("needs a rank that starts late")
    settings(progress="wait")
    dup = WORLD.Dup()
    x, y = np.zeros(BIG), np.zeros(BIG)

    def start(a: np.ndarray) -> MPI.Request:
        return ringmpi.Iallreduce(MPI.IN_PLACE, a, comm=dup, algorithm=algorithm, timeout=10)

    problems = []
    for k in range(4):
        x[...], y[...] = ints(BIG, k), ints(BIG, k + 1)
        if k < 2:  # the communicator set up, both calls remembered
            for req in [start(x), start(y)]:  # (their own Wait: any family under "wait")
                req.Wait()
        else:
            more, (first, _) = started_late(k, lambda: [start(x), start(y)])
            problems += more if first.Test() else [*more, f"round {k}: the first not done"]
        problems += mismatch(f"round {k}, first", x, summed(BIG, k))
        problems += mismatch(f"round {k}, second", y, summed(BIG, k + 1))
    dup.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize(("collective", "algorithm"), HALVES_RESUMABLE)
def test_a_started_half_goes_on_in_test_without_waiting_for_a_late_rank(settings, collective,
                                                                        algorithm, in_place):  # fmt: skip
    """The same for the halves (``Ireduce_scatter_block``, ``Iallgather``) of each
    record that can stop at a wait: :func:`late_rank`, exact, in place and not."""
    if SIZE == 1:
        pytest.skip("needs a rank that starts late")
    settings(progress="wait")
    dup = WORLD.Dup()
    block = BIG // SIZE
    send, recv = np.zeros(block * SIZE), np.zeros(block if collective == "reduce_scatter" else
                                                  block * SIZE)  # fmt: skip
    if collective == "reduce_scatter":
        given = MPI.IN_PLACE if in_place else send
        into = send if in_place else recv  # in place: the block lands at the input's start

        def start():
            return ringmpi.Ireduce_scatter_block(given, into, comm=dup, algorithm=algorithm,
                                                 timeout=20)  # fmt: skip

        def fill(k: int) -> None:
            send[...] = ints(block * SIZE, k)

        def result(what: str, k: int) -> list[str]:
            want = summed(block * SIZE, k)[RANK * block : (RANK + 1) * block]
            return mismatch(what, into[:block], want)

    else:
        mine = recv[RANK * block : (RANK + 1) * block]
        given = MPI.IN_PLACE if in_place else send[:block]

        def start():
            return ringmpi.Iallgather(given, recv, comm=dup, algorithm=algorithm, timeout=20)

        def fill(k: int) -> None:
            (mine if in_place else send[:block])[...] = ints(block, k)
            if not in_place:
                recv[...] = -1

        def result(what: str, k: int) -> list[str]:
            want = np.concatenate([ints(block, k, r) for r in range(SIZE)])
            return mismatch(what, recv, want)

    problems = late_rank(start, fill, result)
    dup.Free()
    agree(WORLD, problems)


def test_ringmpi_writes_a_requests_handle_where_mpi4py_keeps_it():
    """MPIX_Grequest_start and set_handle write the handle at the object's address plus
    one offset: it must be where mpi4py keeps it, for every request class used."""
    problems = []
    for cls in (MPI.Request, MPI.Grequest, MPI.Prequest, ringmpi.Prequest, _progress.Request):
        request = cls()
        if _progress._HANDLE_AT(request) != id(request) + _progress._HANDLE_OFFSET:
            problems.append(
                f"{cls.__name__}: handle at {_progress._HANDLE_AT(request) - id(request)}"
            )
    agree(WORLD, problems)


@pytest.mark.parametrize("begin", ["compiled", "python"])
def test_requests_beyond_a_chunk_of_cells_are_exact_and_reuse_them(settings, monkeypatch, begin):
    """More requests at once than a chunk of MPIX cells holds, twice: every result
    exact, and the second round takes the cells MPI freed (no more chunks); through
    the compiled start and through the Python one (where builtins cannot be made)."""
    mpix = _progress._MPIX
    if not mpix.usable():
        pytest.skip("this MPI has no MPIX_Grequest_start")
    settings(progress="wait")
    if begin == "python":
        monkeypatch.setattr(mpix, "_begin", mpix._python_begin)
    dup = WORLD.Dup()
    problems, count, chunks = [], _progress._CHUNK + 7, 0
    for again in range(2):
        arrays = [ints(5, k + again) for k in range(count)]
        requests = [ringmpi.Iallreduce(MPI.IN_PLACE, x, comm=dup, algorithm="ring")
                    for x in arrays]  # fmt: skip
        chunks = chunks or len(mpix._chunks)
        MPI.Request.Waitall(requests)
        for k, x in enumerate(arrays):
            problems += mismatch(f"round {again}, request {k}", x, summed(5, k + again))
    if len(mpix._chunks) != chunks:
        problems.append(f"the second round made {len(mpix._chunks) - chunks} more chunks")
    dup.Free()
    agree(WORLD, problems)


def test_misuse_raises_naming_it(comm):
    x = np.zeros(BIG)
    req = comm.Allreduce_init(MPI.IN_PLACE, x)
    req.Start()
    with pytest.raises(ringmpi.RingMPIError, match="active"):
        req.Start()
    req.Wait()
    req.Free()
    with pytest.raises(ringmpi.RingMPIError, match="freed"):
        req.Start()
    with pytest.raises(ValueError, match="unknown name 'rign'"):
        ringmpi.Allreduce_init(MPI.IN_PLACE, x, comm=comm, algorithm="rign")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        ringmpi.Reduce_scatter_block_init(x, x[:1], comm=comm, algorithm="rign")
