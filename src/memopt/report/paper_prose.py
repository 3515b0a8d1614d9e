"""The paper's prose: title, abstract, introduction, discussion, limitations and conclusion.

Each section is written once, as a Markdown template (paper/templates/prose/<section>.md.j2), and
converted to LaTeX by md_to_tex, so that the two formats cannot say different things. The numbers
the prose argues with are derived here (story) from the same context as the tables. Torch-free.
"""

from __future__ import annotations

import jinja2

from memopt.report.effects import batch_speed
from memopt.report.paper_analysis import break_even_tokens, logits_step
from memopt.report.paper_format import host_budget_words, md_to_tex
from memopt.report.paper_mechanisms import logits_fp32_mib, peak_parts, per_layer_bytes
from memopt.report.paper_tables_effects import retry_cost
from memopt.report.results import ok_cells
from memopt.runtime.flops import attention_flops_per_token, flops_per_token

SECTIONS = ("title", "abstract", "introduction", "where", "discussion", "limitations", "conclusion")


def _memory_terms(ctx: dict) -> dict | None:
    """What fills the memory, from the baseline's measured step at the `same` batch and its
    search: fixed (weights, gradients, optimizer state) and per sequence, and the two terms
    that dominate the activations at this sequence length (FP32 values, by shape)."""
    base = ok_cells(ctx["cells"]).get(ctx["baseline"])
    parts = peak_parts(base) if base else {}
    if not parts or parts.get("gradients") is None:
        return None
    model, vocab = ctx["model"], ctx["tokens"]["vocab_size"]
    fixed = parts["weights"] + parts["gradients"] + parts["optimizer"]
    search = next((s for s in ctx["searches"] if s["technique"] == ctx["baseline"]), {})
    return {
        "fixed_mib": fixed,
        "bytes_per_param": fixed * 2**20 / model["params"],
        "peak_mib": base["peak_allocated_mib"],
        "activations_share": base["activations_mib"] / base["peak_allocated_mib"],
        "batch": base["batch_size"],
        "per_sample_mib": search.get("per_sample_mib"),
        "fit_fixed_mib": search.get("fixed_mib"),  # the fit's intercept: batch 0, extrapolated
        "budget_mib": search.get("budget_mib"),
        "max_batch": search.get("max_batch"),
        "scores_mib": model["n_layers"] * model["n_heads"] * model["seq_len"] ** 2 * 4 / 2**20,
        "logits_mib": model["seq_len"] * vocab * 4 / 2**20,
        "vocab": vocab,
    }


def _knobs(techniques: list[dict], baseline: str) -> list[dict]:
    """The kinds of technique in the study, each with the techniques that use it."""
    # Read from each technique's knob values (memopt.knobs), never from its labels.
    kinds = {
        "precision": ("16-bit autocast", lambda k: k["precision"] in ("bf16", "fp16")),
        "fp8": ("FP8 matmuls", lambda k: k["precision"] == "fp8"),
        "tf32": ("TF32 matmuls", lambda k: k["precision"] == "tf32"),
        "fused": ("a fused attention kernel", lambda k: k["attention"] != "math" and k["window"] is None),
        "window": ("sliding-window attention", lambda k: k["window"] is not None),
        "checkpointing": ("activation checkpointing", lambda k: k["checkpointing"] != "none"),
        "loss": ("a chunked or fused loss", lambda k: k["loss"] != "standard"),
        "lowbit": ("a low-bit optimizer", lambda k: k["optimizer"] in ("adamw8bit", "adamw4bit")),
        "lighter": ("a lighter optimizer", lambda k: k["optimizer"] in ("adafactor", "sgd")),
        "in_backward": ("updates in the backward pass", lambda k: k["optimizer_in_backward"]),
        "compile": ("compilation", lambda k: k["compile"]),
        "offload": ("offloading", lambda k: k["offload"] != "none"),
        "accumulation": ("gradient accumulation", lambda k: k["grad_accum"] > 1),
        "parallel": ("data parallelism", lambda k: k["parallel"] != "none"),
    }  # fmt: skip
    out = []
    for key, (name, uses) in kinds.items():
        names = [t["name"] for t in techniques if t["name"] != baseline and uses(t["knobs"])]
        if names:
            out.append({"key": key, "name": name, "techniques": names})
    return out


