import pytest

zmq = pytest.importorskip("zmq")
