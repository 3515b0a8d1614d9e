"""Tokens/s predicted without running: the model FLOPs a token needs (memopt.runtime.flops) over
the model FLOP/s that a measured cell with the same knobs reached on that GPU, at the nearest
shape; with the interval that the same rule's leave-one-out errors span. Torch-free.

A measured point is a single-GPU cell that trained (its JSON, with the model it ran). Nearest:
the same GPU and knobs (SPEED_IGNORES aside), then the smallest sum of |log ratios| of the
parameter count, the sequence length and the tokens a step, plus LLAMA_DISTANCE where the block
style differs. The interval: each measured configuration (model, length and knobs, every batch
and replica together) predicted from the others; the 10th and 90th percentiles of measured over
predicted tokens/s, applied to every prediction. POINTS_FILE holds the points of the published
studies and the map (written by tools/plan_check.py --write-points).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from memopt.plan.memory import complete
from memopt.runtime.flops import flops_per_token, param_count

POINTS_FILE = Path(__file__).with_name("speed_points.json")
# Knobs whose value changes no kernel's speed beyond the FLOPs flops_per_token counts (a window's
# size) or not at all; whether a window is set still counts.
SPEED_IGNORES = ("lr_scale", "loss_chunk", "window", "gpus")
LLAMA_DISTANCE = 2.0  # another block style counts as a shape e^2 ~ 7 times off
BAND = (0.1, 0.9)  # the interval's percentiles of measured / predicted


def speed_key(spec: dict) -> str:
    spec = complete(spec)
    key = {k: v for k, v in spec.items() if k not in SPEED_IGNORES}
    key["windowed"] = spec.get("window") is not None
    return json.dumps(key, sort_keys=True)


def speed_point(cell: dict, model: dict, vocab: int, where: str) -> dict | None:
    """A cell as a measured point (None: it did not train, or ran on several GPUs)."""
    if cell.get("status") != "ok" or not cell.get("tokens_per_s") or cell.get("gpus", 1) != 1:
        return None
    spec = complete(cell["spec"])
    arch, params = model.get("arch", "gpt2"), param_count(model, vocab)
    per_token = flops_per_token(model, vocab, spec.get("window"))
    return {
        "where": f"{where}/{cell['technique']}@{cell['batch_size']}",
        "gpu": cell["device_name"],
        "key": speed_key(spec),
        # the configuration: its replicas (other studies, other GPUs of a kind) leave together
        "config": json.dumps([arch, params, model["seq_len"], speed_key(spec)]),
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


def band(points: list[dict]) -> tuple[float, float] | None:
    """The interval's factors on a prediction (None with fewer than 5 leave-one-out pairs)."""
    ratios = sorted(ratio(p, q) for p, q in leave_one_out(points))
    if len(ratios) < 5:
        return None
    cuts = statistics.quantiles(ratios, n=10, method="inclusive")
    return cuts[0], cuts[-1]


def load_points(path: Path = POINTS_FILE) -> list[dict]:
    return json.loads(path.read_text())["points"] if path.exists() else []


def predict(points, model, vocab, spec, batch, gpu, factors=None) -> dict | None:
    """Tokens/s at `batch` on `gpu` (a device name as cells record it): the prediction, its
    interval (factors: band(points), computed when None) and the point it leans on; None
    without a measured point of that GPU and knobs."""
    spec = complete(spec)
    arch, params = model.get("arch", "gpt2"), param_count(model, vocab)
    q = nearest(points, gpu, speed_key(spec), arch, params, model["seq_len"],
                max(1, batch) * model["seq_len"])  # fmt: skip
    if q is None or batch < 1:
        return None
    tokens_per_s = q["model_flops_per_s"] / flops_per_token(model, vocab, spec.get("window"))
    low, high = factors if factors is not None else (band(points) or (None, None))
    return {
        "tokens_per_s": tokens_per_s,
        "low": tokens_per_s * low if low else None,
        "high": tokens_per_s * high if high else None,
        "leans_on": q["where"],
    }
