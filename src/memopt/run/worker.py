"""A warm worker: one long-lived process per GPU runs the workflow's training jobs (searches, cells,
quality runs) one after another, so a job does not pay its own Python, torch and CUDA start (12-18 s
a job beyond its own measured time in the first H100 study).

Each job is still its own Snakemake job with its own log, benchmark and output file; the script
only hands the call to the worker and relays the log while it runs. Between jobs the worker puts
the process back as a fresh one would find it (each knob's process-wide effect undone as the knob
registry says, the environment, threads, cached masks and weights, memory cache, peak statistics,
memory fraction), and a
new worker starts whenever the memopt sources, the Python, the torch version, the allocator
settings or the environment a job reads differ from the running one's. Nothing is half-written:
outputs are written atomically at the end of a job, and a worker whose client goes away (Ctrl-C, a
killed Snakemake) exits at once. It idles out after worker.idle_s seconds without a job."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from memopt.errors import MemoptError, exit_on_user_error
from memopt.redact import redact
from memopt.run.processes import stop_with_snakemake
from memopt.runtime.lease import LEASE_ENV, gpu_lease
from memopt.runtime.private_dir import open_private, runtime_dir

CALLS = (
    "search_file",
    "cell_file",
    "quality_file",
)  # memopt.jobs.pipeline functions a job may call
SRC = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300
# Environment a job reads (provenance, torch, inductor, CUDA): a change needs a new worker.
ENV_PREFIXES = ("MEMOPT_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_")


def socket_path(workdir: Path | None = None) -> Path:
    """Local (never on a shared filesystem), short (sun_path holds ~100 bytes), one per working
    directory and GPU (set), in the checked runtime folder (memopt.runtime.private_dir)."""
    # The lease too: under SLURM every job's GPU may be CUDA_VISIBLE_DEVICES=0.
    gpu = f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}|{os.environ.get(LEASE_ENV, '')}"
    slot = f"{Path(workdir or os.getcwd()).resolve()}|{gpu}"
    name = hashlib.sha256(slot.encode()).hexdigest()[:16]
    return runtime_dir() / f"{name}.sock"


def fingerprint(alloc_conf: str) -> str:
    """What a worker's jobs depend on beyond their arguments: a mismatch starts a new worker."""
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):  # an upgrade in place needs a new worker
        alloc_conf += f"|torch {version('torch')}"
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)]
    h = hashlib.sha256(f"{sys.executable}|{alloc_conf}|{env}|".encode())
    for path in sorted((SRC / "memopt").rglob("*.py")):
        h.update(str(path.relative_to(SRC)).encode() + path.read_bytes())
    return h.hexdigest()[:16]