def _reports_speedups(references: dict) -> list[dict]:
    """Per technique, the earlier reports' speed-ups (their range) beside ours."""
    by = {}
    for r in references.get("rows", []):
        if r["speedup"] is not None and r["our_speedup"] is not None:
            entry = by.setdefault(r["technique"], {"technique": r["technique"], "theirs": []})
            entry["theirs"].append(r["speedup"])
            entry["ours"] = r["our_speedup"]
            entry["ours_tf32"] = r.get("our_speedup_tf32")
    return [
        {**e, "lo": min(e["theirs"]), "hi": max(e["theirs"]), "n": len(e["theirs"])}
        for e in by.values()
    ]


def _compiles(row: dict, same: dict[str, dict]) -> bool:
    """The change turns compilation on (not one of two compiled techniques' settings: a mode or
    a memory budget, whose effect the compile prose does not explain)."""
    base, cell = same.get(row["over"], {}), same.get(row["technique"], {})
    return row["knob"] == "compile" and not base.get("compile") and bool(cell.get("compile"))


def _by_knob(increments: list[dict], same: dict[str, dict]) -> dict[str, list[dict]]:
    """The single-knob changes by group; compile's only where compilation is turned on, each with
    `break_even`: the tokens after which its longer warm-up (compilation) is repaid against the
    uncompiled twin at this batch (None where not)."""
    out: dict[str, list[dict]] = {}
    for row in increments:
        if row["knob"] != "compile":
            out.setdefault(row["knob"], []).append(row)
        elif _compiles(row, same):
            twin = same.get(row["over"])
            even = break_even_tokens(same[row["technique"]], twin) if twin else None
            out.setdefault("compile", []).append({**row, "break_even": even})
    return out


def _fused_technique(same: dict[str, dict], baseline: str, techniques: list[dict]) -> dict | None:
    """The first fused-attention technique without checkpointing and compilation (whose `same`
    cell has a breakdown), the baseline's `same` cell beside it."""
    base = same.get(baseline)
    for t in techniques:
        c = same.get(t["name"])
        if (
            c is not None and base is not None and c["kernel"] not in (None, "math")
            and c["checkpointing"] == "none" and c.get("activations_mib") is not None
            and not c.get("compile") and base.get("activations_mib")
        ):  # fmt: skip
            return c
    return None


def _fused_share(same: dict[str, dict], baseline: str, techniques: list[dict]) -> dict | None:
    """The share of the baseline's activations that the first fused-attention technique keeps no
    more, and the precision it runs in when that differs from the baseline's (then autocast has
    a part in the saving: the two cannot be told apart from these cells)."""
    c = _fused_technique(same, baseline, techniques)
    if c is None:
        return None
    base = same[baseline]
    # its one-knob twin where the study has one: the explicit kernel in the same precision
    twin = next((o for o in same.values() if o["kernel"] == "math"
                 and o["precision"] == c["precision"] and o.get("activations_mib")), None)  # fmt: skip
    ref = twin or base
    return {
        "share": 1 - c["activations_mib"] / ref["activations_mib"],
        "technique": c["technique"],
        "over": None if ref is base else ref["technique"],
        "with_precision": None
        if twin is not None or c["precision"] == base["precision"]
        else c["precision"],
    }


def _reference_retries(ctx: dict) -> list[dict]:
    """The references (the baseline, the TF32 one) whose cell at the abstract's batch retried
    cudaMalloc, with what that costs every speed-up against them (`share`, from
    memopt.report.paper_tables_effects.retry_cost; issue 37: the cost beside the ratios)."""
    names = [ctx["baseline"]] + ([ctx["tf32"]["technique"]] if ctx.get("tf32") else [])
    costs = {name: retry_cost(ctx, name) for name in names}
    return [{"technique": name, **r} for name, r in costs.items() if r is not None]


def _fastest_tf32(ctx: dict) -> float | None:
    """The speed-up of the abstract's fastest technique against the TF32 reference (None when
    the fastest is that reference: it would be compared with itself)."""
    fast = ctx["findings"].get("fastest")
    if not fast or ctx.get("tf32") is None or fast["technique"] == ctx["tf32"]["technique"]:
        return None
    return next(
        (
            r["speedup_tf32"]
            for r in ctx["relative"]
            if r["technique"] == fast["technique"] and r["batch_entry"] == ctx["findings"]["entry"]
        ),
        None,
    )


