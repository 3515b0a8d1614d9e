"""Tokens/s predicted without running: the model FLOPs a token needs (memopt.runtime.flops) over
the model FLOP/s that a measured cell with the same knobs reached on that GPU, at the nearest
shape; with the interval that the same rule's leave-one-out errors span on that GPU. Torch-free.

A measured point is a single-GPU cell that trained (its JSON, with the model it ran). Nearest:
the same GPU and knobs (SPEED_IGNORES aside; the attention kernel as it ran, PyTorch's flash,
cuDNN's and flash-attn's as one), then the smallest sum of |log ratios| of the parameter count,
the sequence length and the tokens a step, plus LLAMA_DISTANCE where the block style differs.
The interval: each measured configuration (model, length and knobs, every batch and replica
together) predicted from the others of its GPU; one ratio of measured over predicted tokens/s
per configuration (their median over its cells); the 10th and 90th percentiles of those. It is
given only where at least MIN_PAIRS configurations were checked on that GPU and the prediction
leans on a point no farther than the farthest of those checks. POINTS_FILE holds the points of
the published studies and the map (written by tools/plan_check.py --write-points).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from memopt.plan.memory import complete, kernel
from memopt.runtime.blocks import technique_model
from memopt.runtime.flops import flops_per_token, param_count

POINTS_FILE = Path(__file__).with_name("speed_points.json")
# Knobs whose value changes no kernel's speed beyond the FLOPs flops_per_token counts (a window's
# size) or not at all; whether a window is set still counts.
SPEED_IGNORES = ("lr_scale", "loss_chunk", "window", "gpus", "block")  # block: in the model
LLAMA_DISTANCE = 2.0  # another block style counts as a shape e^2 ~ 7 times off
MIN_PAIRS = 5
FLASH_LIKE = ("flash", "cudnn", "flash_attn")  # within a few % of each other on the H100


def speed_key(spec: dict, ran: str | None = None) -> str:
    """The knobs that set the speed; the attention kernel as it ran (`ran`, a cell's record),
    else as `auto` would resolve on a GPU."""
    spec = complete(spec)
    key = {k: v for k, v in spec.items() if k not in SPEED_IGNORES}
    key["windowed"] = spec.get("window") is not None
    attention = ran or kernel(spec, "cuda")
    key["attention"] = "flash" if attention in FLASH_LIKE else attention
    return json.dumps(key, sort_keys=True)


def speed_point(cell: dict, model: dict, vocab: int, where: str) -> dict | None:
    """A cell as a measured point (None: it did not train, or ran on several GPUs)."""
    if cell.get("status") != "ok" or not cell.get("tokens_per_s") or cell.get("gpus", 1) != 1:
        return None
    spec = complete(cell["spec"])
    model = technique_model(model, spec)
    arch, params = model.get("arch", "gpt2"), param_count(model, vocab)
    per_token = flops_per_token(model, vocab, spec.get("window"))
    key = speed_key(spec, cell.get("kernel"))
    return {
        "where": f"{where}/{cell['technique']}@{cell['batch_size']}",
        "gpu": cell["device_name"],
        "key": key,
        # the configuration: its replicas (other studies, other GPUs of a kind) leave together
        "config": json.dumps([arch, params, model["seq_len"], key]),
        "arch": arch,
        "params": params,
        "seq_len": model["seq_len"],
        "tokens_per_step": cell["tokens_per_step"],
        "tokens_per_s": cell["tokens_per_s"],
        "model_flops_per_s": cell["tokens_per_s"] * per_token,
    }


def _distance(p: dict, arch: str, params: int, seq_len: int, tokens: int) -> float:
    return (
        abs(math.log(p["params"] / params))
        + abs(math.log(p["seq_len"] / seq_len))
        + abs(math.log(p["tokens_per_step"] / tokens))
        + (LLAMA_DISTANCE if p["arch"] != arch else 0.0)
    )


def nearest(points, gpu, key, arch, params, seq_len, tokens, leave_out=None) -> dict | None:
    """The measured point the prediction leans on (None: no point of that GPU and knobs)."""
    same = [p for p in points if p["gpu"] == gpu and p["key"] == key and p["config"] != leave_out]
    if not same:
        return None
    return min(same, key=lambda p: (_distance(p, arch, params, seq_len, tokens), p["where"]))


def leave_one_out(points: list[dict]) -> list[tuple[dict, dict]]:
    """(point, the point it is predicted from) for each point with another configuration of its
    GPU and knobs to lean on."""
    out = []
    for p in points:
        q = nearest(points, p["gpu"], p["key"], p["arch"], p["params"], p["seq_len"],
                    p["tokens_per_step"], leave_out=p["config"])  # fmt: skip
        if q is not None:
            out.append((p, q))
    return out


def ratio(p: dict, q: dict) -> float:
    """Measured over predicted tokens/s of p, predicted from q's model FLOP/s."""
    return p["model_flops_per_s"] / q["model_flops_per_s"]


def band(points: list[dict], gpu: str) -> dict | None:
    """The interval on `gpu`: {"low", "high"} (factors on a prediction), "n" configurations
    checked and "reach" (the farthest distance a check leaned over); None with fewer than
    MIN_PAIRS configurations checked."""
    by_config: dict[str, list] = {}
    for p, q in leave_one_out([p for p in points if p["gpu"] == gpu]):
        d = _distance(q, p["arch"], p["params"], p["seq_len"], p["tokens_per_step"])
        by_config.setdefault(p["config"], []).append((ratio(p, q), d))
    if len(by_config) < MIN_PAIRS:
        return None
    ratios = sorted(statistics.median(r for r, _ in v) for v in by_config.values())
    cuts = statistics.quantiles(ratios, n=10, method="inclusive")
    reach = max(d for v in by_config.values() for _, d in v)
    return {"low": cuts[0], "high": cuts[-1], "n": len(by_config), "reach": reach}


def load_points(path: Path = POINTS_FILE) -> list[dict]:
    return json.loads(path.read_text())["points"] if path.exists() else []


def predict(points, model, vocab, spec, batch, gpu, interval) -> dict | None:
    """Tokens/s at `batch` (at least 1) on `gpu` (a device name as cells record it): the
    prediction, its interval (`interval`: band(points, gpu), None for none; none beyond its
    reach) and the point it leans on; None without a measured point of that GPU and knobs."""
    spec = complete(spec)
    model = technique_model(model, spec)
    arch, params = model.get("arch", "gpt2"), param_count(model, vocab)
    tokens = batch * model["seq_len"]
    q = nearest(points, gpu, speed_key(spec), arch, params, model["seq_len"], tokens)
    if q is None:
        return None
    tokens_per_s = q["model_flops_per_s"] / flops_per_token(model, vocab, spec.get("window"))
    within = interval and _distance(q, arch, params, model["seq_len"], tokens) <= interval["reach"]
    return {
        "tokens_per_s": tokens_per_s,
        "low": tokens_per_s * interval["low"] if within else None,
        "high": tokens_per_s * interval["high"] if within else None,
        "leans_on": q["where"],
    }
