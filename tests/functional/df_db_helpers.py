"""Running the installed df-db console script in tests (test_df_db*.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["EXE", "base_env", "df_db", "ok", "refused"]

EXE = os.path.join(os.path.dirname(sys.executable), "df-db")


def base_env(**settings: str) -> dict[str, str]:
    """The environment without the developer's dfpubsub settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFPUBSUB_")}
    env["DFPUBSUB_PUBSUB__DRIVER"] = "memory"  # writes publish, to nobody, unless a test says otherwise
    env.update(settings)
    return env


def df_db(env: dict[str, str], *args: str, stdin: int | None = subprocess.DEVNULL,
          timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the installed ``df-db ARGS`` (stdin not a terminal unless given)."""
    return subprocess.run([EXE, *args], env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout)


def ok(env: dict[str, str], *args: str) -> object:
    """Run ``df-db -o json ARGS``; it must succeed; its stdout parsed."""
    out = df_db(env, "-o", "json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def refused(env: dict[str, str], *args: str, status: int = 1, stdin: int | None = subprocess.DEVNULL) -> str:
    """Run ``df-db ARGS``; it must fail with ``status`` and one line on stderr, which is returned."""
    out = df_db(env, *args, stdin=stdin)
    assert out.returncode == status, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    if status == 1:
        assert out.stderr.startswith("df-db: ") and out.stderr.count("\n") == 1, out.stderr
    return out.stderr
