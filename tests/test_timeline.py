"""python -m ringmpi trace under mpirun (this file itself runs without MPI): every
plan row of the traced call appears once per rank, in order, with what it sent."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from ringmpi.tools import reliability, timeline

# They start mpirun; what they check (the tool's output, the example's training) is
# ringmpi's own, so they run under MPICH only (the MPI suite checks each family).

PY = sys.executable


def trace(nranks: int, tmp_path, *args: str) -> tuple[dict, dict]:
    try:
        launcher = reliability.mpirun()
    except FileNotFoundError:
        pytest.skip("no mpirun")
    spans, events, png = tmp_path / "spans.json", tmp_path / "chrome.json", tmp_path / "t.png"
    cmd = [*launcher, "-n", str(nranks), PY, "-m", "ringmpi", "trace", *args, "--json",
           str(spans), "--chrome", str(events), "--plot", str(png)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "wrong elements 0" in p.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(spans.read_text()), json.loads(events.read_text())


def _steps(mine: list[dict]) -> list[tuple[str, int]]:
    return [(s["phase"], s["step"]) for s in mine]


def test_the_ring_at_three_ranks(tmp_path):
    # 3 ranks of 3 KiB float32: 2 reduce-scatter then 2 all-gather rows on every
    # rank, each sending one chunk of 1 KiB to the next rank, one after the other
    spans, events = trace(3, tmp_path, "-a", "ring", "-b", "3K")
    for rank, mine in enumerate(spans["spans"]):
        assert _steps(mine) == [("reduce-scatter", 0), ("reduce-scatter", 1),
                                ("all-gather", 0), ("all-gather", 1)]  # fmt: skip
        assert {(s["sent_to"], s["received_from"]) for s in mine} == {
            ((rank + 1) % 3, (rank - 1) % 3)
        }
        assert [s["nbytes"] for s in mine] == [1024] * 4
        assert all(0 <= s["start"] <= s["end"] for s in mine)
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(mine))  # in order
        assert all(s["reducing"] > 0 for s in mine[:2]) and all(
            s["reducing"] == 0 for s in mine[2:]
        )
    steps = [e for e in events["traceEvents"] if e["ph"] == "X" and e["cat"] != "reduce"]
    assert sorted((e["tid"], e["name"]) for e in steps) == sorted(
        (r, f"{p} {k}") for r in range(3) for p in ("reduce-scatter", "all-gather") for k in (0, 1)
    )
    reduces = [e for e in events["traceEvents"] if e.get("cat") == "reduce"]
    assert len(reduces) == 3 * 2  # the reduce-scatter's rows


def test_rabenseifner_and_hierarchical(tmp_path):
    spans, _ = trace(4, tmp_path, "-a", "rabenseifner", "-b", "4K")
    for mine in spans["spans"]:  # halving 2 KiB then 1 KiB, doubling 1 KiB then 2 KiB
        assert _steps(mine) == [("reduce-scatter", 0), ("reduce-scatter", 1),
                                ("all-gather", 0), ("all-gather", 1)]  # fmt: skip
        assert [s["nbytes"] for s in mine] == [2048, 1024, 1024, 2048]
    # two nodes of 2: the node's reduce-scatter through shared memory, a rail
    # across the nodes (one swap of its 2 KiB slice), the node's all-gather
    spans, _ = trace(4, tmp_path, "-a", "hierarchical", "-b", "4K", "--ranks-per-node", "2")
    for mine in spans["spans"]:
        assert (mine[0]["phase"], mine[-1]["phase"]) == ("node reduce-scatter", "node all-gather")
        rails = [s for s in mine if not s["shared"]]
        assert rails and all(s["phase"].startswith("inter-node slice") for s in rails)
        assert sum(s["nbytes"] for s in rails) == 2048
        assert all(s["shared"] for s in (mine[0], mine[-1]))


def test_chrome_events_from_spans():
    spans = [[{"algorithm": "ring", "phase": "reduce-scatter", "step": 0, "start": 1000,
               "end": 3000, "sent_to": 1, "nbytes": 8, "received_from": 1, "reducing": 500,
               "shared": False, "call": 0}], []]  # fmt: skip
    got = timeline.chrome(spans, "t")["traceEvents"]
    x = [e for e in got if e["ph"] == "X"]
    assert x[0] == {"ph": "X", "name": "reduce-scatter 0", "cat": "reduce-scatter", "pid": 0,
                    "tid": 0, "ts": 1.0, "dur": 2.0,
                    "args": {"algorithm": "ring", "bytes sent": 8, "to": 1, "from": 1}}  # fmt: skip
    assert x[1] == {"ph": "X", "name": "reduce", "cat": "reduce", "pid": 0, "tid": 0,
                    "ts": 2.5, "dur": 0.5}  # fmt: skip
    assert [e["args"]["name"] for e in got if e["ph"] == "M"] == ["t", "rank 0", "rank 1"]
