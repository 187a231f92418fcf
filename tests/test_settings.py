"""Settings: one snapshot read from RINGMPI_* once, changed from code by configure."""

from __future__ import annotations

import dataclasses

import numba
import pytest

import ringmpi
from ringmpi import _host, _settings
from ringmpi._settings import Settings


def test_every_field_has_its_variable_and_the_defaults_are_unset():
    env = {Settings.variable(f.name): "" for f in dataclasses.fields(Settings)}
    assert sorted(env) == sorted(
        ["RINGMPI_ALGORITHM", "RINGMPI_TUNING", "RINGMPI_RANKS_PER_NODE",
         "RINGMPI_NODE_PLACEMENT", "RINGMPI_VALIDATE", "RINGMPI_SEGMENT_BYTES",
         "RINGMPI_WINDOW_STORES", "RINGMPI_PIECE_BYTES", "RINGMPI_ACROSS", "RINGMPI_TIMEOUT",
         "RINGMPI_REPRODUCIBLE", "RINGMPI_WAIT", "RINGMPI_OVERSUBSCRIBED", "RINGMPI_PROGRESS",
         "RINGMPI_TUNER",
         "RINGMPI_RETUNE_DAYS", "RINGMPI_SPACING", "RINGMPI_THREADS"]
    )  # fmt: skip
    empty, none = Settings.from_environ(env), Settings.from_environ({})
    for f in dataclasses.fields(Settings):
        assert getattr(empty, f.name) == getattr(none, f.name) == f.default, f.name


@pytest.mark.parametrize(("value", "spacing"), [("auto", None), (" 12 ", 12), ("0", 0), (7, 7)])
def test_the_spacing_is_auto_or_a_number_of_calls(value, spacing):
    assert Settings().changed(spacing=value).spacing == spacing
    assert Settings.from_environ({"RINGMPI_SPACING": str(value)}).spacing == spacing


@pytest.mark.parametrize("value", ["-1", "many", 2.5, True])
def test_a_bad_spacing_is_named(value):
    with pytest.raises(ValueError, match=r"spacing must be auto or a whole number of calls >= 0"):
        Settings().changed(spacing=value)


@pytest.mark.parametrize(("value", "threads"), [("auto", None), (" 2 ", 2), (1, 1), ("", None)])
def test_threads_are_auto_or_a_number(monkeypatch, value, threads):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 4)
    assert Settings().changed(threads=value).threads == threads
    assert Settings.from_environ({"RINGMPI_THREADS": str(value)}).threads == threads


@pytest.mark.parametrize("value", ["0", "-2", "many", 2.5, True])
def test_bad_threads_are_named(value):
    with pytest.raises(ValueError, match=r"threads must be auto or a whole number of threads >= 1"):
        Settings().changed(threads=value)


def test_more_threads_than_numbas_pool_are_named(monkeypatch):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    with pytest.raises(ValueError, match=r"RINGMPI_THREADS=3 is more than Numba's thread pool "
                                         r"holds \(NUMBA_NUM_THREADS=2\): set NUMBA_NUM_THREADS "
                                         r"to 3 or more"):  # fmt: skip
        Settings.from_environ({"RINGMPI_THREADS": "3"})


@pytest.mark.parametrize(("masks", "shares"), [
    ([{0, 1, 2, 3}] * 2, [2, 2]),  # unbound: the node's cores split
    ([{0, 1, 2, 3}] * 3, [1, 1, 1]),  # 4/3 each, rounded down
    ([{0, 1}, {2, 3, 4, 5}], [2, 4]),  # bound: each its own
    ([{0, 1, 2, 3}, {2, 3}], [3, 1]),  # overlapping: a shared core counts half to each
    ([{0}] * 4, [1, 1, 1, 1]),  # crowded: at least one
])  # fmt: skip
def test_a_ranks_share_of_the_cores_comes_from_the_affinity_masks(masks, shares):
    frozen = [frozenset(m) for m in masks]
    assert [_host.cores_share(frozen, r) for r in range(len(masks))] == shares
    assert _host.threads(None, 3) == min(3, numba.config.NUMBA_NUM_THREADS)
    assert _host.threads(1, 8) == 1


def test_values_are_parsed_from_the_environment():
    s = Settings.from_environ({
        "RINGMPI_TIMEOUT": " 2.5 ", "RINGMPI_SEGMENT_BYTES": "4096", "RINGMPI_VALIDATE": "1",
        "RINGMPI_REPRODUCIBLE": "0", "RINGMPI_NODE_PLACEMENT": "cyclic", "RINGMPI_WAIT": "sleep",
        "RINGMPI_ALGORITHM": "ring", "OTHER": "x",
    })  # fmt: skip
    assert (s.timeout, s.segment_bytes, s.validate, s.reproducible) == (2.5, 4096, True, False)
    assert (s.node_placement, s.wait, s.algorithm) == ("cyclic", "sleep", "ring")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [("RINGMPI_SEGMENT_BYTES", "lots", "RINGMPI_SEGMENT_BYTES must be a whole number >= 1"),
     ("RINGMPI_RANKS_PER_NODE", "0", "RINGMPI_RANKS_PER_NODE must be a whole number >= 1"),
     ("RINGMPI_TIMEOUT", "-1", "RINGMPI_TIMEOUT must be a number of seconds >= 0"),
     ("RINGMPI_TIMEOUT", "inf", "RINGMPI_TIMEOUT must be a number of seconds >= 0"),
     ("RINGMPI_WAIT", "fast", "RINGMPI_WAIT must be auto, spin or sleep, not 'fast'"),
     ("RINGMPI_WINDOW_STORES", "x", "RINGMPI_WINDOW_STORES must be auto, cached or streaming")],
)  # fmt: skip
def test_a_bad_value_names_its_variable(name, value, says):
    with pytest.raises(ValueError, match=says):
        Settings.from_environ({name: value})


def test_configure_checks_changes_and_configured_restores():
    before = _settings.current()
    with ringmpi.configured(timeout="3", segment_bytes=1 << 16) as now:
        assert _settings.current() is now and now is not before
        assert (now.timeout, now.segment_bytes) == (3.0, 1 << 16)
        ringmpi.configure(segment_bytes=None)  # back to the default
        assert _settings.current().segment_bytes is None
        assert _settings.current().timeout == 3.0
    assert _settings.current() is before
    with pytest.raises(ValueError, match="ranks_per_node must be a whole number >= 1"):
        ringmpi.configure(ranks_per_node=0)
    with pytest.raises(TypeError, match="unknown setting 'segments'"):
        ringmpi.configure(segments=4)
    with pytest.raises(TypeError, match="timeout must be a number of seconds or None"):
        ringmpi.configure(timeout=[1])
    assert _settings.current() is before  # a failed change changes nothing


def test_the_tuner_settings_parse_and_refuse_what_they_cannot_mean():
    s = Settings.from_environ({"RINGMPI_TUNER": " /tmp/x ", "RINGMPI_RETUNE_DAYS": "0.5"})
    assert (s.tuner, s.retune_days) == ("/tmp/x", 0.5)
    assert (Settings().tuner, Settings().retune_days) == ("auto", 30.0)
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(ValueError, match="RINGMPI_RETUNE_DAYS must be a number of days"):
            Settings.from_environ({"RINGMPI_RETUNE_DAYS": bad})
