"""The study config's cross-key rules: combinations of values that each pass the schema but cannot
work together, each refused with both keys, their values and what is allowed (memopt.config runs
them after the schema)."""

from __future__ import annotations

from memopt.errors import ConfigError
from memopt.knobs import KNOBS
from memopt.map_points import map_points
from memopt.runtime.blocks import technique_model


def check_cross_keys(cfg: dict) -> None:
    """Raise ConfigError listing every combination of values that cannot work."""
    m, problems = cfg["model"], []
    if m["d_model"] % m["n_heads"]:
        problems.append(
            f"model.n_heads: {m['n_heads']} does not divide model.d_model "
            f"({m['d_model']}); allowed: a divisor of {m['d_model']}"
        )
    problems += _arch_problems(m)
    ref = (cfg["map"] or {}).get("reference")
    if ref is not None and ref not in cfg["techniques"]:
        problems.append(
            f"map.reference: {ref!r} is not a technique; allowed: " + ", ".join(cfg["techniques"])
        )
    for point, model in map_points(cfg).items():  # every map point's block, named by its key
        problems += [f"map.models ({point}): {p}" for p in _arch_problems(model)]
        if model["d_model"] % model["n_heads"]:
            problems.append(f"map.models ({point}): model.n_heads: {model['n_heads']} does not "
                            f"divide model.d_model ({model['d_model']})")  # fmt: skip
    for name, spec in cfg["techniques"].items():
        problems += _technique_problems(f"techniques.{name}", spec, cfg)
        problems += _parallel_problems(f"techniques.{name}", spec, cfg)
    if cfg["baseline"] not in cfg["techniques"]:
        problems.append(
            f"baseline: {cfg['baseline']!r} is not a technique; allowed: "
            + ", ".join(cfg["techniques"])
        )
    meas = cfg["measure"]
    if meas["min_timed_steps"] > meas["max_timed_steps"]:
        problems.append(
            f"measure.min_timed_steps: {meas['min_timed_steps']} is larger than "
            f"measure.max_timed_steps ({meas['max_timed_steps']}); allowed: <= "
            f"{meas['max_timed_steps']}"
        )
    c = cfg["corpus"]
    if c["source"] == "mirror" and not c.get("mirror"):
        problems.append(
            "corpus.mirror: None is not allowed with corpus.source 'mirror'; "
            "allowed: a directory or http(s) URL in speakleash layout"
        )
    if problems:
        raise ConfigError("\n".join(problems))


# Precisions whose activations (attention's inputs) are 16-bit: memopt.runtime.precision.AUTOCAST_DTYPES.
_SIXTEEN_BIT = ("bf16", "fp16", "fp8")
# torch.compile modes that capture CUDA graphs.
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# Kernels that take only 16-bit inputs on a CUDA GPU (PyTorch's flash and cuDNN, flash-attn).
_CUDA_16BIT_ONLY = ("flash", "cudnn", "flash_attn")


def _arch_problems(m: dict) -> list[str]:
    """Block shapes the llama block cannot build (gpt2 has one key/value head per query head)."""
    kv, heads = m["n_kv_heads"], m["n_heads"]
    if m["arch"] != "llama":
        if kv is not None and kv != heads:
            return [f"model.n_kv_heads: {kv} is not allowed with model.arch 'gpt2' (one "
                    f"key/value head per query head); allowed: null, or 'llama' as model.arch"]  # fmt: skip
        return []
    problems = []
    if kv is not None and heads % kv:
        problems.append(
            f"model.n_kv_heads: {kv} does not divide model.n_heads ({heads}); allowed: a "
            f"divisor of {heads} (each key/value head serves a group of query heads)"
        )
    head_dim = m["d_model"] // heads
    if m["d_model"] % heads == 0 and head_dim % 2:
        problems.append(
            f"model.n_heads: {heads} gives an odd head dimension ({m['d_model']} / {heads} = "
            f"{head_dim}), which the rotary embedding of model.arch 'llama' cannot turn in pairs; "
            "allowed: n_heads with an even d_model / n_heads"
        )
    return problems