def _exchange(path: Path, message: dict) -> dict | None:
    """Send one message, return the reply; None when no worker listens at path. A worker busy
    with a job answers when the job is done (it takes one connection at a time)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(json.dumps(message).encode() + b"\n")
            line = s.makefile("rb").readline()
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
        return None
    return json.loads(line) if line else None


def _wait_gone(pid: int, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(ChildProcessError):  # our own child: reap it (else a zombie)
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise MemoptError(f"the memopt worker (pid {pid}) did not exit; stop it: kill {pid}")


def _ensure_worker(path: Path, fp: str, idle_s: float, alloc_conf: str) -> dict:
    """A worker with fingerprint fp listening at path: the running one, or a new one."""
    lock_fd = open_private(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT)
    with open(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clients never start two workers on one GPU
        hello = _exchange(path, {"op": "hello"})
        if hello is not None and hello["fingerprint"] == fp:
            return hello
        if hello is not None:  # stale code or settings: it must go before a new one takes the GPU
            print(f"memopt: restarting the worker (pid {hello['pid']}): code or settings changed")
            _exchange(path, {"op": "exit"})
            _wait_gone(hello["pid"])
        path.unlink(missing_ok=True)
        log = path.with_suffix(".log")
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "memopt.run.worker", str(path), fp, str(idle_s)]
        with open(open_private(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # outlives this job; not killed with its process group
            )  # fmt: skip
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise MemoptError(f"the memopt worker failed to start:\n{_tail(log)}")
            hello = _exchange(path, {"op": "hello"})
            if hello is not None:
                return hello
            time.sleep(0.05)
        proc.kill()
        raise MemoptError(f"the memopt worker did not start in {START_TIMEOUT_S} s:\n{_tail(log)}")


def _tail(path: Path, n: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return "(no worker log)"


def run_job(worker: dict, call: str, kwargs: dict, log: Path) -> None:
    """Run memopt.jobs.pipeline.<call>(**kwargs) (JSON-able arguments) with its output in log: in the
    warm worker when worker['enabled'], else here. Relays the log to stdout; a user error exits 1
    with its message alone."""
    if call not in CALLS:
        raise ValueError(f"{call!r} is not a worker call; allowed: {', '.join(CALLS)}")
    stop_with_snakemake()  # a job (and the worker serving it) does not outlive its Snakemake
    log = Path(log).resolve()
    # One GPU of the host for the job's lifetime (memopt.runtime.lease): it pins this process and the
    # worker it talks to (one per GPU), so concurrent jobs never share a GPU. A parallel
    # technique's job leases its `gpus` and runs them under torchrun (memopt.run.distributed).
    device, gpus = kwargs["cfg"].get("device"), job_gpus(call, kwargs)
    lease = (
        gpu_lease(require=device == "cuda", count=gpus)
        if device != "cpu"
        else contextlib.nullcontext()
    )
    with exit_on_user_error(), lease:
        _run_job(worker, call, kwargs, log, started=time.time(), gpus=gpus)


def job_gpus(call: str, kwargs: dict) -> int:
    """The GPUs (ranks) a job runs on: its technique's `gpus` for a search or cell of a parallel
    technique, else 1 (quality runs train their function on one GPU: memopt.runtime.functions)."""
    technique = kwargs.get("technique")
    if call == "quality_file" or technique is None:
        return 1
    spec = kwargs["cfg"]["techniques"][technique]
    return spec.get("gpus", 1) if spec.get("parallel", "none") != "none" else 1


def _run_job(
    worker: dict, call: str, kwargs: dict, log: Path, started: float, gpus: int = 1
) -> None:
    from memopt.run.scripting import logged

    if gpus > 1:
        from memopt.run.distributed import launch

        with logged(log):
            launch(call, kwargs, gpus, started)
        return
    # Under SLURM the job's allocation ends with it: a warm worker would be killed with it, or
    # outlive it on a GPU that is no longer the job's. The job runs here.
    if not worker["enabled"] or os.environ.get("SLURM_JOB_ID"):
        from memopt.jobs import pipeline
        from memopt.runtime.measure import mark_job_started

        mark_job_started(started)
        with logged(log):
            getattr(pipeline, call)(**kwargs)
        return
    with exit_on_user_error():
        path = socket_path()
        alloc_conf = kwargs["cfg"]["measure"]["cuda_alloc_conf"]
        hello = _ensure_worker(path, fingerprint(alloc_conf), worker["idle_s"], alloc_conf)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        request = {"op": "run", "call": call, "kwargs": kwargs, "log": str(log), "cwd": os.getcwd()}
        request["started"] = started
        reply = _run_remote(path, request, log)
        if reply is None:
            raise MemoptError(
                f"the memopt worker (pid {hello['pid']}) died during the job; its last lines:\n"
                f"{_tail(log)}\n{_tail(path.with_suffix('.log'))}"
            )
        if "user_error" in reply:
            raise MemoptError(reply["user_error"])
        if "traceback" in reply:  # the worker ends after it: let it free the GPU first
            _wait_gone(hello["pid"])
            raise RuntimeError(f"the job failed in the memopt worker:\n{reply['traceback']}")


def _run_remote(path: Path, request: dict, log: Path) -> dict | None:
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s,
        open(log, "rb") as follow,
    ):
        try:
            s.connect(str(path))
            s.sendall(json.dumps(request).encode() + b"\n")
        except OSError:  # gone between hello and run (idled out, or ended after a failure)
            return None
        s.settimeout(0.5)
        reply = b""
        while True:
            sys.stdout.buffer.write(follow.read())  # the job's progress, as it is written
            sys.stdout.flush()
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            reply += chunk
            if not chunk or reply.endswith(b"\n"):  # one line: the reply
                break
        sys.stdout.buffer.write(follow.read())
        sys.stdout.flush()
    return json.loads(reply) if reply.strip() else None


# --- the worker process ---------------------------------------------------------------------


def _process_state() -> dict:
    """What a job may change in the process beyond its knobs (a cell sets its threads and the
    allocator's settings in the environment; a job runs in its own working directory)."""
    import torch

    return {
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "threads": torch.get_num_threads(),
        # The environment a job reads (memopt, torch, CUDA); torch sets others once, at import.
        "environ": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "cwd": os.getcwd(),
    }


def _restore(state: dict) -> None:
    """Put the process back as a new one would find it before the next job: what any job changes
    (threads, environment, folder, memopt.runtime.model's initial weights, memopt.runtime.measure's
    job start, cached masks), then every knob's process-wide effect undone as the registry says
    (memopt.knobs: undo), then the CUDA allocator."""
    import importlib

    import torch

    from memopt.knobs import undo_calls
    from memopt.runtime.measure import mark_job_started
    from memopt.runtime.model import forget_initial

    torch.backends.cudnn.benchmark = state["cudnn_benchmark"]
    torch.set_num_threads(state["threads"])
    # Of the environment a job reads: what it set goes, what it changed comes back.
    for key in [k for k in os.environ if k.startswith(ENV_PREFIXES)]:
        if key not in state["environ"]:
            del os.environ[key]
    os.environ.update(state["environ"])
    with contextlib.suppress(OSError):  # a folder removed meanwhile: the next job sets its own
        os.chdir(state["cwd"])
    forget_initial()
    mark_job_started(None)
    for module in [m for name, m in sys.modules.items() if name.startswith("memopt.")]:
        for value in vars(module).values():  # lru caches may hold device tensors (masks)
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()
    gc.collect()
    for call in undo_calls():  # after the collection: what it freed is given back too
        module, _, name = call.partition(":")
        getattr(importlib.import_module(module), name)()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)  # a search lowers it for its trials
        torch.cuda.reset_peak_memory_stats()


