"""Secrets in a ``--url`` that does not parse: the error line masks every credential parameter the parsed path
masks (``is_credential_param``'s names — the fallback pattern had its own shorter list, and showed a
``?session=`` or ``?client_credential=`` value in the error line), and the registry's edges."""

from __future__ import annotations

import pytest

from agentload.endpoint.redact import MASK, SECRETS, is_credential_param, redact, redact_url_text, split_url
from agentload.errors import ConfigError

VALUE = "Zq8vX2mL4pR7tY1w"  # long enough for free-text search too


@pytest.mark.parametrize(
    "name",
    ["api_key", "x-api-key", "access_token", "client_secret", "password", "pwd", "auth", "sig", "session",
     "session_id", "client_credential", "AUTHORIZATION"],
)  # fmt: skip
def test_an_unparseable_url_masks_every_credential_parameter(name: str) -> None:
    assert is_credential_param(name)  # the parsed path masks it ...
    url = f"http://host:99999/v1?model=m&{name}={VALUE}"
    with pytest.raises(ConfigError) as info:
        split_url(url)
    assert VALUE not in str(info.value)  # ... and so does the line for a URL that does not parse
    assert f"{name}={MASK}" in str(info.value)
    assert "model=m" in str(info.value)  # other parameters stay readable


def test_the_parsed_and_unparsed_paths_mask_the_same_names() -> None:
    shown = split_url(f"http://127.0.0.1:8000/v1?session={VALUE}&model=m").shown
    assert shown == f"http://127.0.0.1:8000/v1?session={MASK}&model=m"
    assert redact_url_text(f"http://h:99999/v1?session={VALUE}&model=m") == f"http://h:99999/v1?session={MASK}&model=m"


def test_an_unparseable_url_masks_its_userinfo() -> None:
    with pytest.raises(ConfigError) as info:
        split_url(f"http://user:{VALUE}@host:99999/v1")
    assert VALUE not in str(info.value)
    assert f"//{MASK}@host:99999" in str(info.value)


def test_ordinary_parameters_are_not_credentials() -> None:
    assert not any(is_credential_param(n) for n in ("model", "stream", "temperature", "user", "seed"))
    # Names are matched anywhere: max_tokens counts as one (over-matching only masks a harmless value).
    assert is_credential_param("max_tokens")


def test_a_percent_encoded_password_is_hidden_in_both_spellings() -> None:
    raw = "p%40ss-Word-1234"  # sent decoded as p@ss-Word-1234
    split_url(f"http://me:{raw}@127.0.0.1:8000/v1")
    assert redact(f"echo {raw} and p@ss-Word-1234") == f"echo {MASK} and {MASK}"


def test_a_bare_user_token_is_a_secret_and_the_base_has_no_userinfo() -> None:
    url = split_url(f"https://{VALUE}@gateway.example:8443/v1")
    assert url.base == "https://gateway.example:8443/v1"
    assert url.shown == f"https://{MASK}@gateway.example:8443/v1"
    assert redact(f"401: token {VALUE} rejected") == f"401: token {MASK} rejected"


def test_an_ipv6_base_keeps_its_brackets_and_the_query_leaves_the_base() -> None:
    url = split_url(f"http://[::1]:8000/v1?api_key={VALUE}")
    assert url.base == "http://[::1]:8000/v1"
    assert url.credentials.params == (("api_key", VALUE),)
    assert VALUE not in repr(url.credentials)


def test_short_secrets_are_not_searched_for_and_clear_forgets() -> None:
    SECRETS.add("short")
    assert redact("a short word") == "a short word"
    SECRETS.add(VALUE)
    assert len(SECRETS) > 0
    SECRETS.clear()
    assert redact(VALUE) == VALUE
