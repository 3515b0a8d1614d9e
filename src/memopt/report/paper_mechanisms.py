"""Why each technique saves what it saves: one paragraph per technique, from its memory breakdown
at the `same` batch against the baseline's, naming the knob that acts on each part that changed.

Peak allocated memory is split into what the measured step shows exists at its peak: the weights,
the optimizer state, the activations kept for the backward pass (of them, what the output layer
keeps: the logits) and the backward pass's working memory on top of those (the peak minus the
rest: mostly the gradient of the logits, before the weights' gradients exist). Gradients and
their changes are named where a knob moves them. Torch-free; plain text (× and ² aside), formatted by the
templates (technique names and numbers are the only data in it).
"""

from __future__ import annotations

from memopt.report.effects import changed_groups
from memopt.report.paper_format import mib as _mib
from memopt.report.results import ok_cells

# Explicit attention kernels keep the T x T scores and probabilities; the others are fused.
_EXPLICIT = {"math"}
_CHECKPOINTING = {
    "full": "checkpointing keeps only each block's input and recomputes the block in the "
    "backward pass",
    "every_k": "checkpointing every {k}th block keeps only those blocks' inputs and recomputes "
    "them in the backward pass",
    "selective": "selective checkpointing keeps the matmul and attention outputs and recomputes "
    "the elementwise operations",
}


def _change(name: str, before: float, after: float, causes: list[str]) -> str:
    d = after - before  # in MiB like the sizes, or with its unit below 1 MiB
    delta = f"{d:+,.0f}" if d == 0 or abs(d) >= 1 else ("+" if d > 0 else "") + _mib(d)
    text = f"{name}: {_mib(before)} to {_mib(after)} ({delta})"
    return text + (", because " + "; ".join(causes) if causes else "") + "."


def _scores_mib(c: dict, model: dict) -> float:
    """One FP32 copy of the attention scores of all layers and heads at this batch."""
    values = c["batch_size"] * model["n_layers"] * model["n_heads"] * model["seq_len"] ** 2
    return values * 4 / 2**20


def logits_fp32_mib(c: dict, model: dict) -> float | None:
    """One FP32 copy of the logits at this cell's batch (None without the vocabulary size)."""
    if not model.get("vocab"):
        return None
    return c["batch_size"] * model["seq_len"] * model["vocab"] * 4 / 2**20


def _value(x) -> float | None:
    """None for a missing value (None, or NaN as a summary.csv row has it)."""
    return None if x is None or x != x else float(x)


def peak_parts(c: dict) -> dict[str, float | None]:
    """The measured step's parts of the peak (None where the cell did not measure them)."""
    w, o, a, peak, logits, grads, off = (
        _value(c.get(f"{k}_mib"))
        for k in ("weights", "optimizer_state", "activations", "peak_allocated", "logits",
                  "gradients", "offloaded")
    )  # fmt: skip
    if None in (w, o, a, peak):
        return {}
    if logits is not None and logits < 0:  # kept nothing; memory held until then was freed in it
        logits = 0.0
    return {
        "weights": w,
        "gradients": grads,
        "optimizer": o,
        "activations": a - (logits or 0),
        "logits": logits,
        "working": peak - w - o - a,
        "offloaded": off or 0.0,
    }


def _activation_causes(c: dict, base: dict, rise: bool, model: dict, said: set) -> list[str]:
    causes = []
    if c["kernel"] not in _EXPLICIT and base["kernel"] in _EXPLICIT:
        window = f" (over a window of {c['window']} keys)" if c.get("window") else ""
        scores = _mib(_scores_mib(c, model))
        arithmetic = (  # once per paper: the next paragraphs refer to it
            f": {c['batch_size']:,} sequences × {model['n_layers']} layers × "
            f"{model['n_heads']} heads × {model['seq_len']:,}² values, {scores} per FP32 copy"
            if scores not in said
            else f" ({scores} per FP32 copy, as above)"
        )
        said.add(scores)
        causes.append(
            f"the fused {c['kernel']} attention kernel{window} never stores the attention scores "
            f"and probabilities, which the explicit kernel keeps{arithmetic}"
        )
    mode = c.get("checkpointing", "none")
    if mode != base.get("checkpointing", "none") and mode in _CHECKPOINTING:
        causes.append(_CHECKPOINTING[mode].format(k=c.get("checkpoint_every")))
    if c.get("offload", "none") != "none":
        causes.append(f"{_mib(c.get('offloaded_mib') or 0)} of them wait in host memory instead")
    if rise and c["precision"] != base["precision"] and c["kernel"] in _EXPLICIT:
        causes.append(
            f"under {c['precision']} autocast the explicit kernel runs its softmax in FP32, so "
            "the attention probabilities are kept in FP32 beside 16-bit copies of the scores"
        )
    elif c["precision"] != base["precision"] and c["precision"] in ("bf16", "fp16", "fp8"):
        causes.append(f"{c['precision']} autocast keeps matmul outputs in 16 bits")
    if c.get("compile") and not base.get("compile"):
        causes.append(
            "the compiled graph keeps fewer intermediates (this breakdown does not say which)"
        )
    return causes