def _job(request: dict, jobs: int) -> dict:
    from memopt.jobs import pipeline
    from memopt.runtime.measure import mark_job_started

    os.chdir(request["cwd"])
    mark_job_started(request.get("started"))
    with (
        open(request["log"], "a", encoding="utf-8", buffering=1) as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        print(f"[memopt worker pid {os.getpid()}: job {jobs + 1} since it started]")
        try:
            getattr(pipeline, request["call"])(**request["kwargs"])
            return {"ok": True}
        except MemoptError as err:
            print(f"memopt: error: {redact(str(err))}")
            return {"ok": False, "user_error": str(err)}
        except Exception:
            text = traceback.format_exc()
            print(text)
            return {"ok": False, "traceback": text}


def _watch(conn: socket.socket, done: threading.Event) -> None:
    """The client went away mid-job (Ctrl-C, killed): exit before the job writes anything."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    if not done.is_set():
        print("client gone during a job: exiting", flush=True)
        os._exit(3)


def serve(path: Path, fp: str, idle_s: float) -> None:
    import torch  # noqa: F401 (imported once, before the first job: that is the point)

    state, jobs = _process_state(), 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv, _removed(path):
        srv.bind(str(path))
        srv.listen(4)
        srv.settimeout(idle_s)
        print(f"worker {os.getpid()} ready at {path} (fingerprint {fp})", flush=True)
        while True:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                print(f"idle for {idle_s} s after {jobs} jobs: exiting", flush=True)
                break
            with conn:
                conn.settimeout(None)
                request = json.loads(conn.makefile("rb").readline() or b"{}")
                op = request.get("op")
                if op == "hello":
                    conn.sendall(
                        json.dumps({"fingerprint": fp, "pid": os.getpid(), "jobs": jobs}).encode()
                        + b"\n"
                    )
                    continue
                if op == "exit":
                    conn.sendall(b'{"ok": true}\n')
                    break
                if op != "run" or request.get("call") not in CALLS:
                    conn.sendall(
                        json.dumps({"ok": False, "traceback": f"bad request {op!r}"}).encode()
                        + b"\n"
                    )
                    continue
                done = threading.Event()
                threading.Thread(target=_watch, args=(conn, done), daemon=True).start()
                t0 = time.perf_counter()
                reply = _job(request, jobs)
                _restore(state)
                jobs += 1
                done.set()
                print(f"job {jobs}: {request['call']} -> {request['log']} "
                      f"({time.perf_counter() - t0:.1f} s, ok={reply['ok']})", flush=True)  # fmt: skip
                with contextlib.suppress(OSError):  # the client may be gone by now
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                    conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher, which close() would not
                if "traceback" in reply:  # an unexpected failure may have broken CUDA: start anew
                    break


@contextlib.contextmanager
def _removed(path: Path):
    """The socket file goes with the worker, however it ends."""
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
