"""What comes off the wire, one layer at a time: the SSE parser (event framing whatever the chunking), the field
checks every body goes through (``endpoint/wire``), and a request record's derived figures and retry rule."""

from __future__ import annotations

import math
import random

import pytest

from agentload.endpoint import wire
from agentload.endpoint.records import ErrorKind, Outcome, RequestRecord
from agentload.endpoint.wire import MalformedField, SSEParser, SSETooLong, Usage, index, loads, mapping, sequence, text

# A stream as vLLM sends it, with what an SSE parser must also take: a comment line, an ``event:`` field, a
# ``data:`` without its space, a two-line data event, CRLF line ends, and a last event cut short.
STREAM = (
    b": keep-alive\n\n"
    b'data: {"a":1}\n\n'
    b"event: message\r\ndata: two\r\ndata: lines\r\n\r\n"
    b"data:tight\n\n"
    b"id: 7\nretry: 100\n\n"  # no data field: no event
    b"data: [DONE]\n\n"
    b"data: cut"
)
EVENTS = [b'{"a":1}', b"two\nlines", b"tight", b"[DONE]"]


def test_a_whole_stream_in_one_feed() -> None:
    parser = SSEParser()
    assert parser.feed(STREAM) == EVENTS
    assert parser.pending == b"data: cut"  # the unterminated tail is kept, not returned


@pytest.mark.parametrize("seed", range(5))
def test_events_do_not_depend_on_where_the_socket_split_the_bytes(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(STREAM)), 12))
    parser = SSEParser()
    got: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True):
        got += parser.feed(STREAM[a:b])
    assert got == EVENTS
    assert parser.pending == b"data: cut"


def test_byte_by_byte_including_a_crlf_split_between_feeds() -> None:
    parser = SSEParser()
    got: list[bytes] = []
    for i in range(len(STREAM)):
        got += parser.feed(STREAM[i : i + 1])
    assert got == EVENTS


def test_only_one_space_after_the_colon_is_dropped() -> None:
    # SSE spec: "If value starts with a U+0020 SPACE character, remove it" — one space, not all.
    assert SSEParser().feed(b"data:  x\n\n") == [b" x"]
    assert SSEParser().feed(b"data:\n\n") == [b""]  # an empty data field is an empty event, not no event


def test_an_event_without_an_end_is_refused_past_the_limit() -> None:
    parser = SSEParser(max_event_bytes=32)
    assert parser.feed(b"data: " + b"x" * 20) == []
    with pytest.raises(SSETooLong, match="longer than 32 bytes"):
        parser.feed(b"x" * 20)


def test_a_long_event_that_ends_within_one_feed_is_fine() -> None:
    # The limit is on what stays buffered; a big event that completes is returned whole.
    parser = SSEParser(max_event_bytes=32)
    assert parser.feed(b"data: " + b"y" * 100 + b"\n\n") == [b"y" * 100]
    assert parser.pending == b""


# -- fields --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [b"NaN", b"[Infinity]", b"1e400", b'"\\ud800"', b"[" * 2000 + b"]" * 2000, b"{"])
def test_loads_refuses_what_would_break_a_result_file(body: bytes) -> None:
    with pytest.raises(MalformedField, match="not JSON"):
        loads(body)


def test_loads_takes_strict_json_as_bytes_or_text() -> None:
    assert loads(b'{"x": [1, 2.5, null]}') == {"x": [1, 2.5, None]}
    assert loads('"é"') == "é"


def test_shape_checks_pass_none_and_their_own_type_and_name_the_field() -> None:
    assert text(None, "content") is None
    assert text("hi", "content") == "hi"
    assert mapping({}, "delta") == {}
    assert sequence([1], "choices") == [1]
    with pytest.raises(MalformedField, match=r"^choices is a str, not an array$"):
        sequence("oops", "choices")
    with pytest.raises(MalformedField, match=r"^delta is a list, not an object$"):
        mapping([1, 2], "delta")
    with pytest.raises(MalformedField, match=r"^content is a int, not a string$"):
        text(3, "content")


@pytest.mark.parametrize("value", [True, 1.0, -1, 8, "0", None])
def test_a_tool_call_index_is_a_small_plain_integer(value: object) -> None:
    with pytest.raises(MalformedField, match=r"tool_calls\.index is .*not an integer in \[0, 8\)"):
        index(value, "tool_calls.index", 8)


def test_index_in_range() -> None:
    assert index(0, "i", 8) == 0
    assert index(7, "i", 8) == 7


