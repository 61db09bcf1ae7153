"""Exception tree and secret redaction (the transport mapping: test_transport_errors.py)."""

from __future__ import annotations

import hypothesis
import pytest

from swiftclient import errors


def test_tree_shape() -> None:
    assert issubclass(errors.FirstTokenTimeout, errors.APITimeoutError)
    assert issubclass(errors.StreamStalled, errors.APITimeoutError)
    assert issubclass(errors.DeadlineExceeded, errors.APITimeoutError)
    assert issubclass(errors.APITimeoutError, errors.APIConnectionError)
    assert issubclass(errors.OverloadedError, errors.EngineError)
    assert issubclass(errors.ConfigurationError, ValueError)
    for cls in (errors.APIError, errors.StructuredOutputError, errors.EngineError):
        assert issubclass(cls, errors.SwiftClientError)


def test_redaction_masks_keys_and_bearer_tokens() -> None:
    text = "Bearer abcdef123456 failed for sk-live_ABCDEFGHIJKLMNOP and api_key=hunter2hunter2"
    out = errors.redact(text, "hunter2hunter2")
    assert "abcdef123456" not in out
    assert "ABCDEFGHIJKLMNOP" not in out
    assert "hunter2" not in out


def test_new_timeouts_and_size_error_sit_in_the_tree() -> None:
    assert issubclass(errors.PoolTimeout, errors.APITimeoutError)
    assert issubclass(errors.ConnectTimeout, errors.APITimeoutError)
    assert not issubclass(errors.PoolTimeout, errors.ConnectTimeout)
    assert issubclass(errors.ResponseTooLarge, errors.APIResponseValidationError)


KEYS = [
    "abc123",  # six characters (shorter ones are placeholders, masked where they stand alone)
    "0123456789abcdef0123456789abcdef",  # hex
    "123e4567-e89b-12d3-a456-426614174000",  # UUID
    "sk-proj-abcdefghijklmnop",
    "hunter2",
]


@pytest.mark.parametrize("key", KEYS)
def test_a_known_key_is_masked_wherever_it_stands(key: str) -> None:
    # OpenAI's 401 puts a full stop right after the key: it used to stay unmasked.
    texts = [
        f"Incorrect API key provided: {key}. You can find your API key at https://x/keys.",
        f"key={key}&x=1",
        f"({key})",
        f"{key}",
        f"'{key}',",
        f"{key}{key}",
        f"prefix{key}suffix",
        f"{key}\n{key}.",
    ]
    for text in texts:
        out = errors.redact(text, key)
        assert key not in out, text
        assert "***" in out, text
    assert errors.redact(texts[0], key) == (
        "Incorrect API key provided: ***. You can find your API key at https://x/keys."
    )


def test_a_mask_never_leaves_part_of_a_word_behind() -> None:
    # A key inside a word: the whole word goes, so "xhunter2y" never reads "x***y".
    text = "xhunter2y: key hunter2 rejected (hunter2)."
    assert errors.redact(text, "hunter2") == "***: key *** rejected (***)."
    assert errors.redact("x", "") == "x"
    assert errors.redact("x", None) == "x"


@pytest.mark.parametrize("key", ["EMPTY", "none", "k", "ab"])
def test_a_placeholder_key_is_masked_only_where_it_stands_alone(key: str) -> None:
    # api_key="k" used to mask every word with a k in it: "model *** not found".
    text = f"model {key}s and x{key} not found; key {key} rejected ({key})."
    expected = f"model {key}s and x{key} not found; key *** rejected (***)."
    assert errors.redact(text, key) == expected


def test_overlapping_known_secrets_leave_no_fragment() -> None:
    # Two secrets that overlap in the text, and a key that overlaps itself.
    assert errors.redact("abc-abc-abc!", "abc-abc") == "***!"
    out = errors.redact("id: abcdef-123 / 123-xyz", "abcdef-123", "123-xyz")
    assert out == "id: *** / ***"


@pytest.mark.parametrize(
    "text",
    [
        "unknown field 'key_separator' (did you mean 'item_separator'?)",
        "key_value_store and key-value-pairs are words",
        "api_key: required",
        "constraint pk_users_email violated",
        "monkey_business_class and turnkey-solutions",
    ],
)
def test_words_that_contain_key_are_left_alone(text: str) -> None:
    assert errors.redact(text) == text
    assert errors.redact(text, "ab-not-there") == text


def test_unknown_keys_are_still_masked_by_shape() -> None:
    text = "got sk-proj-Abc123def456ghi789 and rk_live_51HxyZ and api_key=hunter2hunter2"
    out = errors.redact(text)
    assert "Abc123" not in out and "51HxyZ" not in out and "hunter2" not in out
    assert errors.redact("Authorization: Bearer abc.def-123") == "Authorization: Bearer ***"
    assert errors.redact('{"api_key": "abcdefghijklmnopq"}') == '{"api_key": "***"}'


def test_credential_headers_are_known_secrets() -> None:
    headers = {
        "api-key": "k1",
        "X-Goog-Api-Key": "k2",
        "authorization": "Bearer k3",
        "x-auth-token": "k4",
        "idempotency-key": "not-a-secret",
        "user-agent": "swiftclient",
    }
    assert errors.header_secrets(headers) == ("k1", "k2", "Bearer k3", "k3", "k4")
    assert not errors.is_secret_header("x-ratelimit-remaining-tokens")
    assert errors.is_secret_header("Set-Cookie")


