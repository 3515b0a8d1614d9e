"""The study config: schema validation with defaults, cross-key rules, and clear errors.

The schema ships with the package (memopt/config.schema.yaml), its technique part in memopt.knobs;
the Snakefile and the `memopt` command both validate through `validate_config`, so a bad value
fails the same way everywhere, in a checkout or an installed package.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from pathlib import Path

import jsonschema
import yaml

from memopt.config_rules import check_cross_keys
from memopt.errors import ConfigError
from memopt.knobs import schema_properties
from memopt.redact import redact

SCHEMA_PATH = Path(__file__).resolve().with_name("config.schema.yaml")  # package data


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    """The config schema, its technique part (one property per knob) from memopt.knobs."""
    if not path.exists():
        raise ConfigError(f"config schema not found at {path}; reinstall memopt (pip install .)")
    schema = yaml.safe_load(path.read_text())
    schema["properties"]["techniques"]["additionalProperties"]["properties"] = schema_properties()
    # A map's model takes the model's keys but its length and no defaults (it overrides).
    model = schema["properties"]["model"]["properties"]
    schema["properties"]["map"]["properties"]["models"]["additionalProperties"]["properties"] = {
        k: {f: v for f, v in prop.items() if f != "default"}
        for k, prop in model.items()
        if k != "seq_len"
    }
    return schema


def load_config_file(path: Path) -> dict:
    """Read a YAML config file (not yet validated): a mapping of keys, or a ConfigError."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read config file {path}: not UTF-8 text (binary?)") from None
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {path} holds a {type(raw).__name__}; allowed: a YAML mapping of keys "
            "(device, corpus, model, techniques, ...)"
        )
    return raw


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
    if err.validator in ("minItems", "minProperties", "uniqueItems"):
        return f"{key}: {err.message}"
    return f"{key}: {err.instance!r} is not allowed; allowed: {_allowed(err)}"


MAX_NAME = 64  # a technique's name is a file name (results/search/<name>.json) and a rule's


def _types(schema: dict) -> set[str]:
    types = schema.get("type", [])
    found = {types} if isinstance(types, str) else set(types)
    for sub in schema.get("anyOf", []):
        found |= _types(sub)
    return found


def _values(instance, schema: dict, path: tuple, problems: dict) -> object:
    """What JSON Schema lets through, recorded in `problems` by path: NaN and infinity (every
    comparison with them is false), a float such as 2.0 for an integer, a trailing newline after
    a pattern's `$`. Returns the value."""
    if isinstance(instance, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                instance[key] = _values(value, sub, (*path, key), problems)
        return instance
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [_values(v, schema["items"], (*path, i), problems) for i, v in enumerate(instance)]
    types, key = _types(schema), _key(path)
    if isinstance(instance, float) and not math.isfinite(instance):
        problems[path] = f"{key}: {instance!r} is not allowed; allowed: a finite number"
    elif isinstance(instance, float) and "integer" in types and "number" not in types:
        if instance.is_integer():  # JSON Schema counts 2.0 as an integer; range() does not
            problems[path] = (
                f"{key}: {instance!r} is not allowed; allowed: an integer (write {int(instance)})"
            )
    elif isinstance(instance, str) and "pattern" in schema:
        if re.fullmatch(schema["pattern"], instance) is None:  # `$` also matches before "\n"
            problems[path] = (
                f"{key}: {instance!r} is not allowed; allowed: text matching the regular "
                f"expression {schema['pattern']}"
            )
    return instance


def validate_config(raw: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of `raw` with defaults filled; raise ConfigError naming the key."""
    schema = schema or load_schema()
    if not isinstance(raw or {}, dict):
        raise ConfigError(f"<config>: {raw!r} is not allowed; allowed: a mapping of keys")
    cfg = _coerce(copy.deepcopy(dict(raw or {})), schema)
    _fill_defaults(cfg, schema)
    problems: dict[tuple, str] = {}
    cfg = _values(cfg, schema, (), problems)
    names = schema["properties"]["techniques"]["propertyNames"]["pattern"]
    for name in cfg["techniques"] if isinstance(cfg.get("techniques"), dict) else ():
        if not isinstance(name, str) or not re.fullmatch(names, name) or len(name) > MAX_NAME:
            shown = (
                repr(name) if len(str(name)) <= 40 else f"{name[:20]!r}... ({len(name)} characters)"
            )
            problems[("techniques", name)] = (
                f"techniques: technique name {shown} is not allowed; allowed: letters, digits "
                f"and underscores, starting with a letter, at most {MAX_NAME} characters"
            )
    validator = jsonschema.Draft202012Validator(schema)
    errors = [
        _message(e)
        for e in validator.iter_errors(cfg)
        # a name's own errors (propertyNames) come with the techniques' path and the name
        if tuple(e.absolute_path) not in problems
        and not (tuple(e.absolute_path) == ("techniques",) and isinstance(e.instance, str))
    ]
    messages = sorted(set(errors) | set(problems.values()))
    if messages:
        raise ConfigError("\n".join(messages))
    check_cross_keys(cfg)
    return cfg


def canonical(obj):
    """`obj` in one form: every mapping's keys sorted, recursively, and a float with an integer
    value written as that integer (a number key holds 1 or 1.0 alike)."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    return obj


class Params(dict):
    """A rule parameter as Snakemake should compare it. Snakemake reruns a job when the repr of a
    parameter changed, and a dict's repr follows its key order: the same config with two keys
    swapped would rerun every job. This dict (its values exactly as given) shows Snakemake its
    canonical form instead, credentials in URLs redacted (Snakemake stores the repr in
    .snakemake/metadata and prints it), and reaches the job's script as a plain dict."""

    def __repr__(self) -> str:
        return json.dumps(canonical(redact(dict(self))), sort_keys=True)

    def __reduce__(self):
        return dict, (dict(self),)


def empty_overrides(overrides: dict, path: tuple = ()) -> list[str]:
    """Keys that `snakemake --config` sets to an empty mapping: Snakemake merges --config into the
    config key by key, so `--config techniques={}` would silently change nothing."""
    found = []
    for key, value in (overrides or {}).items():
        if isinstance(value, dict):
            found += empty_overrides(value, (*path, key)) if value else [_key((*path, key))]
    return found


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
