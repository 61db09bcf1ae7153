"""Named model aliases and the rules that choose among their routes.

Route simple tasks to small models: an alias such as ``"fast"`` or ``"smart"`` names a list of
routes, each a list of targets (``"backend/model"`` strings, tried or hedged in order) with
an optional :class:`Rule`. For each call the first route whose rule matches the request is
used; a route without a rule always matches, so it belongs last as the default::

    routes = {
        "fast": ["oxlo/qwen-3-32b", "local/default"],          # one route, no rule
        "smart": [
            Route(["oxlo/qwen-3-32b"], when=Rule(task="classify")),
            Route(["oxlo/deepseek-v4-flash"], when=Rule(prompt_chars_max=8_000)),
            {"targets": ["oxlo/deepseek-v4-flash", "oxlo/qwen-3-32b"]},   # plain data works
        ],
    }
    router = Router(routes)
    router.expand("smart", prompt_chars=120, task="classify")   # ['oxlo/qwen-3-32b']

Rules are plain data: every field is optional and all given fields must hold.

- ``prompt_chars_min`` / ``prompt_chars_max``: bounds (inclusive) on the prompt's length in
  characters.
- ``task``: the call's client-side task label (``client.chat(..., task="summarize")``) must
  equal it.
- ``max_cost``: every target of the route must cost at most this much for this request,
  as priced by the ``cost_of`` function given to :meth:`Router.expand`; a target whose cost
  is unknown does not qualify.

Routes and rules are checked when they are built: bad input raises
:class:`~swiftclient.ConfigurationError` saying which alias and route are wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigurationError

__all__ = ["Route", "Router", "Rule"]

CostFunction = Callable[[str], float | None]
"""Prices one target for the request at hand (``None``: unknown)."""


@dataclass(frozen=True)
class Rule:
    """Conditions on a request; a route whose rule holds is chosen.

    Attributes:
        prompt_chars_min: the prompt has at least this many characters.
        prompt_chars_max: the prompt has at most this many characters.
        task: the call's task label equals this.
        max_cost: each target of the route costs at most this much for the request.

    Raises:
        ConfigurationError: a bound is negative or not a number, the minimum exceeds the
            maximum, or the task label is empty.
    """

    prompt_chars_min: int | None = None
    prompt_chars_max: int | None = None
    task: str | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_chars_min", "prompt_chars_max"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigurationError(f"Rule.{name} must be an integer >= 0, got {value!r}")
        low, high = self.prompt_chars_min, self.prompt_chars_max
        if low is not None and high is not None and low > high:
            raise ConfigurationError(
                f"Rule.prompt_chars_min ({low}) is greater than prompt_chars_max ({high})"
            )
        if self.task is not None and (not isinstance(self.task, str) or not self.task):
            raise ConfigurationError(f"Rule.task must be a non-empty string, got {self.task!r}")
        cost = self.max_cost
        if cost is not None and (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise ConfigurationError(f"Rule.max_cost must be a finite number >= 0, got {cost!r}")

    def matches(
        self,
        targets: Sequence[str],
        *,
        prompt_chars: int,
        task: str | None,
        cost_of: CostFunction | None = None,
    ) -> bool:
        """Whether a request with this prompt length and task may use ``targets``."""
        if self.prompt_chars_min is not None and prompt_chars < self.prompt_chars_min:
            return False
        if self.prompt_chars_max is not None and prompt_chars > self.prompt_chars_max:
            return False
        if self.task is not None and task != self.task:
            return False
        if self.max_cost is not None:
            if cost_of is None:
                return False
            for target in targets:
                cost = cost_of(target)
                if cost is None or cost > self.max_cost:
                    return False
        return True


@dataclass(frozen=True)
class Route:
    """Targets (``"backend/model"`` strings, in order) and the rule that selects them.

    Args:
        targets: one or more target strings; a list is stored as a tuple.
        when: the rule; ``None`` matches every request.

    Raises:
        ConfigurationError: no targets, a target that is not a non-empty string, a repeated
            target, or ``when`` that is not a :class:`Rule`.
    """

    targets: tuple[str, ...]
    when: Rule | None = None

    def __post_init__(self) -> None:
        targets: Any = self.targets
        if isinstance(targets, str) or not isinstance(targets, Sequence):
            raise ConfigurationError(
                f"Route.targets must be a list of 'backend/model' strings, got {targets!r}"
            )
        normalized = tuple(targets)
        if not normalized:
            raise ConfigurationError("Route.targets is empty: give at least one target")
        for target in normalized:
            if not isinstance(target, str) or not target.strip():
                raise ConfigurationError(
                    f"each route target must be a non-empty string, got {target!r}"
                )
        if len(set(normalized)) != len(normalized):
            raise ConfigurationError(f"Route.targets repeats a target: {list(normalized)}")
        if self.when is not None and not isinstance(self.when, Rule):
            raise ConfigurationError(f"Route.when must be a Rule or None, got {self.when!r}")
        object.__setattr__(self, "targets", normalized)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Route:
        """Build a route from plain data: ``{"targets": [...], "when": {...rule fields}}``.

        Raises:
            ConfigurationError: an unknown key, a missing ``targets``, or a bad value.
        """
        unknown = set(data) - {"targets", "when"}
        if unknown:
            raise ConfigurationError(
                f"unknown route keys {sorted(unknown)}; a route has 'targets' and 'when'"
            )
        if "targets" not in data:
            raise ConfigurationError("a route needs 'targets'")
        when = data.get("when")
        if isinstance(when, Mapping):
            known = {f.name for f in fields(Rule)}
            bad = set(when) - known
            if bad:
                raise ConfigurationError(
                    f"unknown rule keys {sorted(bad)}; a rule has {sorted(known)}"
                )
            when = Rule(**when)
        return cls(targets=data["targets"], when=when)


RouteInput = Route | Mapping[str, Any]
AliasInput = Sequence[str] | Sequence[RouteInput]


class Router:
    """Expands model aliases into target lists, choosing a route per request.

    Args:
        aliases: alias name -> either a list of targets (one route, no rule) or a list of
            routes (:class:`Route` objects or mappings with ``targets`` and ``when``),
            checked in order.

    Raises:
        ConfigurationError: an empty or non-string alias name, an alias with no routes, a
            plain string where a list belongs, targets mixed with routes, a bad route, or a
            target that names another alias (aliases do not nest).
    """

    def __init__(self, aliases: Mapping[str, AliasInput]) -> None:
        if not isinstance(aliases, Mapping):
            raise ConfigurationError(
                f"routes must be a mapping of alias name -> routes, got {type(aliases).__name__}"
            )
        table: dict[str, tuple[Route, ...]] = {}
        for name, value in aliases.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigurationError(f"an alias name must be a non-empty string: {name!r}")
            table[name] = _routes(name, value)
        for name, routes in table.items():
            for route in routes:
                for target in route.targets:
                    if target in table:
                        raise ConfigurationError(
                            f"alias {name!r} names alias {target!r} as a target; "
                            "aliases do not nest: list its targets instead"
                        )
        self._aliases = table

    def __repr__(self) -> str:
        return f"Router(aliases={sorted(self._aliases)})"

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is an alias."""
        return name in self._aliases

    @property
    def aliases(self) -> dict[str, tuple[Route, ...]]:
        """Every alias and its routes, in the order they are checked."""
        return dict(self._aliases)

    def expand(
        self,
        model: str | Sequence[str],
        *,
        prompt_chars: int,
        task: str | None = None,
        cost_of: CostFunction | None = None,
    ) -> list[str]:
        """The targets for a call to ``model`` (one model string or a list of them).

        Each alias is replaced by the targets of its first matching route; other strings
        pass through unchanged. A target that appears twice is kept at its first place.

        Raises:
            ConfigurationError: no route of an alias matches the request, ``model`` is empty,
                or ``prompt_chars`` is negative.
        """
        if prompt_chars < 0:
            raise ConfigurationError(f"prompt_chars must be >= 0, got {prompt_chars}")
        names = [model] if isinstance(model, str) else list(model)
        if not names:
            raise ConfigurationError("model is an empty list: name at least one model")
        out: list[str] = []
        seen: set[str] = set()
        for name in names:
            routes = self._aliases.get(name)
            targets: Sequence[str] = (
                [name]
                if routes is None
                else self._choose(name, routes, prompt_chars, task, cost_of)
            )
            for target in targets:
                if target not in seen:
                    seen.add(target)
                    out.append(target)
        return out

    @staticmethod
    def _choose(
        name: str,
        routes: Sequence[Route],
        prompt_chars: int,
        task: str | None,
        cost_of: CostFunction | None,
    ) -> tuple[str, ...]:
        for route in routes:
            if route.when is None or route.when.matches(
                route.targets, prompt_chars=prompt_chars, task=task, cost_of=cost_of
            ):
                return route.targets
        raise ConfigurationError(
            f"no route of alias {name!r} matches this request (prompt of {prompt_chars} "
            f"characters, task={task!r}); add a route without a rule as the default"
        )


def _routes(name: str, value: object) -> tuple[Route, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigurationError(
            f"alias {name!r}: expected a list of targets or of routes, got {value!r} "
            f"(for one target write [{value!r}])"
        )
    items = list(value)
    if not items:
        raise ConfigurationError(f"alias {name!r} has no targets")
    if all(isinstance(item, str) for item in items):
        try:
            return (Route(tuple(items)),)
        except ConfigurationError as exc:
            raise ConfigurationError(f"alias {name!r}: {exc}") from exc
    routes: list[Route] = []
    for index, item in enumerate(items):
        try:
            if isinstance(item, Route):
                routes.append(item)
            elif isinstance(item, Mapping):
                routes.append(Route.from_data(item))
            else:
                raise ConfigurationError(
                    f"expected a Route or a mapping, got {item!r} "
                    "(do not mix target strings with routes)"
                )
        except (ConfigurationError, TypeError) as exc:
            raise ConfigurationError(f"alias {name!r}, route {index}: {exc}") from exc
    return tuple(routes)
