import pytest

from dfpubsub import DriverNotFound, available_drivers, load_driver
from dfpubsub.errors import ConfigError
from dfpubsub.plugins import parse_driver_url


def test_builtin_drivers_are_registered_as_entry_points():
    assert {"memory", "zmq"} <= set(available_drivers())


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("zmq+tcp://10.0.0.1:8866", ("zmq", "tcp://10.0.0.1:8866")),
        ("zmq+ipc:///run/df.sock", ("zmq", "ipc:///run/df.sock")),
        ("redis://localhost:6379/0", ("redis", "redis://localhost:6379/0")),
        ("memory", ("memory", None)),
    ],
)
def test_parse_driver_url(spec, expected):
    assert parse_driver_url(spec) == expected


def test_load_by_name_and_url():
    assert load_driver("memory").name == "memory"
    drv = load_driver("zmq+tcp://127.0.0.1:1")
    assert drv.name == "zmq" and drv.url == "tcp://127.0.0.1:1"


def test_unknown_driver_lists_the_known_ones():
    with pytest.raises(DriverNotFound) as err:
        load_driver("carrier-pigeon://x")
    assert "carrier-pigeon" in str(err.value) and "memory" in str(err.value) and "zmq" in str(err.value)


def test_bad_driver_options_are_config_errors():
    with pytest.raises(ConfigError):
        load_driver("zmq+tcp://127.0.0.1:1", {"sndhwm": 0})
    with pytest.raises(ConfigError):
        load_driver("zmq+udp://127.0.0.1:1")
    with pytest.raises(ConfigError):
        load_driver("memory", {"queue_size": "big"})


def test_import_dfpubsub_needs_no_backend():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('zmq', 'aetcd', 'grpc', 'redis', 'pyspark'): sys.modules[m] = None\n"
        "import dfpubsub, dfpubsub.drivers, dfpubsub.store, dfpubsub.controller, dfpubsub.nbapi\n"
        "s = dfpubsub.open_store('sqlite:///:memory:', ['t']); s.create('t', 'k', 1); s.close()\n"
        "try:\n    dfpubsub.load_driver('zmq')\nexcept ImportError:\n    print('lazy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "lazy"
