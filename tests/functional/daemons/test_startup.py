"""One start-up policy for every daemon (docs/deploy.md): a bad setting is one line and exit 2,
checked by the same code as ``df-config check``; a store that does not exist is one line and
exit 1, never created by a typo; ``[store] create`` (or ``df-db init``) creates it."""

import json
import os
import subprocess

import pytest

from dfpubsub import open_store
from tests.conftest import wait_for
from tests.functional.daemon_helpers import DAEMONS, DaemonProcess, daemon_args, exe

STORE_USERS = ("df-controller", "df-feed", "df-notify")

#: Settings every daemon must refuse before it opens anything, and df-config check with them.
BAD_SETTINGS = [
    (["--store.url", "bogus://x"], "store.url: unknown backend URL"),
    (["--store.url", "etcd://127.0.0.1:70000"], "port 70000 is not between 1 and 65535"),
    (["--store.url", "redis://127.0.0.1:99999/0"], "store.url: Redis URL"),
    (["--leader.url", "etcd://127.0.0.1:70000"], "leader.url: "),
    (["--leader.url", "bogus://x"], "leader.url: unknown backend URL"),
    (["--pubsub.driver", "bogus://x"], "pubsub.driver: unknown pub/sub driver 'bogus'"),
    (["--pubsub.driver", "zmq+tcp://127.0.0.1:70000"], "pubsub.driver: zmq URL"),
    (["--pubsub.topics", "bad table!"], "pubsub.topics: topic name 'bad table!'"),
]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("name", STORE_USERS)
def test_a_missing_store_is_refused_and_not_created(tmp_path, name):
    missing = tmp_path / "typo" / "nb.sqlite"
    out = run([exe(name), *daemon_args(name, tmp_path, f"sqlite:///{missing}"), "--log.format", "json"])
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{name}: no database at {missing}") and "df-db init" in last, out.stderr
    assert "Traceback" not in out.stderr
    assert not missing.parent.exists(), "the daemon created the store's folder"


@pytest.mark.parametrize("name", STORE_USERS)
def test_store_create_setting_creates_it(tmp_path, name):
    path = tmp_path / "new" / "nb.sqlite"
    _ready_having_made(path, name, daemon_args(name, tmp_path, f"sqlite:///{path}") + ["--store.create", "true"])


def _ready_having_made(path, name, args, env=None):
    """Daemon ``name`` turns ready, ``path`` exists, and a SIGTERM stops it cleanly."""
    d = DaemonProcess(name, args, env=env)
    try:
        d.wait_status("/readyz", 200)
        assert path.exists()
        assert d.terminate() == 0
    finally:
        d.kill()


def test_df_db_init_creates_the_store_daemons_then_open(tmp_path):
    path = tmp_path / "nb.sqlite"
    url = f"sqlite:///{path}"
    init = run([exe("df-db"), "--store", url, "-o", "json", "init"])
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["backend"] == "sqlite"
    d = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, url))
    try:
        d.wait_status("/readyz", 200)
        assert d.terminate() == 0
    finally:
        d.kill()


#: Every daemon that opens discovery, and the flag that makes it: those that watch it, and those
#: that announce in it.
DISCOVERY_USERS = [("df-controller", "--controller.discover"), ("df-archiver", "--archive.discover"),
                   ("df-feed", "--feed.announce"), ("df-publisher-service", "--publisher-service.announce")]


@pytest.mark.parametrize("name,flag", DISCOVERY_USERS)
def test_a_missing_discovery_table_is_refused_and_not_created(tmp_path, name, flag):
    """A daemon that watches discovery for its publishers, given a mistyped SQLite path, would
    wait in an empty table of its own for publishers that announce elsewhere; one that announces
    would announce where nobody watches."""
    store = tmp_path / "nb.sqlite"
    open_store(f"sqlite:///{store}", ["port"]).close()
    missing = tmp_path / "typo" / "discovery.sqlite"
    out = run([exe(name), *daemon_args(name, tmp_path, f"sqlite:///{store}"), flag, "true",
               "--discovery.url", f"sqlite:///{missing}"])
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{name}: no database at {missing}") and "discovery.url" in last, out.stderr
    assert not missing.parent.exists()


