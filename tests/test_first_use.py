"""What a user meets first: signatures, the public names, and the errors for the
mistakes people make (lists as buffers, a misspelt setting, MPI not running).

Each test calls MPI in this process (one rank) or starts Python itself.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi

pytestmark = pytest.mark.family  # MPI in the test's own process

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_allreduce_has_its_signature():
    """The builtin carries the Python function's signature, for help() and IDEs (a
    builtin's defaults are literals: op's shows as None, which means MPI.SUM)."""
    sig = inspect.signature(ringmpi.Allreduce)
    got = [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]
    empty = inspect.Parameter.empty
    assert got == [
        ("sendbuf", "POSITIONAL_OR_KEYWORD", empty),
        ("recvbuf", "POSITIONAL_OR_KEYWORD", empty),
        ("op", "POSITIONAL_OR_KEYWORD", None),
        ("comm", "POSITIONAL_OR_KEYWORD", None),
        ("algorithm", "KEYWORD_ONLY", "auto"),
        ("validate", "KEYWORD_ONLY", None),
        ("timeout", "KEYWORD_ONLY", None),
        ("reproducible", "KEYWORD_ONLY", None),
    ]
    assert ringmpi.Allreduce.__doc__.startswith("All-reduce ``sendbuf`` into ``recvbuf``")
    x = np.arange(3.0)
    ringmpi.Allreduce(MPI.IN_PLACE, x, None)  # one rank: the sum is the input
    ringmpi.Allreduce(MPI.IN_PLACE, x, op=None, comm=MPI.COMM_WORLD)
    assert x.tolist() == [0.0, 1.0, 2.0]


def test_dir_lists_each_public_name_once():
    names = dir(ringmpi)
    assert len(names) == len(set(names))
    assert set(ringmpi.__all__) <= set(names)
    assert not {"TYPE_CHECKING", "annotations", "importlib"} & set(names)


def test_api_page_lists_every_public_name():
    text = (DOCS / "api.md").read_text()
    said = text.split("Everything public is in `ringmpi.__all__`:", 1)[1].split(".\n", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", said)) == sorted(ringmpi.__all__)


def test_unsupported_error_is_public_and_a_type_error():
    assert "UnsupportedError" in ringmpi.__all__
    assert issubclass(ringmpi.UnsupportedError, TypeError)
    with pytest.raises(ringmpi.UnsupportedError, match="dtype float128 is not supported"):
        ringmpi.Allreduce(MPI.IN_PLACE, np.ones(3, np.longdouble), algorithm="ring")


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: ringmpi.Allreduce(MPI.IN_PLACE, [1.0, 2.0]),
         "recvbuf is a list of numbers, not a buffer: pass a NumPy array"),
        (lambda: ringmpi.Allreduce((1, 2), np.empty(2, np.int64)),
         "sendbuf is a tuple of numbers, not a buffer"),
        (lambda: ringmpi.Iallreduce(MPI.IN_PLACE, [np.ones(2), np.ones(3)]),
         "recvbuf is a list of 2 arrays: one call reduces one buffer; "
         "ringmpi.allreduce_many(arrays)"),
    ],
    ids=["numbers", "tuple-send", "arrays"],
)  # fmt: skip
def test_a_list_is_named_for_what_it_is(call, says):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith(says)


def test_an_op_a_dtype_refuses_lists_every_type_it_takes():
    with pytest.raises(TypeError) as info:
        ringmpi.allreduce(np.ones(2, np.complex64), op=MPI.MAX)
    takes = str(info.value).split("(it takes: ", 1)[1].rstrip(")").split(", ")
    assert takes[-2:] == ["float16", "bfloat16"] and "float32" in takes
    with pytest.raises(TypeError) as info:
        ringmpi.allreduce(np.ones(2), op=MPI.BAND)
    assert "float16" not in str(info.value)  # no half type takes a bitwise op


def test_a_setting_is_checked_where_it_is_given(tmp_path, settings):
    before = ringmpi.configure()
    with pytest.raises(ValueError, match=r"^algorithm: unknown name 'rign' \(known: auto, ring"):
        ringmpi.configure(algorithm="rign")
    with (
        pytest.raises(ValueError, match=r"^algorithm: unknown name 'rign'"),
        ringmpi.configured(algorithm="rign"),
    ):
        pass
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=r"^tuning: cannot read '.*missing\.json'"):
        ringmpi.configure(tuning=str(missing))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^tuning: '.*bad\.json' is not a tuning file"):
        ringmpi.configure(tuning=str(tmp_path / "bad.json"))
    assert ringmpi.configure().algorithm == before.algorithm  # a refused change changes nothing
    assert settings(algorithm="ring").algorithm == "ring"


def test_the_environment_is_checked_naming_its_variable(environ):
    environ.set("RINGMPI_ALGORITHM", "rign")
    with pytest.raises(ValueError, match=r"^RINGMPI_ALGORITHM: unknown name 'rign'"):
        ringmpi.allreduce(np.ones(2))


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("""
         import mpi4py
         mpi4py.rc.initialize = False
         from mpi4py import MPI
         import numpy as np, ringmpi
         ringmpi.Allreduce(MPI.IN_PLACE, np.ones(2))
         """,
         "ringmpi.RingMPIError: MPI is not initialized: call MPI.Init() first"),
        ("""
         from mpi4py import MPI
         import numpy as np, ringmpi
         x = np.ones(2)
         for _ in range(3):  # remembered, then repeated from C
             ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, MPI.COMM_WORLD)
         assert (x == 1).all()
         MPI.Finalize()
         ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, MPI.COMM_WORLD)
         """,
         "ringmpi.RingMPIError: MPI is finalized: no MPI call, ringmpi's included, may follow "
         "MPI.Finalize()"),
        ("""
         from mpi4py import MPI
         import numpy as np, ringmpi
         MPI.Finalize()
         ringmpi.Reduce_scatter_block(np.ones(2), np.empty(2))
         """,
         "ringmpi.RingMPIError: MPI is finalized"),
    ],
    ids=["before-init", "after-finalize-repeated", "after-finalize-halves"],
)  # fmt: skip
def test_a_call_while_mpi_is_not_running_raises(code, says):
    p = _python(code)
    assert p.returncode == 1, p.stderr
    assert p.stderr.rstrip().splitlines()[-1].startswith(says), p.stderr
