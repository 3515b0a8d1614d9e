"""The study config: schema validation with defaults, cross-key rules, and clear errors.

The schema lives in workflow/schemas/config.schema.yaml; the Snakefile and the `memopt` command both
validate through `validate_config`, so a bad value fails the same way everywhere.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import yaml

from memopt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "workflow" / "schemas" / "config.schema.yaml"
ROOT_CONFIGS = [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    if not path.exists():
        raise ConfigError(f"config schema not found at {path}; run memopt from a source checkout")
    return yaml.safe_load(path.read_text())


def load_config_file(path: Path) -> dict:
    """Read a YAML config file (not yet validated)."""
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None


def _fill_defaults(instance, schema: dict):
    """Fill `default` values from the schema, recursively, into dicts (jsonschema does not)."""
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        _fill_defaults(instance.get(key), sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in set(instance) - set(schema.get("properties", {})):
            _fill_defaults(instance[key], extra)


def _coerce(instance, schema: dict):
    """Turn strings into the numbers, booleans or nulls the schema asks for.

    Snakemake parses nested `--config` values with YAML's BaseLoader, so in
    `--config "search={'memory_budget_gib': 0.5}"` the 0.5 arrives as the string '0.5'.
    """
    if isinstance(instance, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                instance[key] = _coerce(value, sub)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [_coerce(v, schema["items"]) for v in instance]
    elif instance in ("null", "~") and "null" in schema.get("type", []):
        return None
    elif isinstance(instance, str) and not jsonschema.Draft202012Validator(schema).is_valid(
        instance
    ):
        try:
            parsed = yaml.safe_load(instance)
        except yaml.YAMLError:
            return instance
        if not isinstance(parsed, (str, dict, list)):
            return parsed  # a number, boolean or null: now validation can judge its value
    return instance


def _key(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<config>"


def _allowed(err: jsonschema.ValidationError) -> str:
    s = err.schema
    if err.validator == "enum":
        return "one of " + ", ".join(repr(v) for v in s["enum"])
    if err.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        parts = []
        for word, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        ):
            if word in s:
                parts.append(f"{sign} {s[word]}")
        return "a number " + " and ".join(parts)
    if err.validator == "type":
        return f"type {s['type']}"
    if err.validator == "anyOf":
        return " or ".join(_describe(sub) for sub in s["anyOf"])
    if err.validator == "pattern":
        return f"text matching the regular expression {s['pattern']}"
    return err.message


def _describe(sub: dict) -> str:
    if "enum" in sub:
        return "one of " + ", ".join(repr(v) for v in sub["enum"])
    if sub.get("type") == "integer":
        return f"an integer >= {sub.get('minimum', '-inf')}"
    return json.dumps(sub)


def _message(err: jsonschema.ValidationError) -> str:
    key = _key(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        where = "" if key == "<config>" else f" in {key}"
        return (
            f"unknown key {', '.join(repr(e) for e in extra)}{where}; allowed: {', '.join(allowed)}"
        )
    if err.validator == "required":
        return f"{key}: {err.message}"
    if err.validator == "propertyNames":
        return (
            f"{key}: technique name {err.instance!r} is not allowed; "
            "use letters, digits and underscores, starting with a letter"
        )
    if err.validator in ("minItems", "minProperties", "uniqueItems"):
        return f"{key}: {err.message}"
    return f"{key}: {err.instance!r} is not allowed; allowed: {_allowed(err)}"


def validate_config(raw: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of `raw` with defaults filled; raise ConfigError naming the key."""
    schema = schema or load_schema()
    cfg = _coerce(copy.deepcopy(dict(raw or {})), schema)
    _fill_defaults(cfg, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError("\n".join(_message(e) for e in errors))
    _check_cross_keys(cfg)
    return cfg


def _check_cross_keys(cfg: dict) -> None:
    m, problems = cfg["model"], []
    if m["d_model"] % m["n_heads"]:
        problems.append(
            f"model.n_heads: {m['n_heads']} does not divide model.d_model "
            f"({m['d_model']}); allowed: a divisor of {m['d_model']}"
        )
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


# Knob values that need a CUDA GPU, with what a CPU allows instead.
_GPU_ONLY = {
    ("precision", "fp8"): "FP8 tensor cores are a GPU's; allowed on a CPU: fp32, tf32, bf16, fp16",
    ("offload", "activations"): "it moves saved activations from GPU to host memory, where a "
    "CPU run keeps them already; allowed on a CPU: none",
    ("loss", "liger"): "it runs Triton kernels; allowed on a CPU: standard, chunked",
    ("loss", "cce"): "it runs Triton kernels; allowed on a CPU: standard, chunked",
    (
        "attention",
        "efficient",
    ): "PyTorch has no CPU kernel of it; allowed on a CPU: math, flash, auto",
    ("attention", "cudnn"): "cuDNN runs on NVIDIA GPUs; allowed on a CPU: math, flash, auto",
    (
        "attention",
        "flex",
    ): "memopt runs FlexAttention on CUDA only; allowed on a CPU: math, flash, auto",
    (
        "attention",
        "flash_attn",
    ): "the flash-attn package runs on CUDA GPUs; allowed on a CPU: math, flash, auto",
}
# Precisions whose activations (attention's inputs) are 16-bit: memopt.precision.AUTOCAST_DTYPES.
_SIXTEEN_BIT = ("bf16", "fp16", "fp8")
# Kernels that take only 16-bit inputs on a CUDA GPU (PyTorch's flash and cuDNN, flash-attn).
_CUDA_16BIT_ONLY = ("flash", "cudnn", "flash_attn")


def _technique_problems(key: str, spec: dict, cfg: dict) -> list[str]:
    """Knob combinations that cannot work, each named with both keys and why."""
    problems, w = [], spec.get("window")
    seq_len = cfg["model"]["seq_len"]
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
    if spec["loss"] == "liger" and spec["precision"] == "fp16":
        problems.append(
            f"{key}.loss: 'liger' is not allowed with {key}.precision 'fp16' (liger computes the "
            "logits' gradient in the forward pass, in FP16, before loss scaling can lift it: "
            "most of it underflows to zero); allowed with fp16: standard, chunked, cce"
        )
    budget = spec["compile_memory_budget"]
    if budget is not None and not spec["compile"]:
        problems.append(
            f"{key}.compile_memory_budget: {budget} needs {key}.compile true (it is "
            "torch.compile's activation budget); allowed: compile true, or "
            "compile_memory_budget null"
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
        for knob in ("precision", "offload", "loss", "attention"):
            value = spec[knob]
            if (knob, value) in _GPU_ONLY:
                problems.append(
                    f"{key}.{knob}: {value!r} is not allowed with device 'cpu' "
                    f"({_GPU_ONLY[knob, value]})"
                )
    return problems


# What each parallel mode may shard, and knobs not combined with sharding (not measured with it).
_SHARDS = {"none": ("none",), "ddp": ("none", "optimizer"), "fsdp2": ("grads", "full")}
_NOT_PARALLEL = {
    "offload": ("none", "its hooks move tensors that FSDP2 also manages"),
    "optimizer_in_backward": (False, "its per-parameter hooks run before gradients are reduced"),
    "optimizer": ("adamw", "sharding is measured with AdamW; others are not"),
}


def _parallel_problems(key: str, spec: dict, cfg: dict) -> list[str]:
    """The parallel, shard and gpus knobs (memopt.parallel)."""
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
    for knob, (allowed, why) in _NOT_PARALLEL.items():
        if spec[knob] != allowed:
            problems.append(
                f"{key}.{knob}: {spec[knob]!r} is not allowed with {key}.parallel {mode!r} "
                f"({why}); allowed: {allowed!r}, or parallel none"
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


def full_spec(knobs: dict, **config) -> dict:
    """One technique's knobs with every default filled and checked by the schema, as the
    workflow runs it (for scripts and tests); `config` adds other top-level keys (e.g. device)."""
    cfg = validate_config({"techniques": {"t": knobs}, "baseline": "t", **config})
    return cfg["techniques"]["t"]


def technique_spec(cfg: dict, name: str) -> dict:
    """The full knob dict of one technique (defaults filled by validation)."""
    if name not in cfg["techniques"]:
        raise ConfigError(
            f"technique {name!r} is not in the config; allowed: " + ", ".join(cfg["techniques"])
        )
    return dict(cfg["techniques"][name])


def config_hash(obj) -> str:
    """A short stable hash of any JSON-able part of the config (for provenance)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]
