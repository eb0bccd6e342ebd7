"""df-pipeline checks its inputs, Java and the master before it starts a JVM: one line, exit 1 or 2.

In-process, with the Spark session's builder replaced by one that fails the
test; and once as operators run it, with a JAVA_HOME without Java (a run that
started a JVM would fail on that instead).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from dfpubsub.tools.pipeline import main

from tests.conftest import free_port

PIPELINE = shutil.which("df-pipeline", path=os.path.dirname(sys.executable))


def no_spark(*args: object, **kwargs: object) -> None:
    pytest.fail("df-pipeline started Spark before it checked its inputs")


@pytest.fixture
def log(tmp_path):
    (tmp_path / "log").mkdir()
    return str(tmp_path / "log")


@pytest.mark.parametrize("args, status, message", [
    (["compact", "--log", "{tmp}/missing", "--snapshot", "{tmp}/snap"], 1, "no event log at {tmp}/missing"),
    (["audit", "--log", "{tmp}/missing", "--out", "{tmp}/out"], 1, "no event log at {tmp}/missing"),
    (["compact", "--log", "{tmp}/file", "--snapshot", "{tmp}/snap"], 1, "the event log at {tmp}/file is not a directory"),
    (["compact", "--log", "{log}", "--snapshot", "{tmp}/no/such/snap"], 1, "cannot make the snapshot"),
    (["bootstrap", "--snapshot", "{tmp}/snap"], 1, "no snapshot at {tmp}/snap"),
    (["audit", "--log", "{log}", "--out", "{tmp}/out", "--since", "2026-13-01"], 2, "--since takes a date as YYYY-MM-DD"),
    (["audit", "--log", "{log}", "--out", "{tmp}/out", "--since", "2026-02-01", "--until", "2026-01-01"], 2,
     "--since 2026-02-01 is after --until 2026-01-01"),
    (["audit", "--log", "{log}", "--out", "{tmp}/out", "--bucket", "0"], 2, "--bucket takes a positive number"),
    (["--master", "spark://127.0.0.1:{port}", "compact", "--log", "{log}", "--snapshot", "{tmp}/snap"], 1,
     "no Spark master answers at spark://127.0.0.1:{port}"),
    (["--master", "spark:/x", "compact", "--log", "{log}", "--snapshot", "{tmp}/snap"], 2, "--master 'spark:/x'"),
    (["--conf", "nokey", "compact", "--log", "{log}", "--snapshot", "{tmp}/snap"], 2, "--conf takes KEY=VALUE"),
    (["compact", "--log", "{log}", "--snapshot", "{tmp}/snap"], 1, "JAVA_HOME={tmp}/no-java has no bin/java"),
])
def test_a_bad_input_is_one_line_before_any_jvm(tmp_path, log, args, status, message, monkeypatch, capsys):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    monkeypatch.setattr("dfpubsub.pipeline.build_session", no_spark)
    (tmp_path / "file").write_text("")
    fill = {"tmp": str(tmp_path), "log": log, "port": str(free_port())}
    code = main([a.format(**fill) for a in args])
    out, err = capsys.readouterr()
    assert (code, out, err.count("\n")) == (status, "", 1), err
    assert err.startswith("df-pipeline: ") and message.format(**fill) in err


def test_a_missing_event_log_is_one_line_from_the_console_script(tmp_path):
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    done = subprocess.run([PIPELINE, "compact", "--log", str(tmp_path / "missing"), "--snapshot", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"df-pipeline: no event log at {tmp_path}/missing\n"
