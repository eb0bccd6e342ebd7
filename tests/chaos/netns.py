"""Network namespaces for partition tests: a veth pair into a namespace of the test's own."""

from __future__ import annotations

import subprocess

__all__ = ["ip"]


def ip(*args: str) -> None:
    """Run ``ip ARGS`` (iproute2); CalledProcessError with its stderr on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)
