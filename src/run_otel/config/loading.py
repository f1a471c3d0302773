"""Building the one Config: defaults, the TOML file, the environment, then checks.

Precedence, lowest first: built-in defaults, the TOML file, the standard
``OTEL_*`` variables (for the keys they define), then ``RUN_OTEL_<SECTION>__<KEY>``.
Every key is checked, and every error found is reported at once (``checks.py``):
an unknown key, a value of the wrong type or out of range, each with the key's
dotted name, or the variable that set it.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from ..otel_env import otel_environment, otel_variables
from .checks import Problems, check
from .sections import CONFIG_ENV, ENV_PREFIX, SECTIONS, Config, ConfigError


def load_config(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the one Config from a TOML file (optional) and the environment. A ConfigError
    lists every error found, one per line."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    raw: dict[str, Any] = _read_toml(Path(path)) if path else {}
    problems = Problems({**otel_variables(env), **_run_otel_variables(env)})
    _merge(raw, _otel_values(env, problems))
    _merge(raw, _run_otel_values(env, problems))
    return _build(raw, problems)


def overridden_file_keys(path: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Lines naming each key the file sets and an OTEL_* or RUN_OTEL_* variable overrides, so
    that precedence is visible (an image's ENV or an operator's injected OTEL_* silently
    beating a mounted file)."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    if not path:
        return []
    raw = _read_toml(Path(path))
    return [
        f"{name} overrides {section}.{key} set in {path}"
        for (section, key), name in {**otel_variables(env), **_run_otel_variables(env)}.items()
        if isinstance(raw.get(section), Mapping) and key in raw[section]
    ]


def build_config(raw: Mapping[str, Any]) -> Config:
    """A Config from nested dicts, rejecting unknown keys and bad values, all of them at once."""
    return _build(raw, Problems())


def _build(raw: Mapping[str, Any], problems: Problems) -> Config:
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            problems.add(f"unknown config section [{section}]{_did_you_mean(section, SECTIONS)} (known: {', '.join(SECTIONS)})")
        elif not isinstance(values, Mapping):
            problems.add(f"[{section}] must be a table of keys")
        else:
            sections[section] = _build_section(section, SECTIONS[section], values, problems)
    config = check(Config(**sections), problems)
    problems.raise_any()
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    # Alone of the errors, these stop at once: without the file there are no keys to check.
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _merge(into: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in overrides.items():
        into.setdefault(section, {})
        if isinstance(into[section], dict):
            into[section].update(values)


def _otel_values(env: Mapping[str, str], problems: Problems) -> dict[str, dict[str, Any]]:
    """The keys the standard OTEL_* variables set, each bad one reported and left out."""
    out: dict[str, dict[str, Any]] = {}
    for (section, key), name in otel_variables(env).items():
        try:
            # One variable at a time: otel_environment stops at the first bad one, which would hide the next.
            value = otel_environment({name: env[name]}, ConfigError)[section][key]
        except ConfigError as exc:
            problems.bad((section, key), str(exc))
            continue
        out.setdefault(section, {})[key] = value
    return out


def _run_otel_variables(env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(section, key) -> the RUN_OTEL_<SECTION>__<KEY> variable that sets it."""
    found = {}
    for name in env:
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == CONFIG_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        found[(section.lower(), key.lower())] = name
    return found


def _run_otel_values(env: Mapping[str, str], problems: Problems) -> dict[str, dict[str, Any]]:
    """The keys the RUN_OTEL_* variables set; one naming no key is reported by its own name."""
    out: dict[str, dict[str, Any]] = {}
    for (section, key), name in _run_otel_variables(env).items():
        if section not in SECTIONS:
            problems.add(
                f"{name}: unknown config section [{section}]{_did_you_mean(section, SECTIONS)} (known: {', '.join(SECTIONS)})"
            )
        elif key not in (hints := get_type_hints(SECTIONS[section])):
            known = f"(known in [{section}]: {', '.join(hints)})"
            problems.add(f"{name}: unknown config key {section}.{key}{_did_you_mean(key, hints)} {known}")
        else:
            out.setdefault(section, {})[key] = _env_value(env[name])
    return out


def _env_value(text: str) -> Any:
    """An environment value as TOML would read it (10, true, ["a"]), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _build_section(section: str, cls: type, values: Mapping[str, Any], problems: Problems) -> Any:
    """The section from the keys that are known and of the right type; the others are reported
    and keep their defaults, which the later checks then leave alone."""
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            problems.add(
                f"unknown config key {section}.{key}{_did_you_mean(key, hints)} (known in [{section}]: {', '.join(hints)})",
                (section, key),
            )
            continue
        try:
            kwargs[key] = _coerce(f"{section}.{key}", hints[key], value)
        except ConfigError as exc:
            problems.bad((section, key), str(exc))
    return cls(**kwargs)


def _coerce(name: str, hint: Any, value: Any) -> Any:
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_coerce(f"{name}[]", item, v) for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a table, got {value!r}")
        _key, item = get_args(hint)
        return {str(k): _coerce(f"{name}.{k}", item, v) for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name} must be a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported type {hint!r}")  # pragma: no cover


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """ ", did you mean port?" for a key one typo away from a known one, else nothing."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f", did you mean {close[0]}?" if close else ""