def test_json_bodies_are_redacted_in_keys_too() -> None:
    body = {"error": {"message": "bad key ab.", "ab": ["ab"]}}
    assert errors.redact_json(body, "ab") == {"error": {"message": "bad key ***.", "***": ["***"]}}


def test_a_key_inside_a_longer_token_is_still_caught_by_shape() -> None:
    key = "sk-proj-abcdefghijklmnop"
    assert key not in errors.redact(f"url?token={key}&x=1", key)
    assert key not in errors.redact(f'{{"key":"{key}"}}', key)


def test_response_headers_are_scrubbed() -> None:
    key = "sk-test-key-1234567890"
    headers = {
        "X-Echo": f"got {key}",
        "Authorization": f"Bearer {key}",
        "Set-Cookie": "session=abc",
        "x-request-id": "req_1",
    }
    out = errors.redact_headers(headers, key)
    assert out == {
        "x-echo": "got ***",
        "authorization": "***",
        "set-cookie": "***",
        "x-request-id": "req_1",
    }


@pytest.mark.parametrize(
    "text",
    [
        "req_fake_123871",
        "Authorization: Bearer abcd1234efgh",
        "BEARER\tXYZ12345",
        "key sk-abcdefghij12345 leaked",
        "oxlo_ABCDEFGH12345678",
        "rk-short",
        "api_key=supersecret",
        'API-KEY: "12345678"',
        "apikey=abcd",
        "ask-me-anything-please",
        "pk_live_0123456789abcdef",
        "desk-lamp sk_ 123",
        "x" * 500 + "sk-" + "y" * 20,
        "",
    ],
)
def test_redact_scans_once_and_masks_what_the_three_shapes_mask(text: str) -> None:
    """The one-scan shortcut of :func:`redact` never leaves a key the full substitutions
    would mask."""
    from swiftclient import errors as module

    full = module._BEARER.sub(r"\1***", text)
    full = module._PREFIXED_KEY.sub(module._mask_prefixed, full)
    full = module._KEY_FIELD.sub(module._mask_field, full)
    assert module.redact(text) == full


_SHAPE_PIECES = hypothesis.strategies.lists(
    hypothesis.strategies.sampled_from(
        [
            "sk",
            "rk",
            "pk",
            "oxlo",
            "SK",
            "Oxlo",
            "-",
            "_",
            "api",
            "API",
            "key",
            "Key",
            "Bearer",
            "bEARER",
            " ",
            "\t",
            "=",
            ":",
            '"',
            "a1b2c3d4e5",
            "X",
            ".",
            "é",
            "\u212a",  # the Kelvin sign: a "k" under case-insensitive matching
        ]
    ),
    max_size=12,
).map("".join)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_SHAPE_PIECES)
def test_the_shape_precheck_passes_every_text_the_scan_matches(text: str) -> None:
    """``_may_be_shaped`` answers False only for text ``_ANY_SHAPE`` cannot match."""
    if errors._ANY_SHAPE.search(text) is not None:
        assert errors._may_be_shaped(text)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_SHAPE_PIECES)
def test_redact_shortcut_agrees_with_the_full_substitutions(text: str) -> None:
    """Any text made of the shapes' pieces: the shortcut and the substitutions agree."""
    full = errors._BEARER.sub(r"\1***", text)
    full = errors._PREFIXED_KEY.sub(errors._mask_prefixed, full)
    full = errors._KEY_FIELD.sub(errors._mask_field, full)
    assert errors.redact(text) == full


def test_every_api_error_survives_pickle_and_copy() -> None:
    """Status errors and RateLimited need keyword-only fields, which pickle's default left
    out: unpickling raised TypeError, and a ProcessPoolExecutor whose worker raised one died
    ("A process in the process pool was terminated abruptly")."""
    import copy
    import pickle

    from swiftclient.types import Attempt

    status = errors.RateLimitError(
        "b: HTTP 429",
        status_code=429,
        request_id="r1",
        body={"e": 1},
        headers={"h": "v"},
        backend="b",
    )
    tried = [Attempt(number=n, backend="b", model="m", started=0.0) for n in (1, 2)]
    status._record_attempts(tried)
    cases: list[errors.APIError] = [
        status,
        errors.InternalServerError("b: HTTP 500", status_code=500, backend="b"),
        errors.RateLimited("full", limit="concurrency", reset_after=None, target="b/m"),
        errors.StreamError("in-band", body={"error": "x"}),
        errors.APIConnectionError("down", backend="b"),
    ]
    for error in cases:
        for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
            assert type(again) is type(error) and str(again) == str(error)
            assert again.__dict__ == error.__dict__ and again.attempts == error.attempts


@pytest.mark.parametrize(
    ("kind", "fields", "says"),
    [
        ("RetryPolicy", {"max_attempts": "3"}, "an int of at least 1"),
        ("RetryPolicy", {"initial_backoff": float("nan")}, "finite"),
        ("Hedge", {"budget": float("nan")}, "Hedge.budget"),
        ("Hedge", {"max_attempts": 2.5}, "Hedge.max_attempts"),
    ],
)
def test_policies_refuse_values_that_are_no_numbers_or_nan(
    kind: str, fields: dict[str, object], says: str
) -> None:
    """``RetryPolicy(max_attempts="3")`` raised TypeError from a comparison, and NaN
    budgets and backoffs were accepted."""
    import swiftclient

    with pytest.raises(errors.ConfigurationError, match=says):
        getattr(swiftclient, kind)(**fields)