def _logits_causes(c: dict, base: dict, rise: bool = False) -> list[str]:
    causes = []
    if c.get("loss", "standard") != base.get("loss", "standard"):
        causes.append(f"the {c['loss']} loss never holds the whole logits")
    if c["precision"] != base["precision"] and c.get("loss", "standard") == "standard":
        if rise and c["precision"] in ("bf16", "fp16"):
            causes.append(
                f"autocast computes the loss in FP32: the output layer keeps the {c['precision']} "
                "logits and an FP32 copy of them for the cross-entropy"
            )
        else:
            causes.append(f"the logits are {c['precision']} instead of {base['precision']}")
    return causes


def _working_label(c: dict) -> str:
    """What the backward pass's working memory mostly is: with the standard loss the logits'
    gradient; with a chunked or fused loss under checkpointing, a block recomputed for its
    backward pass."""
    if c.get("compile") and _value(c.get("logits_mib")) is None:
        return "(what it allocates beyond what the forward pass kept)"
    if c.get("loss", "standard") == "standard":
        return "(mostly the logits' gradient)"
    if c.get("checkpointing", "none") != "none":
        return "(a block recomputed for its backward pass, and the loss's gradient one chunk at a time)"
    return "(the loss's gradient one chunk at a time)"


def _working_causes(c: dict, base: dict, p: dict, model: dict) -> list[str]:
    if c.get("compile") and p.get("logits") is None:  # the output layer is not measured apart
        above = c["peak_allocated_mib"] - c["phase_after_forward_mib"]
        return [
            "under compile the output layer is not measured apart, and the step's peak is only "
            f"{_mib(above)} above what its forward pass kept"
        ]
    copy = logits_fp32_mib(c, model)
    mine, theirs = _value(c.get("logits_grad_mib")), _value(base.get("logits_grad_mib"))
    standard = c.get("loss", "standard") == "standard" == base.get("loss", "standard")
    if standard and copy and mine is not None and theirs is not None:
        return [
            f"the output layer's backward pass needs {mine / copy:.1f} FP32-sized copies of the "
            f"logits' gradient ({_mib(copy)} each at this batch) instead of {theirs / copy:.1f}"
        ]
    return _logits_causes(c, base)


def _speed_causes(c: dict, base: dict, faster: bool) -> list[str]:
    causes = []
    if faster and c["kernel"] not in _EXPLICIT and base["kernel"] in _EXPLICIT:
        causes.append("attention no longer reads and writes the score matrices in memory")
    if faster and c["precision"] != base["precision"] and c["precision"] != "fp32":
        if c.get("device") == "cuda":  # a CPU has no tensor cores (and computes tf32 in FP32)
            causes.append(f"its matmuls run on {c['precision']} tensor cores")
        elif c["precision"] != "tf32":
            causes.append(f"its matmuls run in {c['precision']}")
    if faster and c.get("compile") and not base.get("compile"):
        causes.append("compiled kernels fuse the elementwise work")
    if not faster and c.get("checkpointing", "none") in ("full", "every_k", "selective"):
        causes.append("it runs forward passes again in the backward pass")
    if not faster and c.get("offload", "none") != "none":
        causes.append("activations travel to host memory and back")
    return causes


