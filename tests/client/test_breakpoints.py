"""The cache-breakpoint planner: its invariants, by property, and its choices by example."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftclient.breakpoints import Segment, plan_breakpoints

TTLS = st.sampled_from(["5m", "1h"])
SEGMENTS = st.lists(
    st.builds(
        Segment,
        tokens=st.integers(min_value=0, max_value=3000),
        end=st.none() | TTLS,
        user=st.none() | st.none() | TTLS,
    ),
    max_size=30,
)
RANK = {"5m": 0, "1h": 1}


@settings(max_examples=300, deadline=None)
@given(SEGMENTS, st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=5000))
def test_plan_invariants(segments: list[Segment], limit: int, min_tokens: int) -> None:
    plan = plan_breakpoints(segments, limit=limit, min_tokens=min_tokens)
    points = plan.breakpoints
    positions = [p.position for p in points]
    # never more than the limit, one per block, in order
    assert len(points) <= limit
    assert positions == sorted(set(positions))
    # TTL order: never a shorter TTL before a longer one
    ranks = [RANK[p.ttl] for p in points]
    assert ranks == sorted(ranks, reverse=True)
    # every user marker is kept: on its own block, or merged (with a warning) into a later one
    users = [i for i, s in enumerate(segments) if s.user is not None]
    carried = [m for p in points for m in p.merged]
    assert sorted(carried) == users
    for point in points:
        assert all(m <= point.position for m in point.merged)
        if point.user:
            assert segments[point.position].user is not None
            # a user's TTL may be lengthened, never shortened
            assert RANK[point.ttl] >= RANK[segments[point.position].user or "5m"]
    merges = len(users) - sum(1 for p in points if p.user)
    assert sum("merged" in note for note in plan.warnings) == merges
    if len(users) <= limit:
        assert {p.position for p in points if p.user} == set(users)
    # planned breakpoints sit on segment ends whose prefix is long enough
    prefix = 0
    lengths = []
    for segment in segments:
        prefix += segment.tokens
        lengths.append(prefix)
    for point in points:
        if not point.user:
            assert segments[point.position].end is not None
            assert lengths[point.position] >= min_tokens
    # slots are not left empty while an eligible segment end is unused
    eligible = [
        i
        for i, s in enumerate(segments)
        if s.end is not None and s.user is None and lengths[i] >= min_tokens
    ]
    assert len(points) == min(limit, len(set(eligible) | {p.position for p in points if p.user}))


def test_layout_ends_get_breakpoints_longest_ttl_first() -> None:
    segments = [
        Segment(600),  # tool
        Segment(600, end="1h"),  # last tool
        Segment(2000, end="1h"),  # static system prompt
        Segment(300),
        Segment(300, end="5m"),  # end of the session history
        Segment(50, end="5m"),  # the turn
    ]
    plan = plan_breakpoints(segments)
    assert [(p.position, p.ttl) for p in plan.breakpoints] == [
        (1, "1h"),
        (2, "1h"),
        (4, "5m"),
        (5, "5m"),
    ]
    assert plan.warnings == ()


def test_short_prefixes_are_skipped_and_the_last_end_is_preferred() -> None:
    segments = [Segment(100, end="1h"), Segment(100, end="5m")] + [
        Segment(400, end="5m") for _ in range(6)
    ]
    plan = plan_breakpoints(segments, min_tokens=1024)
    # prefixes: 100, 200, 600, 1000, 1400, 1800, 2200, 2600
    assert plan.positions == [4, 5, 6, 7]


def test_user_breakpoints_are_kept_merged_past_the_limit_and_lengthened_in_order() -> None:
    segments = [Segment(2000, user="5m"), Segment(10, user="5m")] + [
        Segment(2000, user="5m") for _ in range(3)
    ]
    segments[-1] = Segment(2000, user="1h")
    plan = plan_breakpoints(segments, limit=4)
    assert plan.positions == [1, 2, 3, 4]
    assert plan.breakpoints[0].merged == (0, 1)  # the two closest were merged
    assert [p.ttl for p in plan.breakpoints] == ["1h", "1h", "1h", "1h"]
    assert any("merged" in note for note in plan.warnings)
    assert any("lengthened" in note for note in plan.warnings)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="limit"):
        plan_breakpoints([], limit=0)
    with pytest.raises(ValueError, match="negative"):
        plan_breakpoints([Segment(-1)])
