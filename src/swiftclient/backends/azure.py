"""Azure OpenAI: Chat Completions on per-deployment URLs, keyed by an ``api-key`` header.

Azure serves each model deployment at its own URL,
``{endpoint}/openai/deployments/{deployment}/chat/completions?api-version={version}``, and
takes the key in an ``api-key`` header instead of a bearer token. The wire is OpenAI's
Chat Completions, so everything else (encoding, the event stream, errors, retries, cost) is
:class:`~swiftclient.HTTPBackend`'s.

The deployment is the call's model (``model="azure/my-gpt-4o"`` sends to the deployment
``my-gpt-4o``), as the official ``openai`` SDK's ``AzureOpenAI`` does, unless one is pinned
with ``deployment=``; the model name also stays in the body, which Azure ignores.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .. import errors
from .http import HTTPBackend

__all__ = ["DEFAULT_AZURE_API_VERSION", "AzureBackend"]

DEFAULT_AZURE_API_VERSION = "2024-10-21"
"""The ``api-version`` sent when none is given: the latest generally available (non-preview)
version of Azure OpenAI's data-plane inference API."""

_MAX_URLS = 256
"""Deployment URLs remembered at once (a backend calls few deployments)."""


def _endpoint(endpoint: str) -> str:
    """The resource's root URL: trailing slashes and an ``/openai`` suffix dropped."""
    root = endpoint.strip().rstrip("/")
    if root.endswith("/openai"):
        root = root[: -len("/openai")]
    if "?" in root or "#" in root:
        raise errors.ConfigurationError(
            "the Azure endpoint must be the resource URL (https://RESOURCE.openai.azure.com) "
            "without a query string: pass api_version= for the version"
        )
    if "/deployments/" in root + "/" or root.endswith("/deployments"):
        raise errors.ConfigurationError(
            "the Azure endpoint must be the resource URL (https://RESOURCE.openai.azure.com); "
            "pass the deployment as deployment= or as the call's model"
        )
    return root


class AzureBackend(HTTPBackend):
    """Azure OpenAI's Chat Completions (the ``azure`` preset).

    Args:
        endpoint: the resource URL, ``https://RESOURCE.openai.azure.com`` (an ``/openai``
            suffix is accepted).
        api_key: sent in the ``api-key`` header; never logged or shown in reprs and errors.
            Without one, pass your own credential header (``headers={"authorization":
            "Bearer <Entra ID token>"}``).
        api_version: the ``api-version`` query parameter of every request.
        deployment: send every request to this deployment; ``None`` (the default): to the
            deployment named by the call's model.
        name: the backend's name in model strings, spans and errors.
        **kwargs: every other :class:`~swiftclient.HTTPBackend` option.

    Raises:
        ConfigurationError: the endpoint is not a resource URL, or ``api_version`` or
            ``deployment`` is empty.
    """

    def __init__(
        self,
        endpoint: str,
        api_key: str | None = None,
        *,
        api_version: str = DEFAULT_AZURE_API_VERSION,
        deployment: str | None = None,
        name: str = "azure",
        **kwargs: Any,
    ) -> None:
        if not isinstance(endpoint, str) or not endpoint.strip():
            raise errors.ConfigurationError(
                "the Azure endpoint is required: https://RESOURCE.openai.azure.com"
            )
        if not isinstance(api_version, str) or not api_version.strip():
            raise errors.ConfigurationError("api_version must be a non-empty string")
        if deployment is not None and (not isinstance(deployment, str) or not deployment):
            raise errors.ConfigurationError("deployment must be a non-empty string or None")
        super().__init__(f"{_endpoint(endpoint)}/openai", api_key, name=name, **kwargs)
        self.api_version = api_version.strip()
        self.deployment = deployment
        self._query = f"?api-version={quote(self.api_version, safe='')}"
        self._models_url = f"{self.base_url}/models{self._query}"
        self._urls: dict[str, str] = {}
        if deployment is not None:
            self._url = self._deployment_url(deployment)
        else:
            self._url_of = self._url_for

    def __repr__(self) -> str:
        return (
            f"AzureBackend(name={self.name!r}, endpoint={self.base_url!r}, "
            f"api_version={self.api_version!r}, deployment={self.deployment!r})"
        )

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        """Azure's key header: ``api-key``."""
        return {"api-key": api_key}

    def _deployment_url(self, deployment: str) -> str:
        return (
            f"{self.base_url}/deployments/{quote(deployment, safe='')}/chat/completions"
            f"{self._query}"
        )

    def _url_for(self, model: str) -> str:
        """The URL of the deployment the call's model names (remembered)."""
        url = self._urls.get(model)
        if url is None:
            if not model:
                raise errors.ConfigurationError(
                    f"{self.name}: the call names no model, so no Azure deployment: pass the "
                    "deployment as the model (model='azure/DEPLOYMENT') or deployment="
                )
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()
            url = self._urls[model] = self._deployment_url(model)
        return url
