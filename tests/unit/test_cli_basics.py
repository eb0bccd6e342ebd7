"""What every console script and a fresh install owe a newcomer: versions, focused help,
the generated sample configuration, and missing extras named instead of tracebacks."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dfpubsub.services import archiver, controller, feed, notify, publisher_service
from dfpubsub.tools import demo, df_config, df_db, df_keys, pipeline

from dfpubsub import __version__
from dfpubsub.backends.extras import needs_extra
from dfpubsub.config import Settings, load_settings
from dfpubsub.errors import ConfigError, MissingExtra
from dfpubsub.sample_config import render_sample

ROOT = Path(__file__).resolve().parents[2]
MAINS = {
    "df-controller": controller.main, "df-notify": notify.main, "df-publisher-service": publisher_service.main,
    "df-archiver": archiver.main, "df-feed": feed.main, "df-pipeline": pipeline.main, "df-demo": demo.main, "df-config": df_config.main,
    "df-keys": df_keys.main,
}


@pytest.mark.parametrize("prog", sorted(MAINS))
def test_every_console_script_prints_its_version(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        MAINS[prog](["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"{prog} {__version__}"


def test_df_db_prints_its_version(capsys):
    assert df_db.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"df-db {__version__}"


def test_the_sample_in_etc_is_the_generated_one_and_loads_as_the_defaults(tmp_path):
    sample = render_sample()
    assert (ROOT / "etc" / "dfpubsub.toml").read_text() == sample, "regenerate: df-config sample > etc/dfpubsub.toml"
    path = tmp_path / "dfpubsub.toml"
    path.write_text(sample)
    assert load_settings(str(path)).model_dump() == Settings().model_dump() | {"driver": tomllib.loads(sample)["driver"]}


def test_df_config_check_prints_one_line_per_problem(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[pubsub]\nmax_idle_time = -1\n")
    assert df_config.main(["check", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("df-config: invalid configuration") and "pubsub.max_idle_time" in err


def test_a_daemon_shows_only_its_sections_and_takes_hyphenated_section_flags(capsys):
    with pytest.raises(SystemExit):
        publisher_service.main(["--help"])
    text = capsys.readouterr().out
    assert "[publisher_service]" in text and "--publisher-service.announce" in text and "[archive]" not in text
    with pytest.raises(SystemExit):
        controller.main(["--help"])
    text = capsys.readouterr().out
    assert "[controller]" in text and "[notify]" not in text


def test_a_missing_library_names_its_extra():
    exc = ModuleNotFoundError("No module named 'zmq'", name="zmq")
    with pytest.raises(MissingExtra, match=r"pip install 'dfpubsub\[zmq\]'"):
        with needs_extra("driver 'zmq'"):
            raise exc
    with pytest.raises(ModuleNotFoundError), needs_extra("x"):
        raise ModuleNotFoundError("No module named 'nothing_we_know'", name="nothing_we_know")


def test_without_pyzmq_the_driver_and_df_db_without_typer_say_which_extra():
    # A fresh interpreter in which the library cannot be imported, as on an install without the extra.
    code = (
        "import sys; sys.modules['zmq'] = None; sys.modules['typer'] = None\n"
        "from dfpubsub.plugins import driver_status, load_driver\n"
        "from dfpubsub.errors import MissingExtra\n"
        "print(driver_status()['zmq']); print(driver_status()['memory'] == '')\n"
        "try:\n    load_driver('zmq')\nexcept MissingExtra as e:\n    print(e)\n"
        "from dfpubsub.tools.df_db import main\nsys.exit(main(['tables']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[0] == "driver 'zmq' needs zmq, which is not installed: pip install 'dfpubsub[zmq]'"
    assert lines[1] == "True" and lines[2] == lines[0]
    assert out.returncode == 2 and out.stderr.strip() == (
        "df-db: df-db needs typer, which is not installed: pip install 'dfpubsub[cli]'")


def test_sqlite_urls_read_as_sqlalchemy_does(tmp_path, monkeypatch):
    from dfpubsub.backends.sqlite import sqlite_path

    monkeypatch.chdir(tmp_path)
    assert sqlite_path("sqlite:///nb.sqlite") == "nb.sqlite"
    assert sqlite_path("sqlite:///data/nb.sqlite") == "data/nb.sqlite"  # relative, created under ./data
    assert sqlite_path(f"sqlite:///{tmp_path}/nb.sqlite") == f"{tmp_path}/nb.sqlite"  # four slashes: absolute
    assert sqlite_path("sqlite:///:memory:") == ":memory:"
    old = f"sqlite://{tmp_path}/nb.sqlite"  # three slashes before an absolute path: the old reading
    with pytest.warns(FutureWarning, match="sqlite:////"):
        assert sqlite_path(old) == f"{tmp_path}/nb.sqlite"
    for bad in ("sqlite://", "sqlite:///", "sqlite:nb.sqlite"):
        with pytest.raises(ConfigError):
            sqlite_path(bad)


def test_df_db_global_options_are_hoisted_before_the_command():
    from dfpubsub.tools.df_db.app import hoist_global_options

    assert hoist_global_options(["tables", "-o", "json"]) == ["-o", "json", "tables"]
    assert hoist_global_options(["get", "t", "k", "--store=x", "-ojson"]) == ["--store=x", "-ojson", "get", "t", "k"]
    assert hoist_global_options(["add", "t", "--", "-o", "x"]) == ["add", "t", "--", "-o", "x"]
    assert hoist_global_options(["rm", "t", "k", "--yes"]) == ["rm", "t", "k", "--yes"]
