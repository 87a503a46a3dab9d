"""Fixtures on a real S3 server on loopback (:class:`scripts.s3_server.S3Server`, SeaweedFS).

A plugin of the whole suite (``pytest_plugins`` in ``tests/conftest.py``), so any test can ask for
them by name and ``s3_server`` is one server per test process. (Imported into each test module
instead, each module would define a fixture of its own, each with its own server.) ``s3`` is the
same server with ``MSC_CONFIG`` pointing at its config for the test.
"""

from __future__ import annotations

import pytest

from scripts.s3_server import S3Server, free_ports, weed_binary

__all__ = ["S3Server", "free_ports", "s3", "s3_server", "weed_binary"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """One SeaweedFS for the test session (stopped at its end)."""
    server = S3Server.launch(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch) -> S3Server:
    """The session's server, with ``MSC_CONFIG`` set to its profiles for this test."""
    monkeypatch.setenv("MSC_CONFIG", str(s3_server.msc_config))
    return s3_server