def _compile_saving(ctx: dict, same: dict[str, dict]) -> list[dict]:
    """Per compiled technique with an uncompiled twin (the increments table), what the compiled graph stops
    keeping: the activations (logits included) it keeps less than the twin, beside one FP32 copy
    of the logits, which autocast makes for the cross-entropy. `loss_fused`: the two agree within
    5%, so the saving is that copy and the blocks keep what they kept."""
    out = []
    vocab = ctx["tokens"]["vocab_size"]
    for r in ctx["increments"]:
        c, twin = same.get(r["technique"]), same.get(r["over"])
        if not _compiles(r, same) or c is None or twin is None:
            continue
        if c.get("activations_mib") is None or twin.get("activations_mib") is None:
            continue
        less = twin["activations_mib"] - c["activations_mib"]
        copy = logits_fp32_mib(c, {**ctx["model"], "vocab": vocab})
        out.append(
            {"technique": r["technique"], "over": r["over"], "less_mib": less, "copy_mib": copy,
             "loss_fused": abs(less - copy) <= 0.05 * copy}
        )  # fmt: skip
    return out


def _window_flops(ctx: dict) -> list[dict]:
    """Per sliding-window technique with a fused full-attention twin (the increments table): attention's
    matmul FLOPs per token with and without the window, beside the model's, and the speed-up;
    `kernels` (twin's, its) where the pair changes the kernel too, so it does not separate the
    window from the kernel. A twin with the explicit kernel changes the kernel's kind: none."""
    m, vocab = ctx["model"], ctx["tokens"]["vocab_size"]
    same = ok_cells(ctx["cells"])
    out = []
    for r in ctx["increments"]:
        w = next((t["window"] for t in ctx["techniques"] if t["name"] == r["technique"]), None)
        if r["knob"] != "attention" or w is None:
            continue
        kernel, twin = same[r["technique"]]["kernel"], same[r["over"]]["kernel"]
        if twin == "math":  # explicit to fused: not the window's doing (the fused kernel's)
            continue
        full = attention_flops_per_token(m, None)
        twin_w = next((t["window"] for t in ctx["techniques"] if t["name"] == r["over"]), None)
        out.append(
            {"technique": r["technique"], "over": r["over"], "window": w, "speedup": r["speedup"],
             "twin_window": twin_w,  # the twin's own window, if any: the FLOPs from there
             "full_mflop": attention_flops_per_token(m, twin_w) / 1e6,
             "window_mflop": attention_flops_per_token(m, w) / 1e6,
             "per_token_gflop": flops_per_token(m, vocab, None) / 1e9,
             "share": full / flops_per_token(m, vocab, None),
             "no_saving": abs(r["memory_reduction_pct"]) < 1,
             "kernels": None if kernel == twin else (twin, kernel), "unstable": r["unstable"],
             "median_speedup": r["median_speedup"]}
        )  # fmt: skip
    return out


def _uncovered_quality_kernels(ctx: dict) -> list[dict]:
    """Quality runs whose kernel none of their function's timed techniques ran: the exactness
    runs, which compare the techniques, do not cover that kernel."""
    kernels = {t["name"]: set(t.get("kernels") or []) for t in ctx["techniques"]}
    out: dict[tuple, dict] = {}  # functions with the same kernel and timed kernels share a row
    for r in ctx["quality"].get("rows", []):
        ran = set().union(*(kernels.get(t, set()) for t in r["techniques"]))
        if r.get("kernel") and ran and r["kernel"] not in ran:
            row = out.setdefault((r["kernel"], *sorted(ran)), {"functions": [],
                                 "kernel": r["kernel"], "timed": sorted(ran)})  # fmt: skip
            row["functions"].append(r["function"])
    return list(out.values())


# Training tokens per parameter at which a model of fixed compute budget trains best (Hoffmann et
# al., 2022, "Training Compute-Optimal Large Language Models"): below it, quality runs are early
# training, and the paper says so.
OPTIMAL_TOKENS_PER_PARAM = 20


