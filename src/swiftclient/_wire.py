"""The one place that turns a :class:`ChatRequest` into request bytes.

Serialization is canonical (:mod:`swiftclient._canonical`): compact JSON, fields in the
contract's order, ``None`` fields left out, tools sorted, schemas in one key order,
``extra_body`` merged last. Equal requests give identical bytes in every process, which is
what provider prompt caches key on. ``exact=True`` keeps the caller's own orders.
"""

from __future__ import annotations

from ._canonical import body as request_body
from ._canonical import encode as encode_request

__all__ = ["encode_request", "request_body"]