def test_usage_reads_the_fields_and_ignores_the_rest() -> None:
    usage = Usage.read(
        {
            "prompt_tokens": 900,
            "completion_tokens": 12,
            "total_tokens": 912,
            "prompt_tokens_details": {"cached_tokens": 896},
        }
    )
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (900, 12, 896)
    assert Usage.read({}).cached_tokens is None  # vLLM without --enable-prompt-tokens-details


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], r"^usage is a list, not an object$"),
        ({"prompt_tokens": "9"}, r"^usage prompt_tokens: "),
        ({"prompt_tokens": 9.0}, r"^usage prompt_tokens: "),  # strict: a float is not a token count
        ({"prompt_tokens": True}, r"^usage prompt_tokens: "),
        ({"completion_tokens": -1}, r"^usage completion_tokens: "),
        ({"prompt_tokens": 2_000_000_000}, r"^usage prompt_tokens: .*1000000000"),
        ({"prompt_tokens_details": {"cached_tokens": "x"}}, r"^usage prompt_tokens_details\.cached_tokens: "),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}, "11 cached tokens of a 10-token"),
    ],
)
def test_a_bad_usage_object_names_its_first_bad_field(value: object, message: str) -> None:
    with pytest.raises(MalformedField, match=message):
        Usage.read(value)


# -- records ---------------------------------------------------------------------------------------------------
def test_record_timings_from_the_client_clock() -> None:
    rec = RequestRecord(t_sent=10.0, t_first_token=10.25, t_done=11.0, chunk_times=[10.25, 10.5, 10.5, 11.0])
    assert rec.ttft == 0.25
    assert rec.latency == 1.0
    assert rec.itl() == [0.25, 0.0, 0.5]
    pct = rec.itl_percentiles((50, 100))
    assert pct == {"p50": 0.25, "p100": 0.5}


def test_a_record_that_never_saw_a_token() -> None:
    rec = RequestRecord(t_sent=1.0, t_done=3.0, outcome=Outcome.TIMEOUT, error=ErrorKind.FIRST_TOKEN_TIMEOUT)
    assert rec.ttft is None
    assert rec.itl() == []
    assert rec.itl_percentiles() == {}
    assert not rec.ok
    assert not math.isnan(rec.latency)


@pytest.mark.parametrize(
    ("fields", "transient"),
    [
        ({"outcome": Outcome.CONNECT_ERROR, "error": ErrorKind.CONNECT}, True),
        ({"outcome": Outcome.TIMEOUT, "error": ErrorKind.IDLE_TIMEOUT}, True),
        ({"outcome": Outcome.STREAM_ERROR, "error": ErrorKind.RESET}, True),
        ({"outcome": Outcome.STREAM_ERROR, "error": ErrorKind.MALFORMED}, True),
        ({"outcome": Outcome.HTTP_ERROR, "http_status": 429}, True),
        ({"outcome": Outcome.HTTP_ERROR, "http_status": 503}, True),
        ({"outcome": Outcome.HTTP_ERROR, "http_status": 400}, False),  # the same body fails the same way
        ({"outcome": Outcome.HTTP_ERROR, "http_status": 401}, False),
        ({"outcome": Outcome.HTTP_ERROR, "http_status": 501}, False),  # not implemented stays not implemented
        ({"outcome": Outcome.SERVER_ERROR, "error": ErrorKind.SERVER}, False),
        ({"outcome": Outcome.CANCELLED, "error": ErrorKind.CANCELLED}, False),
        ({}, False),
    ],
)
def test_which_failures_are_worth_resending(fields: dict[str, object], transient: bool) -> None:
    rec = RequestRecord.model_validate({"t_sent": 0.0, "t_done": 1.0, **fields})
    assert rec.transient is transient


def test_a_record_round_trips_through_json() -> None:
    rec = RequestRecord(
        t_sent=0.0, t_done=2.0, chunk_times=[0.5, 1.0], prompt_tokens=7, cached_tokens=None,
        outcome=Outcome.HTTP_ERROR, http_status=503, retry_after_s=1.5,
    )  # fmt: skip
    back = RequestRecord.model_validate_json(rec.model_dump_json())
    assert back == rec
    assert back.cached_tokens is None  # "not reported" survives; it is not turned into 0


def test_request_bodies_are_compact_json_and_what_orjson_refuses_goes_through_json() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 8}
    assert wire.dumps(body) == '{"model":"m","messages":[{"role":"user","content":"héllo"}],"max_tokens":8}'.encode()
    assert wire.dumps({1: "x"}) == b'{"1":"x"}'  # json's key coercion kept
    huge = {"seed": 2**70}  # past 64 bits: orjson refuses, json writes it
    assert wire.loads(wire.dumps(huge)) == huge
    with pytest.raises(TypeError):
        wire.dumps({"when": object()})
