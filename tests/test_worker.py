"""The warm worker (memopt.run.worker): jobs run in one long-lived process, give what a fresh process
gives, report user errors like one, never leave output behind a client that went away, and make
way for a new worker when the code changes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memopt.run import worker

SRC = Path(__file__).resolve().parents[1] / "src"


# Warm worker processes started, killed and idled out: integration, in the slow suite.
pytestmark = pytest.mark.slow


@pytest.fixture
def study(tiny_study, tmp_path, monkeypatch):
    """The tiny study in tmp_path, which is also its own worker's (the socket is per directory)."""
    cfg, _ = tiny_study
    cfg = cfg | {
        "measure": {**cfg["measure"], "min_timed_steps": 3, "max_timed_steps": 5},
        "quality": {**cfg["quality"], "tokens": 4096, "batch": 8},
    }
    monkeypatch.chdir(tmp_path)
    yield cfg, tmp_path
    hello = worker._exchange(worker.socket_path(), {"op": "hello"})
    if hello is not None:
        worker._exchange(worker.socket_path(), {"op": "exit"})
        worker._wait_gone(hello["pid"])


def quality_args(cfg, tokens, out, seed=1234):
    return dict(cfg=cfg, function="fp32", seed=seed, tokens_dir=str(tokens), out=str(out))


ON = {"enabled": True, "idle_s": 30}
OFF = {"enabled": False, "idle_s": 30}


def worker_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("[memopt worker")]


def test_jobs_share_one_warm_process_and_match_a_fresh_one(study, tmp_path, capsys):
    cfg, tokens = study
    for name in ("a", "b"):
        worker.run_job(ON, "quality_file", quality_args(cfg, tokens, f"{name}.json"), f"{name}.log")
    worker.run_job(OFF, "quality_file", quality_args(cfg, tokens, "here.json"), "here.log")
    first, second = worker_lines(Path("a.log")), worker_lines(Path("b.log"))
    assert "job 1 since" in first[0] and "job 2 since" in second[0]
    assert first[0].split(":")[0] == second[0].split(":")[0]  # the same pid
    assert worker_lines(Path("here.log")) == []
    # The relayed log reached the job's stdout (Snakemake shows it): the run's own progress line.
    assert "[quality fp32 seed 1234] 16 steps at batch 8" in capsys.readouterr().out
    runs = [json.loads(Path(f"{n}.json").read_text()) for n in ("a", "b", "here")]
    for run in runs:
        run.pop("provenance"), run.pop("train_s"), run.pop("eval_s"), run.pop("wall_s")
    assert runs[0]["status"] == "ok" and runs[0]["loss_curve"]
    assert runs[0] == runs[1] == runs[2]  # a warm worker changes nothing that is measured


def test_a_user_error_in_the_worker_is_its_message_alone(study, capsys):
    cfg, tokens = study
    args = dict(cfg=cfg, technique="baseline", entry="max", tokens_dir=str(tokens),
                search_dir="nowhere", out="cell.json")  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        worker.run_job(ON, "cell_file", args, "cell.log")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "memopt: error: batch entry 'max' needs the search result" in err
    assert "Traceback" not in err and not Path("cell.json").exists()
    # The worker survives a user's mistake and takes the next job.
    worker.run_job(ON, "quality_file", quality_args(cfg, tokens, "q.json"), "q.log")
    assert "job 2 since" in worker_lines(Path("q.log"))[0]


def test_changed_code_replaces_the_worker(study, monkeypatch, capsys):
    cfg, tokens = study
    worker.run_job(ON, "quality_file", quality_args(cfg, tokens, "a.json"), "a.log")
    old = worker._exchange(worker.socket_path(), {"op": "hello"})
    monkeypatch.setattr(worker, "fingerprint", lambda conf: "edited-sources")
    worker.run_job(ON, "quality_file", quality_args(cfg, tokens, "b.json"), "b.log")
    assert "restarting the worker" in capsys.readouterr().out
    new = worker._exchange(worker.socket_path(), {"op": "hello"})
    assert new["pid"] != old["pid"] and new["fingerprint"] == "edited-sources"
    with pytest.raises(ProcessLookupError):
        os.kill(old["pid"], 0)  # gone before the new one took the device


def test_a_client_that_goes_away_leaves_no_output(study, tmp_path):
    cfg, tokens = study
    cfg = {**cfg, "quality": {**cfg["quality"], "tokens": 40_000 * 50}}  # minutes on a CPU
    code = (
        "import json, sys; from memopt.run.worker import run_job; run_job(*json.loads(sys.argv[1]))"
    )
    args = json.dumps([ON, "quality_file", quality_args(cfg, tokens, "long.json"), "long.log"])
    env = dict(os.environ, PYTHONPATH=str(SRC))
    client = subprocess.Popen([sys.executable, "-c", code, args], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while "step/s" not in (Path("long.log").read_text() if Path("long.log").exists() else ""):
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.2)
    pid = int(worker_lines(Path("long.log"))[0].split("pid ")[1].split(":")[0])
    client.send_signal(signal.SIGKILL)  # what a killed Snakemake job does to its script
    client.wait()
    worker._wait_gone(pid, seconds=30)
    assert not Path("long.json").exists()
    # The next job gets a new worker.
    worker.run_job(
        ON,
        "quality_file",
        quality_args(cfg | {"quality": study[0]["quality"]}, tokens, "q.json"),
        "q.log",
    )
    assert "job 1 since" in worker_lines(Path("q.log"))[0]


def test_the_worker_idles_out(study):
    cfg, tokens = study
    worker.run_job({"enabled": True, "idle_s": 1}, "quality_file",
                   quality_args(cfg, tokens, "q.json"), "q.log")  # fmt: skip
    pid = worker._exchange(worker.socket_path(), {"op": "hello"})["pid"]
    worker._wait_gone(pid, seconds=30)
    assert not worker.socket_path().exists()


def test_the_next_job_compiles_as_a_fresh_process_would():
    """A search's trials leave a dynamic-batch graph; the next job must not run it."""
    import torch
    from torch._dynamo.utils import counters

    double = torch.compile(lambda x: x * 2, backend="eager")
    for n in (2, 3):  # a second size makes the size dynamic
        double(torch.ones(n))
    counters.clear()
    double(torch.ones(4))
    assert counters["stats"]["unique_graphs"] == 0  # reused: what a warm process would do
    worker._restore(worker._process_state())
    counters.clear()
    double(torch.ones(4))
    assert counters["stats"]["unique_graphs"] == 1  # compiled anew, as in a fresh process


def test_between_jobs_the_worker_undoes_what_knobs_and_jobs_change(tmp_path):
    """Each knob's process-wide effect is undone as the registry says (memopt.knobs: undo), and
    so is what every job changes: the environment, the folder, kept weights, the job's start."""
    import torch

    from memopt.runtime import measure, model, precision, techniques

    before = worker._process_state()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    precision.set_precision_flags("fp32" if tf32 else "tf32")  # a job's technique flips it
    techniques.set_compile_memory_budget(0.3)
    os.environ["MEMOPT_TEST_JOB_SETTING"] = "1"
    model._INITIAL[("a model",)] = {}
    measure.mark_job_started(123.0)
    os.chdir(tmp_path)
    worker._restore(before)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32
    assert torch._functorch.config.activation_memory_budget == 1.0
    assert "MEMOPT_TEST_JOB_SETTING" not in os.environ and os.getcwd() == before["cwd"]
    assert not model._INITIAL and measure._job_started == [None]
