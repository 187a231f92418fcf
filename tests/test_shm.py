"""python -m ringmpi shm: stale segments are those no live process maps or holds open."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys

from ringmpi.tools import shm


def test_only_segments_no_process_uses_are_stale(tmp_path):
    for name in ("mpich_shm_left", "mpich_shm_held", "mpich_shm_mapped"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    before = {"mpich_shm_left"}  # there before the "job"
    (tmp_path / "mpich_shm_new").write_bytes(b"\0" * 4096)
    code = (
        "import mmap, sys, time\n"
        f"held = open({str(tmp_path / 'mpich_shm_held')!r}, 'rb')\n"
        f"f = open({str(tmp_path / 'mpich_shm_mapped')!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096); f.close()\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert shm.in_use(tmp_path) >= {"mpich_shm_held", "mpich_shm_mapped"}
        assert shm.stale(tmp_path) == ["mpich_shm_left", "mpich_shm_new"]
        assert shm.remove_new(before | {"mpich_shm_held", "mpich_shm_mapped"}, tmp_path) == [
            "mpich_shm_new"
        ]
        assert shm.names(tmp_path) == {"mpich_shm_left", "mpich_shm_held", "mpich_shm_mapped"}
    finally:
        proc.kill()
        proc.wait()
    assert shm.stale(tmp_path) == [
        "mpich_shm_held",
        "mpich_shm_left",
        "mpich_shm_mapped",
    ]  # their process is gone


def test_swept_removes_what_a_killed_job_left(tmp_path):
    (tmp_path / "sm_segment.old").write_bytes(b"x")
    with shm.swept(tmp_path, linger=0.0) as gone:
        (tmp_path / "sm_segment.0").write_bytes(b"x")
        (tmp_path / "sm_segment.1").write_bytes(b"x")
        (tmp_path / "ringmpi-slurm-next-job-id").write_bytes(b"7")  # not an MPI segment
    assert sorted(gone) == ["sm_segment.0", "sm_segment.1"]
    assert shm.names(tmp_path) == {"sm_segment.old"}
    assert (tmp_path / "ringmpi-slurm-next-job-id").read_bytes() == b"7"


def test_the_command_lists_removes_and_checks(tmp_path, capsys):
    (tmp_path / "mpich_shm_1").write_bytes(b"x")
    snap = tmp_path.parent / f"{tmp_path.name}.json"
    assert shm.main(["--dir", str(tmp_path), "--snapshot", str(snap)]) == 0
    assert json.loads(snap.read_text()) == ["mpich_shm_1"]
    assert shm.main(["--dir", str(tmp_path), "--since", str(snap)]) == 0
    (tmp_path / "mpich_shm_2").write_bytes(b"x")
    assert shm.main(["--dir", str(tmp_path), "--since", str(snap)]) == 1
    assert "1 stale segment(s) appeared" in capsys.readouterr().out
    assert shm.main(["--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("stale ") == 2
    assert shm.main(["--dir", str(tmp_path), "--remove"]) == 0
    assert shm.names(tmp_path) == set()
    assert shm.main(["--dir", str(tmp_path)]) == 0
    assert "no stale segment" in capsys.readouterr().out


def test_own_leaves_aside_only_this_process(tmp_path):
    # a singleton's segment at its end: mapped by this process alone
    (tmp_path / "sm_segment.vm.0.1.0").write_bytes(b"\0" * 4096)
    with open(tmp_path / "sm_segment.vm.0.1.0", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)
    try:
        assert shm.stale(tmp_path) == []
        assert shm.stale(tmp_path, but=os.getpid()) == ["sm_segment.vm.0.1.0"]
        with shm.swept(tmp_path, linger=0.0) as kept:
            (tmp_path / "sm_segment.vm.0.2.0").write_bytes(b"\0" * 4096)
            with open(tmp_path / "sm_segment.vm.0.2.0", "r+b") as f:
                second = mmap.mmap(f.fileno(), 4096)
        assert kept == [] and shm.names(tmp_path) == {"sm_segment.vm.0.1.0", "sm_segment.vm.0.2.0"}
        with shm.swept(tmp_path, linger=0.0, own=True) as gone:
            (tmp_path / "sm_segment.vm.0.3.0").write_bytes(b"\0" * 4096)
            with open(tmp_path / "sm_segment.vm.0.3.0", "r+b") as f:
                third = mmap.mmap(f.fileno(), 4096)
        # only what appeared in the block goes; the mapping itself stays valid
        assert gone == ["sm_segment.vm.0.3.0"]
        assert shm.names(tmp_path) == {"sm_segment.vm.0.1.0", "sm_segment.vm.0.2.0"}
        third[0] = 7
        assert third[0] == 7
        second.close()
        third.close()
    finally:
        mapped.close()
