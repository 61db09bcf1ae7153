"""Provider presets and configuration from the environment.

Every preset is a plain :class:`HTTPBackend` for an OpenAI-compatible API, except
``anthropic``, an :class:`~swiftclient.AnthropicBackend` on the native Messages API, and
``azure``, an :class:`~swiftclient.backends.azure.AzureBackend` (Azure OpenAI's deployment
URLs and ``api-key`` header).
``local`` selects the bundled engine (the ``local`` extra), which swiftclient never imports:
it is found through the ``swiftclient.backends`` entry point named ``local``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, cast

from .backends.anthropic import AnthropicBackend
from .backends.azure import DEFAULT_AZURE_API_VERSION, AzureBackend
from .backends.base import Backend
from .backends.http import HTTPBackend
from .backends.responses import ResponsesBackend
from .errors import ConfigurationError

__all__ = [
    "AZURE_API_VERSION_ENV",
    "BACKENDS_GROUP",
    "PRESETS",
    "SERVERS_GROUP",
    "TOOLS_GROUP",
    "BuiltinTools",
    "Preset",
    "from_env",
    "local_tools",
    "preset",
]

BACKENDS_GROUP = "swiftclient.backends"
"""Entry point group of backend classes (``local``: the bundled engine's ``LocalBackend``)."""
SERVERS_GROUP = "swiftclient.servers"
"""Entry point group of server commands, ``main(argv, *, prog_name, debug) -> exit status``
(``local``: ``swiftclient serve``)."""
TOOLS_GROUP = "swiftclient.tools"
"""Entry point group of tool sets, modules with ``TOOLS`` and ``run_tool`` (``local``: the
bundled engine's built-in tools, ``swiftclient chat --builtin-tools``)."""
_LOCAL_EXTRA = "pip install 'swiftclient-llm[local]'"


def _local_entry_point(group: str) -> Any:
    """What the local engine registers in ``group`` (ConfigurationError when it is absent)."""
    for entry_point in entry_points(group=group, name="local"):
        try:
            return entry_point.load()
        except ImportError as exc:
            raise ConfigurationError(
                f"the local engine ({entry_point.value}) cannot be imported: {exc}; it needs "
                f"the 'local' extra: {_LOCAL_EXTRA}"
            ) from exc
    raise ConfigurationError(
        f"the local engine is not installed (no 'local' entry point in {group}); it comes "
        f"with the 'local' extra: {_LOCAL_EXTRA}"
    )


def local_server() -> Callable[..., int]:
    """The bundled engine's server command (``swiftclient serve``): ``main(argv, *,
    prog_name, debug) -> exit status``."""
    return cast(Callable[..., int], _local_entry_point(SERVERS_GROUP))


@dataclass(frozen=True, slots=True)
class BuiltinTools:
    """The local engine's built-in tools: OpenAI tool definitions by name, and a function
    that runs one call (``run(name, arguments) -> result``; ValueError for a bad call)."""

    definitions: dict[str, dict[str, Any]]
    run: Callable[[str, Mapping[str, Any]], dict[str, Any]]


def local_tools() -> BuiltinTools:
    """The bundled engine's built-in tools (the ``local`` extra; ConfigurationError without
    it): the weather stand-in, unit conversion and the calculator that its embedded model
    was trained to call."""
    module = _local_entry_point(TOOLS_GROUP)
    return BuiltinTools(dict(module.TOOLS), module.run_tool)


@dataclass(frozen=True, slots=True)
class Preset:
    """Where a provider lives, which environment variable holds its key, and whether it
    takes ``prompt_cache_key`` (then derived from each prompt's static prefix)."""

    base_url: str
    key_env: str | None
    key_required: bool = True
    prompt_cache_key: bool = False
    wire: str = "chat"
    """``chat`` (OpenAI Chat Completions: :class:`HTTPBackend`), ``messages``
    (Anthropic's Messages API: :class:`~swiftclient.AnthropicBackend`) or ``azure`` (Chat
    Completions on Azure's deployment URLs: :class:`~swiftclient.backends.azure.AzureBackend`).
    A ``chat`` preset may be asked for ``wire="responses"``
    (:class:`~swiftclient.ResponsesBackend`)."""
    base_url_env: str | None = None
    """The variable that holds the base URL where it is per account (Azure's resource
    endpoint); ``base_url`` is then only a template."""


PRESETS: dict[str, Preset] = {
    "oxlo": Preset("https://api.oxlo.ai/v1", "OXLO_API_KEY"),
    "openai": Preset("https://api.openai.com/v1", "OPENAI_API_KEY", prompt_cache_key=True),
    "deepseek": Preset("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "vllm": Preset("http://127.0.0.1:8000/v1", "VLLM_API_KEY", key_required=False),
    "sglang": Preset("http://127.0.0.1:30000/v1", "SGLANG_API_KEY", key_required=False),
    "anthropic": Preset("https://api.anthropic.com/v1", "ANTHROPIC_API_KEY", wire="messages"),
    "gemini": Preset("https://generativelanguage.googleapis.com/v1beta/openai", "GEMINI_API_KEY"),
    "azure": Preset(
        "https://RESOURCE.openai.azure.com",
        "AZURE_OPENAI_API_KEY",
        wire="azure",
        base_url_env="AZURE_OPENAI_ENDPOINT",
    ),
}

AZURE_API_VERSION_ENV = ("AZURE_OPENAI_API_VERSION", "OPENAI_API_VERSION")
"""Where the ``azure`` preset reads its ``api-version`` when ``api_version=`` is not given
(the first set wins; ``OPENAI_API_VERSION`` is the official SDK's variable)."""


def preset(
    name: str,
    /,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    wire: str | None = None,
    **kwargs: Any,
) -> Backend:
    """Build the backend for a named provider (``oxlo``, ``openai``, ``deepseek``, ``vllm``,
    ``sglang``, ``anthropic``, ``gemini``, ``azure``, or ``local``). Keys come from the
    argument or the preset's variable; other keyword arguments (``name=`` included: the
    backend's name in model strings) go to the backend. ``wire="responses"`` makes an
    OpenAI-compatible preset speak the Responses API (:class:`~swiftclient.ResponsesBackend`)
    instead of Chat Completions.

    ``azure`` takes its endpoint from ``base_url=`` or ``AZURE_OPENAI_ENDPOINT``, its key
    from ``AZURE_OPENAI_API_KEY``, and ``api_version=`` (else ``AZURE_OPENAI_API_VERSION``,
    else ``OPENAI_API_VERSION``, else :data:`~swiftclient.backends.azure.DEFAULT_AZURE_API_VERSION`)
    and ``deployment=`` (else the call's model names the deployment)."""
    env = os.environ if environ is None else environ
    if name == "local":
        local_backend = _local_entry_point(BACKENDS_GROUP)
        model = kwargs.pop("model", None) or env.get("SWIFTCLIENT_LOCAL_MODEL")
        return cast(Backend, local_backend(model, **kwargs))
    spec = PRESETS.get(name)
    if spec is None:
        known = ", ".join(sorted([*PRESETS, "local"]))
        raise ConfigurationError(f"unknown provider {name!r}; known providers: {known}")
    if spec.wire == "azure":
        return _azure(name, spec, env, api_key, base_url, wire, kwargs)
    chosen = spec.wire if wire is None else wire
    if chosen != spec.wire and (spec.wire, chosen) != ("chat", "responses"):
        raise ConfigurationError(
            f"provider {name!r} speaks the {spec.wire!r} wire; wire={wire!r} is not one it "
            "offers (an OpenAI-compatible preset takes 'chat' or 'responses')"
        )
    key = api_key or (env.get(spec.key_env) if spec.key_env else None)
    if spec.key_required and not key:
        raise ConfigurationError(
            f"provider {name!r} needs an API key: pass api_key= or set {spec.key_env}"
        )
    if spec.wire == "messages":
        return AnthropicBackend(
            base_url or spec.base_url, key, name=kwargs.pop("name", name), **kwargs
        )
    kwargs.setdefault("prompt_cache_key", spec.prompt_cache_key)
    kind = ResponsesBackend if chosen == "responses" else HTTPBackend
    return kind(base_url or spec.base_url, key, name=kwargs.pop("name", name), **kwargs)


def _azure(
    name: str,
    spec: Preset,
    env: Mapping[str, str],
    api_key: str | None,
    base_url: str | None,
    wire: str | None,
    kwargs: dict[str, Any],
) -> Backend:
    """The ``azure`` preset's backend (see :func:`preset`)."""
    if wire not in (None, "chat", "azure"):
        raise ConfigurationError(
            f"provider {name!r} speaks Chat Completions on Azure's deployment URLs; "
            f"wire={wire!r} is not one it offers"
        )
    endpoint = base_url or (env.get(spec.base_url_env) if spec.base_url_env else None)
    if not endpoint:
        raise ConfigurationError(
            f"provider {name!r} needs its endpoint: pass base_url= (--base-url on the "
            f"command line; https://RESOURCE.openai.azure.com) or set {spec.base_url_env}"
        )
    key = api_key or (env.get(spec.key_env) if spec.key_env else None)
    credential_header = any(
        header.lower() in ("api-key", "authorization") for header in kwargs.get("headers") or {}
    )
    if not key and not credential_header:
        raise ConfigurationError(
            f"provider {name!r} needs an API key: pass api_key= or set {spec.key_env} "
            '(or pass an Entra ID token as headers={"authorization": "Bearer ..."})'
        )
    version = kwargs.pop("api_version", None) or next(
        (env[var] for var in AZURE_API_VERSION_ENV if env.get(var)), DEFAULT_AZURE_API_VERSION
    )
    return AzureBackend(endpoint, key, api_version=version, name=kwargs.pop("name", name), **kwargs)


def from_env(environ: Mapping[str, str] | None = None, **kwargs: Any) -> Backend:
    """Configure one backend from the environment; ``kwargs`` go to the backend
    (``HTTPBackend`` options such as ``max_connections``, or ``LocalBackend``'s).

    Order: ``SWIFTCLIENT_PROVIDER`` (a preset name or ``local``; ``SWIFTCLIENT_API_KEY``
    and ``SWIFTCLIENT_BASE_URL`` override the preset's key and URL); then
    ``SWIFTCLIENT_BASE_URL`` with ``SWIFTCLIENT_API_KEY``; then ``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY`` (the key alone selects OpenAI).
    """
    env = os.environ if environ is None else environ
    provider = env.get("SWIFTCLIENT_PROVIDER")
    if provider:
        return preset(
            provider.strip().lower(),  # an environment's "OpenAI" or "local " means the same
            api_key=env.get("SWIFTCLIENT_API_KEY"),
            base_url=env.get("SWIFTCLIENT_BASE_URL"),
            environ=env,
            **kwargs,
        )
    base_url = env.get("SWIFTCLIENT_BASE_URL")
    if base_url:
        return HTTPBackend(base_url, env.get("SWIFTCLIENT_API_KEY"), name="default", **kwargs)
    base_url = env.get("OPENAI_BASE_URL")
    key = env.get("OPENAI_API_KEY")
    if base_url:
        return HTTPBackend(base_url, key, name="default", **kwargs)
    if key:
        openai = PRESETS["openai"]
        kwargs.setdefault("prompt_cache_key", openai.prompt_cache_key)
        return HTTPBackend(openai.base_url, key, name="openai", **kwargs)
    raise ConfigurationError(
        "no backend configured: pass a backend to the client (AsyncClient or Client), or set "
        f"SWIFTCLIENT_PROVIDER ({', '.join([*PRESETS, 'local'])}), "
        "SWIFTCLIENT_BASE_URL, or OPENAI_API_KEY"
    )
