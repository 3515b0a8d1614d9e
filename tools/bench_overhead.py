"""Where a training job's time goes besides its training steps, on this GPU.

    python tools/bench_overhead.py [--out DIR]

Measures, each in a fresh process where a job would pay it: importing torch, memopt and
snakemake's script module, starting CUDA, building the default model, provenance; then the
default model's steady step time at one batch for the kernels quality runs may use (FP32 explicit
and memory-efficient, BF16 cuDNN, BF16 FlexAttention with a window, with its compile time). The
table goes to stdout and --out/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = {
    "python": "pass",
    "import torch": "import torch",
    "torch + CUDA init": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "import memopt.jobs.pipeline": "import memopt.jobs.pipeline",
    "import snakemake.script": "import snakemake.script",
}


def child_seconds(code: str) -> float:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - t0


def in_process(batch: int, steps: int) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from memopt.config import full_spec, load_config_file, validate_config
    from memopt.runtime.measure import provenance
    from memopt.runtime.optimizers import make_optimizer
    from memopt.runtime.step import train_step
    from memopt.runtime.techniques import apply_technique

    out = {}
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    out["cuda init (in process)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    provenance("cuda")
    out["provenance()"] = time.perf_counter() - t0
    cfg = validate_config(load_config_file(ROOT / "config.yaml"))
    specs = {
        "fp32 math": {"precision": "fp32", "attention": "math"},
        "fp32 efficient": {"precision": "fp32", "attention": "efficient"},
        "tf32 efficient": {"precision": "tf32", "attention": "efficient"},
        "bf16 cudnn": {"precision": "bf16", "attention": "cudnn"},
        "bf16 flex w128": {"precision": "bf16", "attention": "flex", "window": 128},
    }
    for name, knobs in specs.items():
        spec = full_spec(knobs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        applied = apply_technique(spec, cfg["model"], 32000, 1234, "cuda")
        opt = make_optimizer(applied.model, cfg["train"], "cuda")
        torch.cuda.synchronize()
        build = time.perf_counter() - t0
        x = torch.randint(0, 32000, (batch, cfg["model"]["seq_len"]), device="cuda")
        t0 = time.perf_counter()
        train_step(applied, opt, x, x, 0, cfg["train"])
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for i in range(2):
            train_step(applied, opt, x, x, i + 1, cfg["train"])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            train_step(applied, opt, x, x, i + 3, cfg["train"])
        torch.cuda.synchronize()
        step = (time.perf_counter() - t0) / steps
        out[name] = {
            "build_s": build,
            "first_step_s": first,
            "step_ms": step * 1e3,
            "tokens_per_s": batch * cfg["model"]["seq_len"] / step,
        }
        print(name, out[name], flush=True)
        del applied, opt
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench")))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    res = {}
    for name, code in SNIPPETS.items():
        res[name] = min(child_seconds(code) for _ in range(2))
        print(f"{name}: {res[name]:.2f} s", flush=True)
    res.update(in_process(args.batch, args.steps))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
