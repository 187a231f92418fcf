"""How the hierarchical algorithm chooses its way of storing to the window (no mpirun needed)."""

from __future__ import annotations

import pytest

from ringmpi.algorithms.hierarchical import _RETRY, _TRIALS, _Choice


def _drive(times, calls: int) -> str:
    """Run `calls` calls through a _Choice; `times(way, call)` is what each one takes."""
    choice, ways = _Choice(), []
    for call in range(calls):
        way, timing = choice.next()
        ways.append(way[0])
        timing.append(times(way, call))
    return "".join(ways)


# The trials: a block of _TRIALS + 1 calls of each way, cached first.
BLOCKS = "c" * (_TRIALS + 1) + "s" * (_TRIALS + 1)


def test_trials_run_in_blocks_then_the_faster_way_stays():
    ways = _drive(lambda way, call: 1.0 if way == "streaming" else 3.0, 20)
    trials = 2 * (_TRIALS + 1)
    assert ways[:trials] == BLOCKS
    assert ways[trials:] == "s" * (20 - trials)


def test_the_first_call_of_each_way_is_not_counted():
    # The first cached call is very slow (a warm-up); cached is otherwise faster.
    ways = _drive(lambda way, call: (100.0 if call == 0 else 1.0) if way == "cached" else 2.0, 12)
    assert ways.endswith("cccc")


def test_a_way_is_timed_by_its_fastest_trial():
    # Cached is faster but one of its counted trials is slow (noise): still cached.
    ways = _drive(lambda way, call: (9.0 if call == 2 else 1.0) if way == "cached" else 2.0, 12)
    assert ways.endswith("cccc")


def test_the_trials_run_again_after_many_calls():
    # A steady machine: the trials repeat every _RETRY calls of the chosen way.
    trials = 2 * (_TRIALS + 1)
    ways = _drive(lambda way, call: 1.0 if way == "streaming" else 3.0, 2 * (trials + _RETRY))
    one = BLOCKS + "s" * _RETRY
    assert ways == one + one


@pytest.mark.parametrize("slower", [1.4, 5.0])
def test_a_way_that_slows_down_is_timed_again(slower):
    # Cached is chosen, then from call 12 on takes `slower` times as long: past 1.5x
    # the trials start over and streaming wins; below it, cached stays.
    def times(way, call):
        if way == "streaming":
            return 2.0
        return 1.0 * (slower if call >= 12 else 1.0)

    ways = _drive(times, 40)
    trials = 2 * (_TRIALS + 1)
    assert ways[trials:12] == "c" * (12 - trials)
    if slower > 1.5:
        again = 12 + _TRIALS // 2 + 1  # the median of the last calls is a slow one
        assert ways[12:again] == "c" * (again - 12)
        assert ways[again : again + trials] == BLOCKS
        assert ways[again + trials :] == "s" * (40 - again - trials)
    else:
        assert ways[12:] == "c" * 28
