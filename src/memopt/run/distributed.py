"""Training jobs of parallel techniques (memopt.runtime.parallel): torchrun starts one process per GPU the
job leased, each runs the same memopt.jobs.pipeline call on its own GPU, and rank 0 prints the progress
and writes the result.

The job's own process (memopt.run.worker.run_job) holds the lease on the GPUs and starts torchrun
(`python -m torch.distributed.run --standalone`: a free port on this host) with
CUDA_VISIBLE_DEVICES naming them; no warm worker serves such a job. A rank that fails (an error,
a fault, a kill) ends every rank (torchrun's agent stops the others) and the job fails with the
ranks' output in its log; nothing is written, so the next run redoes it. A rank that runs out of
memory records it like one GPU does: every rank runs the same shapes, so all of them do.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from memopt.errors import MemoptError, exit_on_user_error

SRC = Path(__file__).resolve().parents[2]
# Collectives wait at most this long for a rank that is gone or out of step (then the job fails
# instead of holding its GPUs forever); compiling a large graph stays well within it.
TIMEOUT_S = 600
MAX_LAUNCHES = 64  # a search rarely has more trials than this in all


def launch(call: str, kwargs: dict, nproc: int, started: float | None = None) -> None:
    """Run memopt.jobs.pipeline.<call>(**kwargs) on `nproc` ranks; their output goes to stdout. A
    launch that a rank ended out of memory is followed by another (memopt.runtime.parallel)."""
    from memopt.runtime.parallel import OOM_EXIT, STATE_ENV, oom_trial

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=kwargs["cfg"]["measure"]["cuda_alloc_conf"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    threads = kwargs.get("threads") or os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, threads // nproc)))  # (torchrun's banner)
    with tempfile.TemporaryDirectory(prefix="memopt-ranks-") as folder:
        state = Path(folder)
        (state / "job.json").write_text(
            json.dumps({"call": call, "kwargs": kwargs, "started": started})
        )
        env[STATE_ENV] = folder
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "memopt.run.distributed", str(state / "job.json"),
        ]  # fmt: skip
        gpus = env.get("CUDA_VISIBLE_DEVICES") or "none: CPU"
        for launch_no in range(1, MAX_LAUNCHES + 1):
            print(f"memopt: {call} on {nproc} ranks (torchrun, GPUs {gpus}), launch {launch_no}")
            code = _run(cmd, env)
            oom = state / "oom.json"
            if code == 0:
                return
            if not oom.exists() or (call == "cell_file" and launch_no > 1):
                break
            if call == "search_file":  # the failed trial joins the others: the search goes on
                trials = json.loads((state / "trials.json").read_text()) if (
                    state / "trials.json"
                ).exists() else []  # fmt: skip
                trials.append(oom_trial(json.loads(oom.read_text())))
                (state / "trials.json").write_text(json.dumps(trials))
                oom.unlink()
            # a cell: the next launch records the out-of-memory result
    raise MemoptError(
        f"the {nproc} ranks of this job failed (torchrun exit {code}"
        + (", a rank out of memory" if code == OOM_EXIT else "")
        + "); see above"
    )


def _run(cmd: list[str], env: dict) -> int:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1
    )
    for line in proc.stdout:  # the ranks' output, as it comes
        sys.stdout.write(line)
        sys.stdout.flush()
    return proc.wait()


def _rank_main(path: str) -> None:
    import torch
    import torch.distributed as dist

    from memopt.jobs import pipeline
    from memopt.runtime.measure import mark_job_started
    from memopt.runtime.techniques import resolve_device

    job = json.loads(Path(path).read_text())
    kwargs, rank, nproc = job["kwargs"], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if kwargs.get("threads"):
        kwargs["threads"] = max(1, kwargs["threads"] // nproc)  # the job's CPUs, shared
    mark_job_started(job["started"])
    with exit_on_user_error():
        device = resolve_device(kwargs["cfg"]["device"])
        if device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timeout)
        if rank != 0:  # one rank's progress is enough; errors still reach the log
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the process's lifetime)
        try:
            getattr(pipeline, job["call"])(**kwargs)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1])
