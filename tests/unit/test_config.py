import argparse
from pathlib import Path

import pytest

from dfpubsub.config import PubSubSettings, Settings, add_config_arguments, load_settings, settings_from_args
from dfpubsub.errors import ConfigError
from dfpubsub.factory import create_driver

SAMPLE = Path(__file__).resolve().parents[2] / "etc" / "dfpubsub.toml"


def test_defaults_are_valid():
    s = load_settings()
    assert s.pubsub.max_idle_time == 5.0 and s.pubsub.driver.startswith("zmq+tcp://")


def test_sample_config_loads_and_documents_every_setting():
    from dfpubsub.drivers.zeromq import ZmqOptions

    s = load_settings(str(SAMPLE))
    assert s.model_dump(exclude={"driver"}) == Settings().model_dump(exclude={"driver"})
    assert ZmqOptions(**s.driver["zmq"]) == ZmqOptions()
    text = SAMPLE.read_text()
    for name in PubSubSettings.model_fields:
        assert f"\n{name} =" in text, f"{name} missing from etc/dfpubsub.toml"
    create_driver(s)  # the driver validates its own table


def test_precedence_flags_over_env_over_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[pubsub]\nmax_idle_time = 7\nmessage_delay_window = 0.2\n[log]\nlevel = "debug"\n')
    monkeypatch.setenv("DFPUBSUB_PUBSUB__MAX_IDLE_TIME", "8")
    assert load_settings(str(cfg)).pubsub.max_idle_time == 8
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--config", str(cfg), "--pubsub.max-idle-time", "9", "--pubsub.topics", "a, b"])
    s = settings_from_args(args)
    assert s.pubsub.max_idle_time == 9
    assert s.pubsub.message_delay_window == 0.2 and s.log.level == "debug"
    assert s.pubsub.topics == ["a", "b"]


@pytest.mark.parametrize(
    "toml,needle",
    [
        ("[pubsub]\nmax_idle_time = -1\n", "pubsub.max_idle_time"),
        ("[pubsub]\nmax_idle_time = 'soon'\n", "pubsub.max_idle_time"),
        ("[pubsub]\nbatch_max_bytes = 4096\nmax_message_bytes = 2048\n", "batch_max_bytes"),
        ("[pubsub]\nbatch_linger = 1.0\n", "batch_linger"),
        ("[pubsub]\nno_such_key = 1\n", "no_such_key"),
        ("[nonsense]\nx = 1\n", "nonsense"),
        ("[log]\nlevel = 'loud'\n", "log.level"),
        ("[cache]\ntombstone_horizon = 1\n", "tombstone_horizon"),
        ("[pubsub\n", "not valid TOML"),
    ],
)
def test_bad_config_gives_a_clear_error(tmp_path, toml, needle):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_settings(str(cfg))
    assert needle in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(str(tmp_path / "nope.toml"))


def test_driver_options_are_validated_by_the_driver(tmp_path):
    cfg = tmp_path / "z.toml"
    cfg.write_text("[driver.zmq]\nheartbeat_ivl = 5\nheartbeat_timeout = 1\n")
    with pytest.raises(ConfigError, match="heartbeat_timeout"):
        create_driver(load_settings(str(cfg)))
