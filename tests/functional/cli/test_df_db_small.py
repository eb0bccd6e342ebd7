"""df-db as issue 28 found it: a refused rm says nothing about publishing, reads write nothing,
-o yaml, ls --prefix/--limit, shell completion; and the daemons' text logs keep their fields."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from dfpubsub import open_store
from tests.functional.df_db_helpers import EXE, base_env, df_db, ok, refused


def tables_of(path):
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def store_with(tmp_path, keys):
    path = tmp_path / "nb.sqlite"
    store = open_store(f"sqlite:///{path}", ["port", "network"])
    for k in keys:
        store.create("port", k, {"k": k})
    store.close()
    return path, base_env(DFPUBSUB_STORE__URL=f"sqlite:///{path}", DFPUBSUB_STORE__TABLES="port,network")


def test_rm_without_yes_refuses_before_saying_anything_about_publishing(tmp_path):
    path, env = store_with(tmp_path, ["a"])
    env["DFPUBSUB_PUBSUB__DRIVER"] = "zmq+tcp://127.0.0.1:0"  # a bound publisher: the one that warns
    err = refused(env, "rm", "port", "a")
    assert err.startswith("df-db: refusing without --yes") and "stored all the same" not in err
    assert ok(env, "get", "port", "a")["key"] == "a"
    err = refused(env, "clean")
    assert err.startswith("df-db: refusing without --yes")


def test_read_only_commands_add_no_table(tmp_path):
    path, env = store_with(tmp_path, ["a"])
    before = tables_of(path)
    assert ok(env, "publishers") == []
    out = df_db(env, "-o", "json", "doctor")
    assert out.returncode == 0, out.stderr
    ok(env, "ls", "port")
    assert tables_of(path) == before


def test_yaml_output(tmp_path):
    _, env = store_with(tmp_path, ["a", "b"])
    out = df_db(env, "-o", "yaml", "get", "port", "a")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['table: "port"', 'key: "a"', 'topic: "port"',
                                       f'version: {ok(env, "get", "port", "a")["version"]}', "value:", '  k: "a"']
    out = df_db(env, "-o", "yaml", "ls", "port")
    assert out.stdout.startswith('- table: "port"\n  key: "a"\n  topic: "port"\n'), out.stdout


def test_ls_prefix_and_limit(tmp_path):
    _, env = store_with(tmp_path, ["net-1", "net-2", "net-3", "vm-1"])
    assert [d["key"] for d in ok(env, "ls", "port", "--prefix", "net-")] == ["net-1", "net-2", "net-3"]
    out = df_db(env, "-o", "json", "ls", "port", "--prefix", "net-", "--limit", "2")
    assert out.returncode == 0
    assert [d["key"] for d in __import__("json").loads(out.stdout)] == ["net-1", "net-2"]
    assert "1 more key(s)" in out.stderr


def test_shell_completion():
    env = {**os.environ, "COMP_WORDS": "df-db ta", "COMP_CWORD": "1", "_DF_DB_COMPLETE": "complete_bash"}
    out = subprocess.run([EXE], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["tables"]
    # The script, named by the shell rather than detected: --show-completion detects the shell this
    # process runs under (sh, when the suite was started from sh -c) and takes no argument.
    script = subprocess.run([EXE], env={**os.environ, "_DF_DB_COMPLETE": "source_bash"}, capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0 and "_df_db_completion" in script.stdout


def test_text_logs_keep_their_fields(tmp_path):
    path, _ = store_with(tmp_path, ["a"])
    exe = os.path.join(os.path.dirname(sys.executable), "df-controller")
    proc = subprocess.Popen([exe, "--store.url", f"sqlite:///{path}", "--store.tables", "port,network",
                             "--pubsub.driver", "zmq+tcp://127.0.0.1:0", "--log.format", "text"],
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "df-controller: reconcile " in line:
                break
        assert "table=port" in line and "key=a" in line and "version=" in line, line
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_the_package_is_typed():
    import dfpubsub

    assert (Path(dfpubsub.__file__).parent / "py.typed").exists()


def test_the_old_three_slash_form_warns_on_stderr_once(tmp_path):
    """df-db.md says so: Python hides a DeprecationWarning, so it is a FutureWarning, one line."""
    store_with(tmp_path, [])
    url = f"sqlite:///{str(tmp_path).lstrip('/')}/nb.sqlite"  # its folder exists only from /
    out = subprocess.run([EXE, "--store", url, "init"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=base_env())
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("df-db: warning: ") == 1 and "Write sqlite:////" in out.stderr, out.stderr
