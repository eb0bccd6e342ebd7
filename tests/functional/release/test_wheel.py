"""The built wheel, installed without extras in a fresh venv, as a new user gets it from PyPI."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the bin directory of a venv where it is installed without extras)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and reads
    # it while the other tests' processes write theirs (__pycache__), which once failed the build.
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("dfpubsub-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    bin_dir = tmp / "venv" / "bin"
    installed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return wheel, bin_dir


def _run(bin_dir: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120,
                          cwd=bin_dir.parent)


def test_the_wheel_carries_the_license_and_sample_config_and_no_benchmarks(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/LICENSE") or "/licenses/LICENSE" in n for n in names), names
    assert any(n.endswith("share/dfpubsub/dfpubsub.toml") for n in names)
    # What the systemd units name under the install prefix (docs/deploy.md, "Installing").
    for unit in ("df-controller", "df-feed", "df-notify", "df-archiver", "df-publisher-service"):
        assert any(n.endswith(f"share/dfpubsub/systemd/{unit}.service") for n in names), unit
    for shipped in ("share/doc/dfpubsub/deploy.md", "share/dfpubsub/prometheus/dfpubsub-alerts.yml",
                    "share/dfpubsub/grafana/dfpubsub.json"):
        assert any(n.endswith(shipped) for n in names), shipped
    assert "dfpubsub/py.typed" in names
    assert not [n for n in names if "/bench/" in n or n.startswith("tools/")]
    assert "dfpubsub/tools/df_keys.py" in names and "dfpubsub/drivers/zeromq/curve.py" in names


def test_without_extras_the_core_imports_and_every_missing_extra_is_named(installed):
    _, bin_dir = installed
    code = ("import dfpubsub\n"
            "from dfpubsub import load_driver, available_drivers\n"
            "from dfpubsub.errors import MissingExtra\n"
            "try:\n    load_driver('zmq')\nexcept MissingExtra as exc:\n    print(exc)\n"
            "load_driver('memory')\n")
    out = _run(bin_dir, "python", "-c", code)
    assert out.returncode == 0, out.stderr
    assert "pip install 'dfpubsub[zmq]'" in out.stdout
    db = _run(bin_dir, "df-db", "--help")
    assert db.returncode in (1, 2) and db.stderr.count("\n") == 1 and "dfpubsub[cli]" in db.stderr, db.stderr
    keys = _run(bin_dir, "df-keys", "list", ".")
    assert keys.returncode in (1, 2) and "dfpubsub[zmq]" in keys.stderr and "Traceback" not in keys.stderr
    # Every section but the options of the drivers whose extra is missing (they declare them).
    sample = _run(bin_dir, "df-config", "sample")
    full = (ROOT / "etc" / "dfpubsub.toml").read_text()
    assert sample.returncode == 0 and sample.stdout.split("\n[driver.")[0] == full.split("\n[driver.")[0]
    assert "[driver.memory]" in sample.stdout
    for script in ("df-controller", "df-notify", "df-feed", "df-publisher-service", "df-config", "df-keys"):
        version = _run(bin_dir, script, "--version")
        assert version.returncode == 0 and version.stdout.startswith(script), (script, version.stderr)
