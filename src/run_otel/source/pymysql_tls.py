"""PyMySQL's "preferred" TLS without the system's CA store.

In its preferred mode (``source.tls_mode = "preferred"``, the default) PyMySQL
encrypts where the server offers TLS and verifies nothing, yet builds each
connection's context with ``ssl.create_default_context()``, which loads every
certificate of the system's CA store: 20 to 50 ms of CPU a connection, for
certificates it never checks. A backfill with two workers opens five
connections. Here the connections get one context built without them, with the
same protocol floor and options, and PyMySQL's own hook
(``Connection._create_ssl_ctx``) is kept for every mode that verifies. A PyMySQL
release without that hook makes its own context again: slower, the same session.
"""

from __future__ import annotations

import ssl
from typing import Any

from pymysql.connections import Connection
from sqlalchemy import Engine, event


def unverified_context() -> ssl.SSLContext:
    """A client context that checks neither the certificate nor the host name, as PyMySQL's preferred mode."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class PreferredTls(Connection):
    """A PyMySQL connection whose preferred-mode context is given, not built."""

    def __init__(self, *args: Any, preferred_context: ssl.SSLContext, **kwargs: Any) -> None:
        self._preferred_context = preferred_context
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp == {}:  # preferred: no CA, no certificate, nothing to verify
            return self._preferred_context
        return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]


def connect_preferred(engine: Engine) -> None:
    """The engine's PyMySQL connections made as :class:`PreferredTls`, all with one context."""
    context = unverified_context()

    @event.listens_for(engine, "do_connect")
    def connect(_dialect: Any, _record: Any, cargs: tuple, cparams: dict) -> Connection:
        return PreferredTls(*cargs, preferred_context=context, **cparams)
