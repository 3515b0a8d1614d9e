"""Issue 31, finding 4, without Snakemake: a job stops when the Snakemake process above it dies
(killed alone, even while its parent has not reaped it), killing what the job started; `memopt
unlock` refuses while a job of the folder still runs. (tests/test_rebuild.py does the same to the
smoke study through Snakemake.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from memopt.run import processes

SRC = Path(__file__).resolve().parents[1] / "src"
JOB = """
import subprocess, sys, time
from memopt.run.processes import stop_with_snakemake
owner = stop_with_snakemake(poll_s=0.1)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a launch
open(sys.argv[1], "w").write(f"{owner[0] if owner else 0} {child.pid}")
time.sleep(600)
"""


def alive(pid: int) -> bool:
    return processes._stat(pid) is not None  # a zombie is dead


def test_a_job_stops_when_its_snakemake_is_killed_alone(tmp_path):
    fake = tmp_path / "snakemake"  # what Snakemake's console script is called
    fake.write_text(
        "import subprocess, sys, time\nsubprocess.Popen(sys.argv[1:])\ntime.sleep(600)\n"
    )
    (tmp_path / "job.py").write_text(JOB)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    pids = tmp_path / "pids"
    snakemake = subprocess.Popen(
        [sys.executable, str(fake), sys.executable, str(tmp_path / "job.py"), str(pids)], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()):
            assert time.monotonic() < deadline and snakemake.poll() is None
            time.sleep(0.05)
        owner, child = map(int, pids.read_text().split())
        assert owner == snakemake.pid  # found by its command line, above the job
        job = next(p for p in processes.descendants(snakemake.pid) if p != child)
        os.kill(snakemake.pid, signal.SIGKILL)  # and not reaped yet: a zombie until wait()
        time.sleep(0.3)
        assert not alive(snakemake.pid)
        deadline = time.monotonic() + 5
        while (alive(job) or alive(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(job) and not alive(child)
    finally:
        snakemake.kill()
        snakemake.wait()


def test_without_snakemake_above_nothing_is_watched():
    assert processes.snakemake_ancestor() is None  # pytest is not started by Snakemake
    assert processes.is_snakemake(["/venv/bin/python3", "-m", "snakemake", "--cores", "2"])
    assert processes.is_snakemake(["/venv/bin/python3", "/venv/bin/snakemake", "-n"])
    assert not processes.is_snakemake(["/venv/bin/python3", "/x/.snakemake/scripts/tmp.cell.py"])


def test_memopt_unlock_refuses_while_a_job_runs_in_the_folder(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("")
    script = tmp_path / ".snakemake" / "scripts" / "tmpabc123.search.py"
    script.parent.mkdir()
    script.write_text("import time; time.sleep(600)\n")
    job = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    unlock = [sys.executable, "-m", "memopt.run.cli", "unlock", "--wait", "1"]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    try:
        proc = subprocess.run(unlock, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert proc.returncode == 1
        assert f"pid {job.pid}: {sys.executable} {script}" in proc.stderr
        assert "Traceback" not in proc.stderr and (locks / "0.input.lock").exists()
    finally:
        job.kill()
        job.wait()
    proc = subprocess.run(unlock, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "removed the Snakemake lock" in proc.stdout
    assert not (locks / "0.input.lock").exists()
    proc = subprocess.run(unlock, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert "nothing to unlock" in proc.stdout


def test_memopt_unlock_refuses_while_a_slurm_job_of_the_folder_runs(tmp_path, monkeypatch):
    """On a cluster the jobs run elsewhere: a login node's Snakemake killed with -9 leaves them
    queued or running, and squeue shows them by working folder and Snakemake's comment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    study = tmp_path / "study"
    (study / ".snakemake" / "locks").mkdir(parents=True)
    (study / ".snakemake" / "locks" / "0.input.lock").write_text("")
    squeue = bin_dir / "squeue"
    squeue.write_text(
        "#!/bin/sh\n"
        f"echo '101|{study}|rule_search_wildcards_flash'\n"
        f"echo '102|{tmp_path}|rule_cell_wildcards_flash_max'\n"  # another folder
        f"echo '103|{study}|an interactive job'\n"  # not Snakemake's
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert processes.slurm_jobs(study) == [("101", "rule_search_wildcards_flash")]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    unlock = [sys.executable, "-m", "memopt.run.cli", "unlock", "--wait", "0"]
    proc = subprocess.run(unlock, cwd=study, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "SLURM job 101: rule_search_wildcards_flash" in proc.stderr
    # (not bare "102": the temporary folder's name may hold it, e.g. pytest-103)
    assert "SLURM job 102" not in proc.stderr and "SLURM job 103" not in proc.stderr
    squeue.write_text("#!/bin/sh\n")
    proc = subprocess.run(unlock, cwd=study, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "removed the Snakemake lock" in proc.stdout