def _technique_problems(key: str, spec: dict, cfg: dict) -> list[str]:
    """Knob combinations that cannot work, each named with both keys and why."""
    problems, w = [], spec.get("window")
    seq_len = cfg["model"]["seq_len"]
    block = spec.get("block")
    models = {"model": cfg["model"], **{f"map.models ({p})": m for p, m in map_points(cfg).items()}}
    for where, model in models.items() if block is not None else ():
        if block == model["arch"]:  # the same model under another function's name: refused
            other = "llama" if block == "gpt2" else "gpt2"
            problems.append(f"{key}.block: {block!r} is {where}'s own block (arch {block!r}); "
                            f"allowed: null or {other!r}")  # fmt: skip
            continue
        problems += [f"{key}.block: {block!r} ({where}): {p}"
                     for p in _arch_problems(technique_model(model, spec))]  # fmt: skip
    if w is not None and w > seq_len:
        problems.append(
            f"{key}.window: {w} is larger than model.seq_len ({seq_len}); allowed: 1..{seq_len}"
        )
    if spec["attention"] in ("flash", "efficient", "cudnn") and w is not None:
        problems.append(
            f"{key}.attention: {spec['attention']!r} (PyTorch SDPA) has no sliding window "
            f"(window {w}); allowed with a window: math, flex, flash_attn, auto"
        )
    # In-backward updates run as soon as each gradient is complete: nothing may need all of them.
    clashes = [
        (cfg["train"]["grad_clip"] > 0, "train.grad_clip", cfg["train"]["grad_clip"],
         "global clipping needs every gradient at once", "train.grad_clip 0 for the whole study"),
        (spec["grad_accum"] > 1, f"{key}.grad_accum", spec["grad_accum"],
         "every micro-batch would update the weights", "grad_accum 1"),
        (spec["precision"] == "fp16", f"{key}.precision", "fp16",
         "loss scaling unscales and checks every gradient before any update",
         "precision fp32, tf32, bf16 or fp8"),
    ]  # fmt: skip
    for clash, other, value, reason, allowed in clashes:
        if spec["optimizer_in_backward"] and clash:
            problems.append(
                f"{key}.optimizer_in_backward: true is not allowed with {other} {value!r} "
                f"({reason}; in-backward updates free each gradient as soon as it is "
                f"complete); allowed: optimizer_in_backward false, or {allowed}"
            )
    if spec["compile_mode"] in _CUDA_GRAPH_MODES:  # CUDA graphs replay one fixed step
        for other, allowed in (("grad_accum", 1), ("offload", "none"), ("parallel", "none")):
            if spec[other] != allowed:
                problems.append(
                    f"{key}.compile_mode: {spec['compile_mode']!r} is not allowed with "
                    f"{key}.{other} {spec[other]!r} (CUDA graphs with it are not measured: "
                    "micro-batches overwrite a replayed graph's outputs, offload and data "
                    f"parallelism hook into the step); allowed: {other} {allowed!r}, or "
                    "compile_mode 'default' or 'max-autotune-no-cudagraphs'"
                )
    if spec["loss"] == "liger" and spec["precision"] == "fp16":
        problems.append(
            f"{key}.loss: 'liger' is not allowed with {key}.precision 'fp16' (liger computes the "
            "logits' gradient in the forward pass, in FP16, before loss scaling can lift it: "
            "most of it underflows to zero); allowed with fp16: standard, chunked, cce"
        )
    for knob in KNOBS:  # a knob away from its default may need another knob's value
        for other, (want, why) in knob.needs.items():
            if spec[knob.name] != knob.default and spec[other] != want:
                problems.append(
                    f"{key}.{knob.name}: {_yaml(spec[knob.name])} needs {key}.{other} "
                    f"{_yaml(want)} ({why}); allowed: {other} {_yaml(want)}, or {knob.name} "
                    f"{_yaml(knob.default)}"
                )
    if spec["grad_accum"] > cfg["exactness"]["batch"]:
        problems.append(
            f"{key}.grad_accum: {spec['grad_accum']} is larger than exactness.batch "
            f"({cfg['exactness']['batch']}), which its exactness run splits into grad_accum "
            f"micro-batches; allowed: 1..{cfg['exactness']['batch']}, or a larger "
            "exactness.batch"
        )
    if (
        cfg["device"] == "cuda"
        and spec["attention"] in _CUDA_16BIT_ONLY
        and spec["precision"] not in _SIXTEEN_BIT
    ):
        problems.append(
            f"{key}.attention: {spec['attention']!r} cannot run with {key}.precision "
            f"{spec['precision']!r} on device 'cuda' (the kernel takes FP16/BF16 inputs only); "
            f"allowed with {spec['precision']}: math, efficient, flex, auto; or precision bf16 "
            "or fp16"
        )
    if cfg["device"] == "cpu":
        for knob in KNOBS:  # values that need a CUDA GPU, with what a CPU allows instead
            value = spec[knob.name]
            if value in knob.gpu_only:
                problems.append(
                    f"{key}.{knob.name}: {value!r} is not allowed with device 'cpu' "
                    f"({knob.gpu_only[value]})"
                )
    return problems


def _yaml(value) -> str:
    """A value as the config writes it: true, null, 0.5, 'name'."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


# What each parallel mode may shard.
_SHARDS = {"none": ("none",), "ddp": ("none", "optimizer"), "fsdp2": ("grads", "full")}


def _parallel_problems(key: str, spec: dict, cfg: dict) -> list[str]:
    """The parallel, shard and gpus knobs (memopt.runtime.parallel)."""
    mode, shard, gpus, problems = spec["parallel"], spec["shard"], spec["gpus"], []
    if shard not in _SHARDS[mode]:
        problems.append(
            f"{key}.shard: {shard!r} is not allowed with {key}.parallel {mode!r}; allowed: "
            + ", ".join(_SHARDS[mode])
        )
    if (mode == "none") != (gpus == 1):
        allowed = "1" if mode == "none" else "2 or more"
        problems.append(
            f"{key}.gpus: {gpus} is not allowed with {key}.parallel {mode!r}; allowed: {allowed}"
        )
    if mode == "none":
        return problems
    for knob in KNOBS:  # knobs not combined with data parallelism (not measured with it)
        if knob.parallel is not None and spec[knob.name] != knob.parallel[0]:
            allowed, why = knob.parallel
            problems.append(
                f"{key}.{knob.name}: {spec[knob.name]!r} is not allowed with {key}.parallel "
                f"{mode!r} ({why}); allowed: {allowed!r}, or parallel none"
            )
    if spec["precision"] in ("fp16", "fp8"):
        problems.append(
            f"{key}.precision: {spec['precision']!r} is not allowed with {key}.parallel {mode!r} "
            "(loss scaling and FP8 casts of sharded weights are not measured); allowed: fp32, "
            "tf32, bf16, or parallel none"
        )
    if mode == "fsdp2" and spec["compile"]:
        problems.append(
            f"{key}.compile: true is not allowed with {key}.parallel 'fsdp2' (compiling across "
            "FSDP2's hooks is not measured); allowed: compile false, or parallel ddp"
        )
    if cfg["exactness"]["batch"] % gpus:
        problems.append(
            f"{key}.gpus: {gpus} does not divide exactness.batch ({cfg['exactness']['batch']}), "
            "which its exactness run splits evenly across the GPUs; allowed: a divisor of it, "
            "or another exactness.batch"
        )
    return problems
