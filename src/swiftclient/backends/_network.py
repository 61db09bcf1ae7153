"""Network settings of an HTTP backend, resolved once: TLS context, proxy, socket options.

The TLS context and the proxy are built the way httpx builds them (certifi's CA bundle, or
``SSL_CERT_FILE`` / ``SSL_CERT_DIR``; ``HTTP(S)_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY``) and
handed to whichever transport the backend uses, so both behave alike.
"""

from __future__ import annotations

import os
import socket
import ssl
import urllib.request
from urllib.parse import urlsplit

from .. import errors

__all__ = ["Cert", "Verify", "env_proxy", "keepalive_options", "ssl_context"]

Verify = bool | str | ssl.SSLContext
Cert = str | tuple[str, str] | tuple[str, str, str]


def keepalive_options() -> list[tuple[int, int, int]]:
    """TCP keep-alive probes: after 60 s idle, every 10 s, 5 tries (where the OS has them)."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, lower case too), or None when there is none or ``NO_PROXY`` exempts it
    (the standard library's rule, read with its proxies: ``*``, the host itself, or a
    parent domain)."""
    proxies = urllib.request.getproxies()
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and "://" not in proxy:
        proxy = f"http://{proxy}"  # as httpx reads a bare host:port
    return proxy or None


def ssl_context(verify: Verify, cert: Cert | None, trust_env: bool) -> ssl.SSLContext:
    """The TLS settings as one ``ssl.SSLContext``, as httpx builds them.

    ``verify``: True checks certificates against certifi's bundle (or ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` when ``trust_env``), a path checks them against that CA file or
    directory, False turns checking off, a context is used as it is. ``cert``: a client
    certificate file, or ``(certfile, keyfile)`` / ``(certfile, keyfile, password)``.
    """
    if isinstance(verify, ssl.SSLContext):
        context = verify
    elif verify is False:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        path = verify if isinstance(verify, str) else None
        if path is None and trust_env:
            path = os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR")
        if path is None:
            import certifi

            path = certifi.where()
        if os.path.isdir(path):
            context = ssl.create_default_context(capath=path)
        elif os.path.isfile(path):
            context = ssl.create_default_context(cafile=path)
        else:
            raise errors.ConfigurationError(f"verify: no CA file or directory at {path!r}")
    if cert is not None:
        if isinstance(cert, str):
            context.load_cert_chain(cert)
        else:
            context.load_cert_chain(*cert)
    return context
