"""GPU leases (memopt.runtime.lease) with fake GPU ids: concurrent jobs get distinct GPUs, a killed job's
GPU is free again, a job that finds none free waits instead of sharing."""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memopt.runtime import lease

SRC = Path(__file__).resolve().parents[1] / "src"
# A job: lease a GPU, report it (and what CUDA_VISIBLE_DEVICES says), hold it until told to stop.
HOLDER = """
import json, sys, time
from pathlib import Path
from memopt.runtime.lease import gpu_lease
with gpu_lease(progress=lambda m: print(m, file=sys.stderr, flush=True), poll_s=0.05) as gpu:
    import os
    print(json.dumps({"gpu": gpu.key, "visible": os.environ["CUDA_VISIBLE_DEVICES"],
                      "index": os.environ["MEMOPT_GPU_INDEX"]}), flush=True)
    stop = Path(sys.argv[1])
    while not stop.exists():
        time.sleep(0.02)
"""


@pytest.fixture
def fake_env(tmp_path):
    def env(gpus: str) -> dict:
        return dict(
            os.environ,
            PYTHONPATH=str(SRC),
            MEMOPT_FAKE_GPUS=gpus,
            MEMOPT_GPU_LOCK_DIR=str(tmp_path / "locks"),
        )

    return env


def start(env: dict, stop: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(stop)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def line(stream, timeout: float = 60.0) -> str:
    """The stream's next line, or a failure (not a hang) when none comes within `timeout`."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    assert sel.select(timeout), f"nothing within {timeout} s"
    return stream.readline()


def leased(proc: subprocess.Popen) -> dict:
    return json.loads(line(proc.stdout))


@pytest.fixture
def holders(tmp_path):
    """Start holder processes; whatever happens, they are told to stop and killed at the end."""
    stop, procs = tmp_path / "stop", []

    def spawn(env: dict) -> subprocess.Popen:
        procs.append(start(env, stop))
        return procs[-1]

    yield spawn, stop
    stop.touch()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        p.kill()


def test_concurrent_jobs_get_distinct_gpus(fake_env, holders):
    spawn, stop = holders
    procs = [spawn(fake_env("0,1,2,3")) for _ in range(4)]
    got = [leased(p) for p in procs]
    assert sorted(g["gpu"] for g in got) == ["0", "1", "2", "3"]
    assert all(g["visible"] == g["gpu"] == g["index"] for g in got)  # pinned to it alone
    stop.touch()
    assert [p.wait(30) for p in procs] == [0, 0, 0, 0]


def test_a_killed_job_frees_its_gpu_and_a_job_without_one_waits(fake_env, holders):
    spawn, stop = holders
    first = spawn(fake_env("only"))
    assert leased(first)["gpu"] == "only"
    second = spawn(fake_env("only"))
    assert "are leased; waiting for one" in line(second.stderr)
    time.sleep(1.0)  # it polls every 50 ms: it would have leased by now if it could
    sel = selectors.DefaultSelector()
    sel.register(second.stdout, selectors.EVENT_READ)
    assert second.poll() is None and not sel.select(timeout=0)  # no lease: it waits
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert leased(second)["gpu"] == "only"  # the OS dropped the dead job's lock
    stop.touch()
    assert second.wait(30) == 0


def test_lease_restores_the_environment_and_no_gpu_means_no_lease(monkeypatch, tmp_path):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(lease.FAKE_ENV, "a,b")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "a,b")
    with lease.gpu_lease() as first, lease.gpu_lease() as second:
        assert (first.key, second.key) == ("a", "b")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "b"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "a,b"
    assert lease.LEASE_ENV not in os.environ
    monkeypatch.setenv(lease.FAKE_ENV, "")
    with lease.gpu_lease() as none:
        assert none is None


def test_a_gpu_with_a_uuid_is_pinned_by_its_uuid(monkeypatch, tmp_path):
    """nvidia-smi numbers GPUs in PCI order, CUDA by speed: the job is pinned by UUID."""
    monkeypatch.delenv(lease.FAKE_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(lease, "_host_gpus", lambda: [("0", "GPU-aaa"), ("1", "GPU-bbb")])
    with lease.gpu_lease() as gpu:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-aaa" and gpu.index == "0"
        assert os.environ[lease.INDEX_ENV] == "0" and os.environ[lease.LEASE_ENV] == "GPU-aaa"
    monkeypatch.setattr(lease, "_host_gpus", lambda: [])  # no nvidia-smi: a warning, no lease
    said = []
    with lease.gpu_lease(progress=said.append, require=True) as gpu:
        assert gpu is None and "without a GPU lease" in said[0]


def test_candidates_follow_cuda_visible_devices(monkeypatch):
    """Indices map to the host's UUIDs (the lock's key: a SLURM job's index 0 is not another's);
    a UUID is kept; CUDA's rule: the list ends at the first invalid entry."""
    monkeypatch.delenv(lease.FAKE_ENV, raising=False)
    host = [("0", "GPU-aaa"), ("1", "GPU-bbb"), ("2", "GPU-ccc")]
    monkeypatch.setattr(lease, "_host_gpus", lambda: host)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.key for g in lease.candidates()] == ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaa,-1,1")
    got = lease.candidates()
    assert [(g.visible, g.key, g.index) for g in got] == [
        ("2", "GPU-ccc", "2"),
        ("GPU-aaa", "GPU-aaa", "0"),
    ]


def test_a_cell_refuses_a_search_from_another_gpu_model(tmp_path):
    """The batch a cell trains comes from a search (its own for `max`, the baseline's for `same`):
    from another GPU model it is refused unless mixed_gpus: allow."""
    from memopt.errors import MemoptError
    from memopt.jobs.pipeline import check_same_gpu_model
    from memopt.report.results import write_json

    h100 = tmp_path / "flash.json"
    write_json(h100, {"max_batch": 117, "provenance": {"gpu": "NVIDIA H100 80GB HBM3"}})
    cpu, old = tmp_path / "baseline.json", tmp_path / "old.json"
    write_json(cpu, {"max_batch": 50, "provenance": {"gpu": None}})
    write_json(old, {"max_batch": 50})  # searched before provenance was recorded
    with pytest.raises(MemoptError, match=r"flash.json was searched on NVIDIA H100.*a CPU.*allow"):
        check_same_gpu_model([h100], "cpu")
    check_same_gpu_model([cpu, old, tmp_path / "missing.json"], "cpu")  # same model: fine
