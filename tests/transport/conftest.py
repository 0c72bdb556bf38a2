"""Fixtures for the transport tests: a test PKI (made once per session) and TLS contexts.

The PKI needs ``cryptography`` and the ``require`` policy pyOpenSSL; tests that use them
are skipped when those are not installed.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("cryptography")
    from transport.certs import make_pki

    return make_pki(Path(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="session")
def server_ctx(pki: Any) -> ssl.SSLContext:
    """nsqd's context with no client-auth policy."""
    from nsqpy.transport import server_tls_context

    ctx = server_tls_context(pki.server_cert, pki.server_key)
    assert isinstance(ctx, ssl.SSLContext)
    return ctx


@pytest.fixture(scope="session")
def client_ctx(pki: Any) -> ssl.SSLContext:
    """A client trusting the test CA, without a client certificate."""
    from nsqpy.transport import client_tls_context

    return client_tls_context(root_ca_file=pki.ca_cert)
