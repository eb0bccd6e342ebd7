"""Every console script turns a bad flag, config file, environment or URL into one line on stderr
and exit status 1 or 2, never a traceback (dfpubsub/console.py)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
from dfpubsub.tools.df_db.items import parse_items

from dfpubsub.config import load_settings
from dfpubsub.errors import ConfigError, InputError

BIN = os.path.dirname(sys.executable)
PIPELINE = "df-pipeline audit --log x --out y"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    (root / "latin1.toml").write_bytes(b"[store]\nurl = \"sqlite:///caf\xe9.db\"\n")
    (root / "bad.toml").write_text("[pubsub\n")
    (root / "unknown.toml").write_text("[pubsub]\nno_such_setting = 1\n")
    (root / "nan.json").write_text('{"key": "k", "value": NaN}')
    return root


# (command line, environment, exit status): {files} is the fixture's directory. Every script
# meets each kind of mistake at least once. They run in this process through the very ``main``
# the console scripts call (setup.cfg), as starting Python per row would take a minute.
CASES = [
    *((f"{script} --no-such-flag", {}, 2) for script in (
        "df-controller", "df-notify", "df-publisher-service", "df-archiver", "df-db ls", "df-demo", PIPELINE,
        "df-feed", "df-config check")),
    *((f"{script} --config {{files}}", {}, 2) for script in (
        "df-controller", "df-notify", "df-publisher-service", "df-archiver", "df-db")),
    ("df-db --config {files}/latin1.toml ls port", {}, 2),
    ("df-controller --config {files}/latin1.toml", {}, 2),
    ("df-notify --config {files}/bad.toml", {}, 2),
    ("df-archiver --config {files}/nope.toml", {}, 2),
    ("df-publisher-service --config {files}/unknown.toml", {}, 2),
    ("df-feed --config {files}/bad.toml", {}, 2),
    ("df-config check --config {files}/latin1.toml", {}, 2),
    ("df-db ls port", {"DFPUBSUB_CONFIG": "{files}"}, 2),
    ("df-controller", {"DFPUBSUB_PUBSUB__MAX_IDLE_TIME": "soon"}, 2),
    ("df-feed", {"DFPUBSUB_ETCD__CERT_FILE": "{files}/nope.pem"}, 2),
    ("df-db ls port", {"DFPUBSUB_ETCD__PASSWORD": "x"}, 2),
    ("df-notify", {"DFPUBSUB_REDIS__PASSWORD": "a", "DFPUBSUB_REDIS__PASSWORD_FILE": "{files}/bad.toml"}, 2),
    ("df-keys show {files}/bad.toml", {}, 2),
    ("df-keys generate {files} ../x", {}, 2),
    ("df-db ls port", {"DFPUBSUB_STORE__URL": "etcd://127.0.0.1:99999"}, 2),
    ("df-controller", {"DFPUBSUB_STORE__URL": "etcd://127.0.0.1:99999"}, 2),
    ("df-notify", {"DFPUBSUB_STORE__URL": "etcd://127.0.0.1:http"}, 2),
    ("df-controller", {"DFPUBSUB_STORE__URL": "redis://127.0.0.1:x/0"}, 2),
    ("df-controller", {"DFPUBSUB_STORE__URL": "mongo://x"}, 2),
    ("df-db add port --no-publish --file {files}/nan.json", {"DFPUBSUB_STORE__URL": "sqlite:///{files}/nb.sqlite"}, 1),
]

MAINS = {
    "df-controller": "dfpubsub.services.controller", "df-notify": "dfpubsub.services.notify",
    "df-publisher-service": "dfpubsub.services.publisher_service", "df-archiver": "dfpubsub.services.archiver",
    "df-db": "dfpubsub.tools.df_db", "df-demo": "dfpubsub.tools.demo", "df-pipeline": "dfpubsub.tools.pipeline",
    "df-feed": "dfpubsub.services.feed", "df-config": "dfpubsub.tools.df_config", "df-keys": "dfpubsub.tools.df_keys",
}


def _env(env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("DFPUBSUB_")}
    full.update({"DFPUBSUB_PUBSUB__DRIVER": "memory", **env})
    return full


def _run(argv, env):
    """The installed console script ``argv[0]``, in a process of its own."""
    return subprocess.run([shutil.which(argv[0], path=BIN), *argv[1:]], env=_env(env), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def _wrong(status, stderr, expected, prog) -> str | None:
    """Why (``status``, ``stderr``) is not one line on stderr with exit ``expected``, or None. A daemon
    that read its settings and then cannot open a backend says so in its structured log (one JSON line)."""
    if "Traceback" in stderr or stderr.count("\n") != 1:
        return f"exit {status}, stderr {stderr!r}"
    if stderr.startswith("{"):
        logged = json.loads(stderr)
        if status == 1 and logged["level"] == "error" and logged["msg"] == "cannot start":
            return None
    if status != expected or not stderr.startswith(f"{prog}: "):
        return f"exit {status}, stderr {stderr!r}"
    return None


@pytest.fixture
def root_logger():
    """A daemon's main sets up the root logger: put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_logger")
