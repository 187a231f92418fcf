"""allreduce_many's plan (no MPI): which arrays share a bucket, in which order."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from ringmpi import buckets
from ringmpi.tools.buckets import _collectives


def layout(arrays, bucket_bytes, op=MPI.SUM):
    """The plan as [(dtype, [member indices], packed?)] in the order of the collectives."""
    plan = buckets._make_plan([np.asarray(a) for a in arrays], op, bucket_bytes, "auto", False)
    return [
        (
            (b.work.dtype.name if b.work is not None else None),
            [i for i, _ in b.members],
            b.work is not None,
        )
        for b in plan.buckets
    ]


def f4(n):
    return np.zeros(n, np.float32)


def test_packs_in_list_order_until_the_next_does_not_fit():
    # 40 + 40 = 80 bytes fit in 100; the third (40) would make 120: a new bucket.
    assert layout([f4(10), f4(10), f4(10), f4(10)], 100) == [
        ("float32", [0, 1], True),
        ("float32", [2, 3], True),
    ]


def test_exactly_full_bucket():
    assert layout([f4(5), f4(5), f4(1)], 40) == [
        ("float32", [0, 1], True),
        ("float32", [2], True),
    ]


def test_large_arrays_are_reduced_alone_in_place():
    # 25 floats = 100 bytes >= bucket_bytes: its own collective, before the packed ones.
    assert layout([f4(2), f4(25), f4(3)], 100) == [
        (None, [1], False),
        ("float32", [0, 2], True),
    ]


def test_dtypes_in_order_of_first_appearance():
    arrays = [np.zeros(3, np.int64), f4(2), np.zeros(4, np.int64), np.zeros((2, 2), np.float32)]
    assert layout(arrays, 1 << 20) == [("int64", [0, 2], True), ("float32", [1, 3], True)]


def test_empty_arrays_take_no_part():
    assert layout([f4(0), np.zeros((3, 0)), f4(2)], 1 << 20) == [("float32", [2], True)]
    assert layout([], 1 << 20) == []


def test_members_are_views_of_one_buffer_per_dtype_in_place_order():
    arrays = [np.zeros((2, 3), np.float64), np.zeros(5), np.zeros((4,), np.float64)]
    plan = buckets._make_plan(arrays, MPI.SUM, 80, "auto", False)  # 48 + 40 > 80
    first, second = plan.buckets
    assert [(i, v.shape) for i, v in first.members] == [(0, (2, 3))]
    assert [(i, v.shape) for i, v in second.members] == [(1, (5,)), (2, (4,))]
    # Buckets of a dtype share one buffer, as large as the largest bucket (9 elements).
    assert first.work.base is second.work.base
    assert first.work.base.size == 9
    assert np.shares_memory(second.members[1][1], second.work[5:9])


def test_the_digest_depends_on_everything_the_ranks_must_agree_on():
    base = ([f4(3), np.zeros((2, 2))], MPI.SUM, 1 << 20, "auto", False)

    def digest(arrays, op, bucket_bytes, algorithm, ordered):
        return buckets._make_plan(arrays, op, bucket_bytes, algorithm, ordered).digest

    first = digest(*base)
    assert first == digest([f4(3), np.zeros((2, 2))], MPI.SUM, 1 << 20, "auto", False)
    assert 0 < first < 2**63
    others = [
        ([f4(4), np.zeros((2, 2))], *base[1:]),
        ([f4(3), np.zeros((4,))], *base[1:]),  # same count, other shape
        ([f4(3), np.zeros((2, 2), np.float32)], *base[1:]),
        ([np.zeros((2, 2)), f4(3)], *base[1:]),  # other order
        (base[0], MPI.MAX, *base[2:]),
        (base[0], MPI.SUM, 1 << 21, "auto", False),
        (base[0], MPI.SUM, 1 << 20, "ring", False),
        (base[0], MPI.SUM, 1 << 20, "auto", True),
    ]
    digests = [digest(*o) for o in others]
    assert first not in digests
    assert len(set(digests)) == len(digests)


def test_differences_names_the_first_field_that_differs():
    sig = (((3,), "float32"), ((2, 2), "float64")), "sum", 1024, "auto", False
    other = (((3,), "float32"), ((4,), "float64")), "sum", 1024, "auto", False
    said = buckets._differences([(sig, None), (other, None), (other, None)])
    assert said == (
        "ranks disagree on arrays[1] (shape, dtype): rank 0 ((2, 2), 'float64'); "
        "ranks 1,2 ((4,), 'float64')"
    )
    fewer = (sig[0][:1], *sig[1:])
    assert buckets._differences([(sig, None), (fewer, None)]) == (
        "ranks disagree on the number of arrays: rank 0 2; rank 1 1"
    )
    maxed = (sig[0], "max", *sig[2:])
    assert buckets._differences([(sig, None), (maxed, None)]) == (
        "ranks disagree on op: rank 0 'sum'; rank 1 'max'"
    )
    assert buckets._differences([(sig, None), (None, "ValueError('x')")]) == (
        "rank 1 raised ValueError('x') (no rank sent anything)"
    )


@pytest.mark.parametrize("nbytes", [[1], [3, 5, 7], [100, 1, 99], [50] * 9, [200, 200, 1]])
@pytest.mark.parametrize("bucket_bytes", [4, 100, 1000])
def test_the_benchmark_counts_the_collectives_of_the_plan(nbytes, bucket_bytes):
    arrays = [np.zeros(n, np.uint8) for n in nbytes]
    assert _collectives(nbytes, 1, bucket_bytes) == len(layout(arrays, bucket_bytes))
