"""Model aliases and routing rules: plain data in, target lists out, clear errors."""

from __future__ import annotations

import math
from typing import Any

import pytest

from swiftclient import ConfigurationError
from swiftclient.routing import Route, Router, Rule

PRICES = {"oxlo/big": 0.02, "oxlo/small": 0.001, "local/default": 0.0}


def cost_of(target: str) -> float | None:
    return PRICES.get(target)


def smart() -> Router:
    routes: dict[str, Any] = {
        "fast": ["oxlo/small", "local/default"],
        "smart": [
            Route(("oxlo/small",), when=Rule(task="classify")),
            Route(("local/default",), when=Rule(prompt_chars_max=100)),
            {"targets": ["oxlo/big"], "when": {"prompt_chars_min": 10_000}},
            Route(("oxlo/big", "oxlo/small"), when=Rule(max_cost=0.05)),
            Route(("oxlo/small",)),
        ],
    }
    return Router(routes)


def test_an_alias_of_targets_expands_in_order() -> None:
    router = smart()
    assert router.expand("fast", prompt_chars=10) == ["oxlo/small", "local/default"]


def test_other_model_strings_pass_through() -> None:
    router = smart()
    assert router.expand("oxlo/other", prompt_chars=10) == ["oxlo/other"]
    assert router.expand(["a/x", "b/y"], prompt_chars=10) == ["a/x", "b/y"]
    assert "fast" in router and "oxlo/other" not in router


def test_the_first_matching_route_wins() -> None:
    router = smart()
    # task label first, even for a tiny prompt
    assert router.expand("smart", prompt_chars=5, task="classify") == ["oxlo/small"]
    assert router.expand("smart", prompt_chars=5) == ["local/default"]
    assert router.expand("smart", prompt_chars=100) == ["local/default"]  # bounds inclusive
    assert router.expand("smart", prompt_chars=20_000, task="summarize") == ["oxlo/big"]


def test_max_cost_needs_every_target_priced_within_it() -> None:
    router = smart()
    assert router.expand("smart", prompt_chars=500, cost_of=cost_of) == [
        "oxlo/big",
        "oxlo/small",
    ]

    def expensive(target: str) -> float | None:
        return 1.0 if target == "oxlo/big" else 0.001

    assert router.expand("smart", prompt_chars=500, cost_of=expensive) == ["oxlo/small"]
    # unknown cost or no cost function: the rule does not hold
    assert router.expand("smart", prompt_chars=500, cost_of=lambda t: None) == ["oxlo/small"]
    assert router.expand("smart", prompt_chars=500) == ["oxlo/small"]


def test_aliases_mixed_with_targets_are_deduplicated_in_first_place() -> None:
    router = smart()
    assert router.expand(["oxlo/small", "fast", "oxlo/big"], prompt_chars=1) == [
        "oxlo/small",
        "local/default",
        "oxlo/big",
    ]


def test_no_matching_route_is_a_clear_error() -> None:
    router = Router({"strict": [Route(("a/x",), when=Rule(task="code"))]})
    with pytest.raises(ConfigurationError, match="no route of alias 'strict'.*default"):
        router.expand("strict", prompt_chars=10, task="chat")


def test_all_rule_fields_must_hold() -> None:
    rule = Rule(prompt_chars_min=10, prompt_chars_max=20, task="t", max_cost=1.0)
    ok: dict[str, Any] = {"prompt_chars": 15, "task": "t", "cost_of": lambda t: 0.5}
    assert rule.matches(["a/x"], **ok)
    assert not rule.matches(["a/x"], **{**ok, "prompt_chars": 9})
    assert not rule.matches(["a/x"], **{**ok, "prompt_chars": 21})
    assert not rule.matches(["a/x"], **{**ok, "task": None})
    assert not rule.matches(["a/x"], **{**ok, "cost_of": lambda t: 1.5})
    assert Rule().matches(["a/x"], prompt_chars=0, task=None)


def test_route_targets_become_a_tuple_and_aliases_are_listed() -> None:
    route = Route(["a/x", "b/y"])  # type: ignore[arg-type]
    assert route.targets == ("a/x", "b/y")
    router = smart()
    assert list(router.aliases) == ["fast", "smart"]
    assert len(router.aliases["smart"]) == 5
    assert "fast" in repr(router)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_chars_min": -1}, "prompt_chars_min"),
        ({"prompt_chars_max": 1.5}, "prompt_chars_max"),
        ({"prompt_chars_max": True}, "prompt_chars_max"),
        ({"prompt_chars_min": 10, "prompt_chars_max": 5}, "greater than"),
        ({"task": ""}, "task"),
        ({"task": 3}, "task"),
        ({"max_cost": -0.1}, "max_cost"),
        ({"max_cost": math.inf}, "max_cost"),
        ({"max_cost": "cheap"}, "max_cost"),
    ],
)
def test_bad_rules_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Rule(**kwargs)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ((), "empty"),
        ("a/x", "list"),
        (("a/x", ""), "non-empty"),
        (("a/x", 3), "non-empty"),
        (("a/x", "a/x"), "repeats"),
    ],
)
def test_bad_routes_are_refused(targets: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Route(targets)


def test_a_route_when_must_be_a_rule() -> None:
    with pytest.raises(ConfigurationError, match="Rule"):
        Route(("a/x",), when={"task": "t"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        ({"fast": "oxlo/small"}, r"for one target write \['oxlo/small'\]"),
        ({"fast": []}, "no targets"),
        ({"": ["a/x"]}, "alias name"),
        ({"fast": ["a/x", Route(("b/y",))]}, "route 0.*do not mix"),
        ({"fast": [{"targets": ["a/x"], "if": {}}]}, "route 0: unknown route keys"),
        ({"fast": [{"when": {}}]}, "needs 'targets'"),
        ({"fast": [{"targets": ["a/x"], "when": {"tasks": "t"}}]}, "unknown rule keys"),
        ({"fast": [{"targets": ["a/x"], "when": {"task": ""}}]}, "Rule.task"),
        ({"fast": ["a/x", "a/x"]}, "alias 'fast'.*repeats"),
        ({"fast": ["smart"], "smart": ["a/x"]}, "do not nest"),
    ],
)
def test_bad_aliases_are_refused_with_the_place(aliases: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Router(aliases)


def test_routes_must_be_a_mapping() -> None:
    with pytest.raises(ConfigurationError, match="mapping"):
        Router([("fast", ["a/x"])])  # type: ignore[arg-type]


def test_bad_expand_arguments_are_refused() -> None:
    router = smart()
    with pytest.raises(ConfigurationError, match="empty list"):
        router.expand([], prompt_chars=1)
    with pytest.raises(ConfigurationError, match="prompt_chars"):
        router.expand("fast", prompt_chars=-1)
