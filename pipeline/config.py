"""Typed configuration loaded from ``conf/<env>/<name>.toml``.

Every component owns a frozen dataclass describing its slice of config; this module only
knows how to turn a TOML table into such a dataclass. Guarantees:

* unknown keys are rejected with a message naming the key and the file;
* values are type-checked against the dataclass annotations (ints are accepted for floats);
* connection settings are marked with ``env_override("VAR")`` so the same checked-in file
  runs on embedded defaults and on real clusters: the environment variable wins over the file.
  CLI options win over both (callers apply them with :func:`dataclasses.replace`).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_VAR_CONF_DIR = "FRAUD_CONF_DIR"
ENV_VAR_CONF_ENV = "FRAUD_ENV"
DEFAULT_ENV = "dev"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file and key to fix."""


def env_override(var: str, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose value may be replaced by environment variable ``var``."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"env": var})
    return dataclasses.field(default=default, metadata={"env": var})


def conf_dir(env: str | None = None) -> Path:
    """Directory holding the TOML files of ``env`` (default: $FRAUD_ENV or ``dev``).

    ``$FRAUD_CONF_DIR`` points at a whole directory instead (a deployment's own configs).
    """
    explicit = os.environ.get(ENV_VAR_CONF_DIR)
    if explicit:
        return Path(explicit)
    return PROJECT_ROOT / "conf" / (env or os.environ.get(ENV_VAR_CONF_ENV, DEFAULT_ENV))


def load_section(cls: type[T], name: str, env: str | None = None, path: Path | None = None) -> T:
    """Load ``<conf_dir(env)>/<name>.toml`` (or ``path``) into the dataclass ``cls``."""
    file = path or conf_dir(env) / f"{name}.toml"
    if not file.is_file():
        raise ConfigError(f"config file {file} not found (env={env or os.environ.get(ENV_VAR_CONF_ENV, DEFAULT_ENV)!r})")
    try:
        with file.open("rb") as fh:
            table = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from exc
    return from_dict(cls, table, source=str(file))


def from_dict(cls: type[T], table: dict[str, Any], source: str = "<dict>", prefix: str = "") -> T:
    """Build dataclass ``cls`` from a (possibly nested) dict, validating keys and types."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{prefix or cls.__name__}] must be a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{source}: unknown key {key!r} (known keys: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        env_var = field.metadata.get("env")
        if env_var and os.environ.get(env_var):
            kwargs[name] = _coerce(hints[name], os.environ[env_var], f"${env_var}", key, from_env=True)
        elif name in table:
            kwargs[name] = _coerce(hints[name], table[name], source, key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key {key!r}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, source: str, key: str, from_env: bool = False) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, source, key)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(non_none[0], value, source, key, from_env)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{source}: {key} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if from_env and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{source}: {key} must be a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_coerce(item, v, source, f"{key}[{i}]", from_env) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} must be a table, got {value!r}")
        return {k: _coerce(args[1], v, source, f"{key}.{k}", from_env) for k, v in value.items()}
    if hint is Any:
        return value
    if from_env and isinstance(value, str) and hint is not str:
        value = _parse_env_scalar(hint, value, source, key)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be {hint.__name__}, got boolean {value!r}")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ConfigError(f"{source}: {key} must be {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse_env_scalar(hint: Any, raw: str, source: str, key: str) -> Any:
    try:
        if hint is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return hint(raw)
    except ValueError as exc:
        raise ConfigError(f"{source}: {key} must be {hint.__name__}, got {raw!r}") from exc


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging as params / manifests)."""
    return dataclasses.asdict(obj)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``: config as flat params (MLflow, summaries)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