def mechanism(
    c: dict, base: dict, exact: dict | None, threshold: float, model: dict, said: set | None = None
) -> str:
    """One technique's paragraph: peak, then each part that moved by more than `threshold` MiB
    with the knob that moves it, then speed, and bitwise identity where the exactness run shows
    it."""
    p, b = peak_parts(c), peak_parts(base)
    saved = 100 * (1 - c["peak_allocated_mib"] / base["peak_allocated_mib"])
    out = [
        f"Peak {_mib(c['peak_allocated_mib'])} against the baseline's "
        f"{_mib(base['peak_allocated_mib'])} ({saved:.1f}% {'less' if saved >= 0 else 'more'})."
    ]

    def moved(key):
        return (
            p.get(key) is not None and b.get(key) is not None and abs(p[key] - b[key]) > threshold
        )

    if p.get("logits") is None and b.get("logits") is not None:  # compiled: not measured apart
        b = {**b, "activations": b["activations"] + b["logits"], "logits": None}
        label = "Activations kept for the backward pass, logits included (not measured apart here)"
    else:
        label = "Activations kept for the backward pass, the logits aside"
    if moved("activations"):
        rise = p["activations"] > b["activations"]
        causes = _activation_causes(c, base, rise, model, set() if said is None else said)
        out.append(_change(label, b["activations"], p["activations"], causes))
    if moved("logits"):
        out.append(
            _change(
                "Logits kept by the output layer",
                b["logits"],
                p["logits"],
                _logits_causes(c, base, p["logits"] > b["logits"]),
            )  # fmt: skip
        )
    if moved("working"):
        out.append(
            _change(
                "Working memory of the backward pass on top of these " + _working_label(c),
                b["working"],
                p["working"],
                _working_causes(c, base, p, model),
            )  # fmt: skip
        )
    if moved("optimizer"):
        causes = [f"{c.get('optimizer', 'adamw')} keeps it"]
        out.append(_change("Optimizer state", b["optimizer"], p["optimizer"], causes))
    if moved("gradients"):
        out.append(_change("Gradients", b["gradients"], p["gradients"], []))
    ratio = c["tokens_per_s"] / base["tokens_per_s"]
    util = ""
    if c.get("mfu") is not None:
        util = f" (MFU {100 * c['mfu']:.1f}%"
        if c.get("hfu") is not None and c["hfu"] > c["mfu"] * 1.001:
            util += f"; HFU {100 * c['hfu']:.1f}% with the recomputation counted"
        util += ")"
    changed = changed_groups(c, base)
    causes = _speed_causes(c, base, ratio > 1) if len(changed) == 1 else []
    why = ": " + "; ".join(causes) if causes else ""
    if len(changed) > 1:  # a cause only from a one-knob pair (the increments table)
        knobs = ", ".join(changed[:-1]) + " and " + changed[-1]
        why = (f"; it changes {knobs} at once, so this ratio credits none of them (the table of "
               "incremental effects compares one knob at a time)")  # fmt: skip
    out.append(f"It trains {ratio:.2f}x the baseline's tokens per second{util}{why}.")
    if exact and exact.get("max_abs_diff") == 0 and exact.get("reference") != c["technique"]:
        out.append(
            f"Its training losses are bitwise identical to {exact['reference']}'s over the "
            f"{exact['steps']}-step exactness run: it changes where memory goes, not the arithmetic."
        )
    return " ".join(out)


def mechanisms(
    cells: list[dict], baseline: str, exactness_rows: list[dict], model: dict
) -> list[dict]:
    """One paragraph per technique with an ok `same` cell, in the cells' order (none without the
    baseline's). Parts that moved by less than 1% of the baseline's peak are not discussed."""
    same = ok_cells(cells)
    base = same.get(baseline)
    if base is None or not peak_parts(base):
        return []
    exact = {r["technique"]: r for r in exactness_rows}
    threshold = 0.01 * base["peak_allocated_mib"]
    said: set = set()  # arithmetic already written out, referred to after its first paragraph
    return [
        {"technique": name, "text": mechanism(c, base, exact.get(name), threshold, model, said)}
        for name, c in same.items()
        if name != baseline and peak_parts(c)
    ]


def per_layer_bytes(searches: list[dict], model: dict, vocab: int) -> dict | None:
    """The bytes a layer keeps per token, from the first eager 16-bit search with a fitted slope
    (a fused kernel's first): measured (its MiB a sequence, less what the plan counts outside
    the layers: logits, embeddings, final norm), counted tensor by tensor (memopt.plan.memory)
    and by Korthikanti et al. (2022)'s 34h + 5as for 16-bit activations (34h where a fused kernel
    keeps no scores). None without such a search."""
    from memopt.plan.memory import MIB, complete, kernel, layer_bytes, terms
    from memopt.runtime.blocks import technique_model

    found = []
    for s in searches:
        spec = s.get("spec")
        if not spec or s.get("per_sample_mib") is None or spec["precision"] not in ("bf16", "fp16"):
            continue
        try:
            t = terms(model, vocab, spec)
        except ValueError:
            continue
        if t["kind"] == "eager":
            found.append((kernel(complete(spec)) == "math", s, t, technique_model(model, spec)))
    if not found:
        return None
    math_kernel, s, t, m = min(found, key=lambda f: f[0])  # a fused kernel's first
    layers, h, a, seq = m["n_layers"], m["d_model"], m["n_heads"], m["seq_len"]
    counted = layer_bytes(m, complete(s["spec"]))
    outside = t["known"] - layers * counted
    return {
        "technique": s["technique"],
        "fused": not math_kernel,
        "measured": (s["per_sample_mib"] * MIB / seq - outside) / layers,
        "counted": counted,
        "korthikanti": 34 * h + (5 * a * seq if math_kernel else 0),
        "arch": m["arch"],
    }
