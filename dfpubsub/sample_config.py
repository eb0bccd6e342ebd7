"""The sample configuration, written from the settings' one declaration (oslo-config-generator style).

Every section of :class:`~dfpubsub.config.Settings` and every installed
driver's options model (``Driver.options_model``) becomes a TOML table whose
keys show their defaults, each under its help text, so ``etc/dfpubsub.toml``
(a test holds it equal to :func:`render_sample`) cannot drift from the code.
"""

from __future__ import annotations

import json
import re
import textwrap
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from .config import _SECTIONS, CONFIG_ENV, Settings

__all__ = ["render_sample"]

_HEADER = f"""\
# dfpubsub sample configuration, generated from the settings' declaration (df-config sample).
# Every key is optional; the values shown are the defaults.
# Precedence: flags (--pubsub.max-idle-time 3) > environment
# (DFPUBSUB_PUBSUB__MAX_IDLE_TIME=3) > this file (--config or ${CONFIG_ENV}) > defaults.
"""


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), 96, initial_indent="# ", subsequent_indent="# ")


def _table(name: str, model: type[BaseModel]) -> list[str]:
    lines = [f"[{name}]"]
    # Docstrings open with the table's name ("``[pubsub]``: the transport..."): the header says it.
    doc = re.sub(r"^``\[[\w.]+\]``[:.]?\s*", "", (model.__doc__ or "").strip().split("\n\n")[0])
    doc = re.sub(r":\w+:`([^`]+)`", r"\1", doc).replace("``", "")
    if doc:
        lines += _comment(doc if doc.startswith("df-") else doc[:1].upper() + doc[1:])
    for field, info in model.model_fields.items():
        lines += _comment(info.description or field)
        default = info.get_default(call_default_factory=True)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if default is None:  # unset by default: shown commented out, as a placeholder
            lines.append(f'# {field} = ""')
        elif extra.get("octal"):
            lines.append(f"{field} = {default:#o}")
        else:
            lines.append(f"{field} = {_toml(default)}")
    return lines


def _driver_models() -> list[tuple[str, type[BaseModel]]]:
    """The options models of the installed drivers that load (a missing extra hides its driver)."""
    models = []
    for ep in sorted(entry_points(group="dfpubsub.drivers"), key=lambda e: e.name):
        try:
            cls = ep.load()
        except ImportError:
            continue
        model = getattr(cls, "options_model", None)
        if model is not None:
            models.append((ep.name, model))
    return models


def render_sample() -> str:
    """The sample configuration file's text."""
    blocks = [_HEADER.rstrip("\n").split("\n")]
    for name in Settings.model_fields:
        if name in _SECTIONS:
            blocks.append(_table(name, _SECTIONS[name]))
    for name, model in _driver_models():
        blocks.append(_table(f"driver.{name}", model))
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"