@pytest.mark.parametrize("line, env, status", CASES, ids=[f"{c[0].split()[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_flags_files_environment_and_urls_are_one_line_and_exit_1_or_2(files, monkeypatch, capfd,
                                                                          line, env, status):
    argv = line.format(files=files).split()
    for name in [n for n in os.environ if n.startswith("DFPUBSUB_")]:
        monkeypatch.delenv(name)
    for name, value in _env({k: v.format(files=files) for k, v in env.items()}).items():
        monkeypatch.setenv(name, value)
    main = importlib.import_module(MAINS[argv[0]]).main
    try:
        got = main(argv[1:])
    except SystemExit as exc:  # argparse's own exit after a usage error
        got = exc.code
    assert _wrong(got, capfd.readouterr().err, status, argv[0]) is None


def test_the_installed_scripts_are_guarded(files):
    for argv, env in ((["df-db", "--config", str(files), "ls", "port"], {}),
                      (["df-controller"], {"DFPUBSUB_PUBSUB__MAX_IDLE_TIME": "soon"})):
        out = _run(argv, env)
        assert _wrong(out.returncode, out.stderr, 2, argv[0]) is None


def test_metrics_port_in_use_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _run(["df-controller", "--metrics.port", str(port)],
                   {"DFPUBSUB_STORE__URL": f"sqlite:///{tmp_path}/nb.sqlite"})
    assert _wrong(out.returncode, out.stderr, 2, "df-controller") is None
    assert f"cannot serve metrics on 127.0.0.1:{port}" in out.stderr


@pytest.mark.parametrize("value, why", [
    ('{"key": "k", "value": NaN}', "NaN is not a JSON number"),
    ('{"key": "k", "value": [-Infinity]}', "-Infinity is not a JSON number"),
    ('{"key": "k", "value": ' + "[" * 3000 + "]" * 3000 + "}", "nested too deeply"),
    ('{"key": "k", "value": ' + "[" * 120 + "]" * 120 + "}", "nested more than 100 levels"),
    ('{"key": "k", "value": ' + "9" * 5000 + "}", "digits"),
])
def test_df_db_refuses_values_no_reader_could_take(value, why):
    with pytest.raises(InputError, match=why):
        parse_items(value, "the argument", update=False)


def test_a_value_within_the_limits_is_taken():
    assert parse_items('{"key": "k", "value": ' + "[" * 98 + "]" * 98 + "}", "x", update=False)[0].key == "k"


@pytest.mark.parametrize("value, parsed", [("a,b", ["a", "b"]), (" a , b ,", ["a", "b"]), ('["a", "b"]', ["a", "b"])])
def test_a_list_setting_in_the_environment_takes_a_comma_list_or_json(monkeypatch, value, parsed):
    monkeypatch.setenv("DFPUBSUB_PUBSUB__TOPICS", value)
    assert load_settings().pubsub.topics == parsed


def test_config_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DFPUBSUB_PUBSUB__MAX_IDLE_TIME", "soon")
    monkeypatch.setenv("DFPUBSUB_PUBSUB__BATCH_LINGER", "never")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "\n" not in str(err.value) and "max_idle_time" in str(err.value) and "batch_linger" in str(err.value)