def story(ctx: dict) -> dict:
    """The derived numbers the prose argues with (each from the results)."""
    searches = {s["technique"]: s for s in ctx["searches"]}
    base_search = searches.get(ctx["baseline"], {})
    per_sample = [
        {"technique": s["technique"], "per_sample_mib": s["per_sample_mib"],
         "max_batch": s["max_batch"], "capped": s["status"] == "capped",
         "host": s.get("limit") == "host"}
        for s in ctx["searches"]
        if s.get("per_sample_mib") is not None
    ]  # fmt: skip
    same = ok_cells(ctx["cells"])
    bf16 = next(
        (
            c
            for name, c in same.items()
            if c["precision"] in ("bf16", "fp16")
            and c["kernel"] == "math"
            and c["checkpointing"] == "none"
            and name != ctx["baseline"]
        ),
        None,
    )
    base = same.get(ctx["baseline"])
    explicit_16bit = None
    if bf16 is not None and base is not None and base.get("activations_mib") is not None:
        explicit_16bit = {
            "technique": bf16["technique"],
            "activations_mib": bf16["activations_mib"],
            "baseline_activations_mib": base["activations_mib"],
            "saving_pct": 100 * (1 - bf16["peak_allocated_mib"] / base["peak_allocated_mib"]),
        }
    exact_identical = [
        r["technique"]
        for r in ctx["exactness"]["rows"]
        if r.get("max_abs_diff") == 0 and r.get("reference") not in (None, r["technique"])
    ]
    parts = {name: peak_parts(c) for name, c in same.items()}
    return {
        "optimal_tokens_per_param": OPTIMAL_TOKENS_PER_PARAM,
        "host_limited": [  # offloading searches the host's pinned memory stopped, not the GPU's
            {
                "technique": s["technique"],
                "max_batch": s["max_batch"],
                "budget_gib": (s.get("host_budget_mib") or 0) / 1024,
                "budget_from": host_budget_words(ctx["config"]),
            }
            for s in ctx["searches"]
            if s.get("limit") == "host"
        ],  # fmt: skip
        "memory": _memory_terms(ctx),
        "fused_share": _fused_share(same, ctx["baseline"], ctx["techniques"]),
        "per_layer": per_layer_bytes(ctx["searches"], ctx["model"], ctx["tokens"]["vocab_size"]),
        "logits_bound": [
            {
                "technique": name,
                "working": p["working"],
                "activations": p["activations"] + (p["logits"] or 0),
            }
            for name, p in parts.items()
            if p
            and same[name]["checkpointing"] != "none"
            and same[name].get("loss", "standard") == "standard"  # a chunked loss acted already
            and p["working"] > p["activations"] + (p["logits"] or 0)
        ],  # fmt: skip
        "hfu_gap": [
            c
            for c in same.values()
            if c.get("mfu") and c.get("hfu") is not None and c["hfu"] > 1.01 * c["mfu"]
        ],  # fmt: skip
        "fastest_tf32": _fastest_tf32(ctx),
        "reference_retries": _reference_retries(ctx),
        "compile_saving": _compile_saving(ctx, same),
        "window_flops": _window_flops(ctx),
        "uncovered_kernels": _uncovered_quality_kernels(ctx),
        "reports_agree": all(
            (r["lo"] - 1) * (r["ours"] - 1) > 0 and (r["hi"] - 1) * (r["ours"] - 1) > 0
            for r in _reports_speedups(ctx["references"])
        ),
        "knobs": _knobs(ctx["techniques"], ctx["baseline"]),
        "per_sample": per_sample,
        "baseline_per_sample": base_search.get("per_sample_mib"),
        "batch_speed": batch_speed(ctx["cells"]),
        "logits_step": logits_step(
            ctx["cells"], ctx["model"]["seq_len"], ctx["tokens"]["vocab_size"], ctx["increments"]
        ),
        "reports": _reports_speedups(ctx["references"]),
        "increments": _by_knob(ctx["increments"], same),
        "explicit_16bit": explicit_16bit,
        "bitwise_identical": exact_identical,
        "recommend": {r["goal"]: r for r in ctx["recommendations"]},
    }


def render_prose(
    env: jinja2.Environment, context: dict, render, sections=SECTIONS, folder="prose", derive=story
) -> dict[str, dict]:
    """Each section rendered from the Markdown environment (<folder>/<section>.md.j2), as
    {"md": text, "tex": text}, and the figure captions (<folder>/captions.md.j2, one
    "name: caption" per line) as {"md": {name: caption}, "tex": {name: caption}}. The default
    paper's prose also sees `story` (derive(context)); derive=None: no story."""
    ctx = {**context, "story": derive(context)} if derive else context
    out = {}
    for name in sections:
        text = render(env, f"{folder}/{name}.md.j2", ctx).strip()
        out[name] = {"md": text, "tex": md_to_tex(text)}
    captions = {}
    for line in render(env, f"{folder}/captions.md.j2", ctx).strip().splitlines():
        name, _, text = line.partition(": ")
        captions[name] = text
    out["captions"] = {
        "md": captions,
        "tex": {name: md_to_tex(text) for name, text in captions.items()},
    }
    return out