@pytest.mark.parametrize("name,flag", DISCOVERY_USERS[2:])
def test_store_create_setting_creates_the_discovery_table_an_announcer_uses(tmp_path, name, flag):
    store = tmp_path / "nb.sqlite"
    open_store(f"sqlite:///{store}", ["port"]).close()
    path = tmp_path / "new" / "discovery.sqlite"
    # [store] create from the shared file's side: df-publisher-service has no [store] flags.
    _ready_having_made(path, name, daemon_args(name, tmp_path, f"sqlite:///{store}") + [
        flag, "true", "--discovery.url", f"sqlite:///{path}"], env={"DFPUBSUB_STORE__CREATE": "true"})


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_a_server_store_never_made_is_refused_until_df_db_init(tmp_path, request, backend):
    """On etcd and Redis a mistyped address, database or prefix finds nothing, as a new store
    would: the daemons that open the store refuse one that nobody made or wrote to, naming
    where they looked, and open it once df-db init has made it."""
    server = request.getfixturevalue(f"{backend}_server")
    url = server.url
    for name in STORE_USERS:  # df-notify: its queues share the store's server and prefix
        out = run([exe(name), *daemon_args(name, tmp_path, url), "--store.prefix", "typo", "--log.format", "json"])
        assert out.returncode == 1, out.stderr
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{name}: no store at {url} under prefix 'typo'") and "df-db init" in last, out.stderr
        assert "Traceback" not in out.stderr
    with open_store(url, ["port"], prefix="typo") as store:
        assert not store.initialized(), "refusing to start made the store"
    init = run([exe("df-db"), "--store", url, "-o", "json", "init"], env={**os.environ, "DFPUBSUB_STORE__PREFIX": "typo"})
    assert init.returncode == 0, init.stderr
    for name in ("df-controller", "df-notify"):
        d = DaemonProcess(name, daemon_args(name, tmp_path, url, store__prefix="typo"))
        try:
            d.wait_status("/readyz", 200)
            assert d.terminate() == 0
        finally:
            d.kill()


@pytest.mark.parametrize("flags,message", BAD_SETTINGS, ids=[" ".join(f) for f, _ in BAD_SETTINGS])
def test_df_config_check_refuses_what_every_daemon_refuses(tmp_path, flags, message):
    store = tmp_path / "nb.sqlite"
    open_store(f"sqlite:///{store}", ["port"]).close()
    checked = run([exe("df-config"), "check", *flags])
    assert checked.returncode == 2 and message in checked.stderr, checked.stderr
    refusal = checked.stderr.strip().split(": ", 1)[1]
    for name in DAEMONS:
        args = daemon_args(name, tmp_path, f"sqlite:///{store}")
        if flags[0] == "--leader.url" or (name == "df-publisher-service" and flags[0] == "--store.url"):
            # A setting the daemon has no flag for: the shared file's value, refused all the same.
            env = {**os.environ, f"DFPUBSUB_{flags[0][2:].upper().replace('.', '__')}": flags[1]}
            out = run([exe(name), *args], env=env)
        else:
            out = run([exe(name), *args, *flags])
        assert out.returncode == 2, (name, out.stderr)
        assert out.stderr.strip().splitlines()[-1] == f"{name}: {refusal}", (name, out.stderr)


def test_df_config_check_passes_a_good_configuration(tmp_path):
    out = run([exe("df-config"), "check", "--store.url", "etcd://10.0.0.1:2379,10.0.0.2:2379",
               "--pubsub.driver", "zmq+tcp://0.0.0.0:8866"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["store"]["url"] == "etcd://10.0.0.1:2379,10.0.0.2:2379"


def test_an_unreachable_store_is_retried_while_readyz_says_why(tmp_path, etcd_server):
    """etcd down at start: the daemon waits (it does not exit, nor invent anything), /readyz names
    the store, /livez passes; once etcd is up it syncs and turns ready."""
    url = etcd_server.url
    with open_store(url, ["port"]) as store:
        store.initialize()
    etcd_server.kill()
    d = DaemonProcess("df-feed", daemon_args("df-feed", tmp_path, url))
    try:
        body = d.wait_status("/readyz", 503)
        wait_for(lambda: "store failed: unreachable" in d.get("/readyz")[1], what="readyz to name the store")
        assert d.get("/livez")[0] == 200
        assert d.proc.poll() is None
        etcd_server.restart()
        d.wait_status("/readyz", 200, what="df-feed to turn ready once etcd is back")
        assert d.terminate() == 0
        assert "synced" in body
    finally:
        d.kill()
