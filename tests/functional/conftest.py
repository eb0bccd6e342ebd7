"""The functional tests run on real ZeroMQ sockets and servers; each topic's fixtures are in the
conftest.py of its folder, helpers shared by several topics in *_helpers.py here."""

import pytest

zmq = pytest.importorskip("zmq")
