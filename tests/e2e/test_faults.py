"""The proxy over real sockets against an upstream that misbehaves on demand."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from tests.support.fake_upstream import WORDS, stream_events

CHAT = "/v1/chat/completions"
STREAM_REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def events_of(body: bytes) -> list[bytes]:
    return [event + b"\n\n" for event in body.split(b"\n\n") if event]


def test_stream_is_byte_identical_to_what_the_client_would_get_directly(
    fake_upstream, start_proxy
) -> None:
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url) as client:
        body = client.post(CHAT, json=STREAM_REQUEST).content
        direct = httpx.post(fake_upstream.url + CHAT, json=STREAM_REQUEST).content
    assert b'"choices":[]' in b"".join(fake_upstream.sent_events[0])  # the proxy asked
    assert body == direct
    labels = {"route": CHAT, "model": "m"}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) == 40
    assert proxy.sample("prefill_proxy_time_to_first_token_seconds_count", **labels) == 1
    assert proxy.sample("prefill_proxy_inter_token_latency_seconds_count", **labels) == 2


def test_client_that_asked_for_usage_gets_everything(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url)
    request = {**STREAM_REQUEST, "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=proxy.url) as client:
        body = client.post(CHAT, json=request).content
    assert body == b"".join(stream_events(include_usage=True))


def test_openai_sdk_stream_and_non_stream(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == "".join(WORDS)
    assert reply.usage is not None and reply.usage.prompt_tokens_details.cached_tokens == 32
    parts = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        if chunk.choices
    ]
    assert "".join(parts) == "".join(WORDS)
    assert fake_upstream.received[-1].header("authorization") == "Bearer sk-test"


def test_stream_is_relayed_while_the_upstream_is_still_generating(
    fake_upstream, start_proxy
) -> None:
    """The upstream sends two events and then stalls: the client must get both now, not at
    the end (if the proxy buffered, this read would time out). Closing the client's stream
    must close the upstream connection."""
    proxy = start_proxy(fake_upstream.url)
    with (
        httpx.Client(base_url=proxy.url, timeout=10) as client,
        client.stream(
            "POST", CHAT, json=STREAM_REQUEST, headers={"x-fault": "stall-mid-stream"}
        ) as response,
    ):
        received = []
        for line in response.iter_lines():
            if line.startswith("data:"):
                received.append(json.loads(line[5:]))
            if len(received) == 2:  # the role chunk and "Hello"; then the upstream stalls
                break
    assert fake_upstream.peer_closed.wait(10), "upstream connection was not closed"
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_client_disconnects_total", route=CHAT) == 1)
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0
    assert received[1]["choices"][0]["delta"]["content"] == WORDS[0]


def test_a_responses_stream_cut_mid_stream_ends_with_a_responses_error_event(
    fake_upstream, start_proxy
) -> None:
    """The Responses API's own last word: an ``error`` event numbered after the last one
    relayed, every event before it as the engine sent it."""
    proxy = start_proxy(fake_upstream.url)
    request = {"model": "fake", "input": "hi", "stream": True}
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        whole = client.post("/v1/responses", json=request).content
        body = client.post(
            "/v1/responses", json=request, headers={"x-fault": "reset-mid-stream"}
        ).content
    *relayed, last = events_of(body)
    assert b"".join(relayed) == b"".join(events_of(whole)[:2])
    assert last.startswith(b"event: error\ndata: ")
    error = json.loads(last.split(b"data: ", 1)[1])
    assert error["type"] == "error" and error["code"] == "upstream_broken"
    assert error["sequence_number"] == 2 and fake_upstream.url in error["message"]
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="read") == 1


def test_upstream_reset_mid_stream_ends_with_an_error_event(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        body = client.post(
            CHAT, json=STREAM_REQUEST, headers={"x-fault": "reset-mid-stream"}
        ).content
    events = events_of(body)
    assert events[-1] == b"data: [DONE]\n\n"
    error = json.loads(events[-2][6:])["error"]
    assert error["code"] == "upstream_broken" and fake_upstream.url in error["message"]
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="read") == 1

    sdk = openai.OpenAI(
        base_url=proxy.url + "/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-fault": "reset-mid-stream"},
    )
    with pytest.raises(openai.APIError, match="broke the exchange"):
        for _ in sdk.chat.completions.create(model="m", messages=[], stream=True):
            pass


def test_stalled_headers_hit_the_read_timeout_as_504(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url, read_timeout=0.3)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json=STREAM_REQUEST, headers={"x-fault": "stall-headers"})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="timeout") == 1


def test_total_timeout_bounds_the_wait_for_headers(fake_upstream, start_proxy) -> None:
    """A read timeout of 30 s, a total one of 0.3 s: the 504 comes from the total one (the
    client gives up after 10 s)."""
    proxy = start_proxy(fake_upstream.url, total_timeout=0.3, read_timeout=30)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json=STREAM_REQUEST, headers={"x-fault": "stall-headers"})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_total_timeout_bounds_a_stream(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url, total_timeout=0.3, read_timeout=30)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        body = client.post(
            CHAT, json=STREAM_REQUEST, headers={"x-fault": "stall-mid-stream"}
        ).content
    assert json.loads(events_of(body)[-2][6:])["error"]["code"] == "upstream_timeout"


def test_total_timeout_bounds_a_stream_that_never_goes_quiet(fake_upstream, start_proxy) -> None:
    """Bytes every 0.1 s: the read timeout never fires, so the total one must (reads
    near the deadline are timed, proxy.upstream.UpstreamResponse.iter_bytes)."""
    proxy = start_proxy(fake_upstream.url, total_timeout=1.0, read_timeout=0.5)
    body, given_up = b"", time.monotonic() + 30  # without the bound, this stream never ends
    with httpx.Client(base_url=proxy.url, timeout=10) as client, client.stream(
        "POST", CHAT, json=STREAM_REQUEST, headers={"x-fault": "trickle-mid-stream"}
    ) as response:
        for chunk in response.iter_bytes():
            body += chunk
            if time.monotonic() > given_up:
                pytest.fail("the stream outlived the total timeout by 29 s")
    events = events_of(body)
    assert events.count(b": ping\n\n") >= 3
    assert json.loads(events[-2][6:])["error"]["code"] == "upstream_timeout"
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="timeout") == 1


def test_a_stalled_passthrough_stream_ends_with_an_error_event(fake_upstream, start_proxy) -> None:
    """Every streamed route, not only chat: the client's SSE parser gets its last word."""
    proxy = start_proxy(fake_upstream.url, total_timeout=0.3, read_timeout=30)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        body = client.post(
            "/v1/completions", json=STREAM_REQUEST, headers={"x-fault": "stall-mid-stream"}
        ).content
    events = events_of(body)
    assert events[-1] == b"data: [DONE]\n\n"
    assert json.loads(events[-2][6:])["error"]["code"] == "upstream_timeout"
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


def test_an_upstream_event_past_the_limit_ends_the_stream_with_an_error(
    fake_upstream, start_proxy
) -> None:
    """One event that never ends: held up to max_sse_event_bytes, then the stream ends
    with an error event (not 20 s of CPU and the event held whole in memory)."""
    proxy = start_proxy(fake_upstream.url, max_sse_event_bytes=1_000_000)
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        body = client.post(
            CHAT, json=STREAM_REQUEST, headers={"x-fault": "huge-event-20000000"}
        ).content
    events = events_of(body)
    assert json.loads(events[1][6:])["choices"][0]["delta"]["content"] == WORDS[0]
    assert events[-1] == b"data: [DONE]\n\n"
    assert json.loads(events[-2][6:])["error"]["code"] == "upstream_broken"
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="read") == 1
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


@pytest.mark.parametrize("stream", [1, "true", "True", "yes"])
def test_stream_as_vllm_reads_it_is_streamed(fake_upstream, start_proxy, stream) -> None:
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json={**STREAM_REQUEST, "stream": stream})
    assert response.headers["content-type"].startswith("text/event-stream")
    forwarded = json.loads(fake_upstream.received[-1].body)
    assert forwarded["stream_options"] == {"include_usage": True}  # usage asked for it
    assert b'"usage"' not in response.content  # and taken out again, as for stream: true
    assert proxy.sample("prefill_proxy_prompt_tokens_total", route=CHAT, model="m") == 40


def test_a_reply_too_long_to_keep_is_relayed_whole_and_not_recorded(
    fake_upstream, start_proxy
) -> None:
    proxy = start_proxy(fake_upstream.url, max_reply_chars=10)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        body = client.post(CHAT, json=STREAM_REQUEST).content
    assert [
        json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events_of(body)[1:4]
    ] == WORDS
    assert proxy.sample("prefill_proxy_replies_too_long_total") == 1
    assert proxy.sample("prefill_proxy_sessions_active") == 0


@pytest.mark.parametrize("target", ["/v1/../metrics", "/v1/./models/../../reset_prefix_cache"])
def test_dot_segments_on_the_wire_never_reach_the_upstream(
    fake_upstream, start_proxy, target: str
) -> None:
    """HTTP clients resolve dot segments before sending; a raw request line need not."""
    proxy = start_proxy(fake_upstream.url, passthrough_paths=("*",))
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404")
    assert json.loads(body)["error"]["code"] == "not_found"
    assert fake_upstream.received == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_hangs_up_on_a_request_gets_it_once(
    fake_upstream, start_proxy, stream: bool
) -> None:
    """It may have started generating: sending the POST again could generate twice."""
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(
            CHAT,
            json={**STREAM_REQUEST, "stream": stream},
            headers={"x-fault": "close-after-request"},
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_broken"
    assert len(fake_upstream.received) == 1
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


def test_an_upstream_that_is_not_http_is_a_502(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json=STREAM_REQUEST, headers={"x-fault": "bad-status-line"})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_broken"
    assert proxy.sample("prefill_proxy_internal_errors_total", route=CHAT) == 0
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


def test_refused_upstream_is_502_naming_it(start_proxy) -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proxy = start_proxy(url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json=STREAM_REQUEST)
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200
    assert response.status_code == 502
    assert url in response.json()["error"]["message"]
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="connect") == 1


def test_upstream_5xx_passes_through(fake_upstream, start_proxy) -> None:
    proxy = start_proxy(fake_upstream.url)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        response = client.post(CHAT, json=STREAM_REQUEST, headers={"x-fault": "status-503"})
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "fake 503"


def test_many_concurrent_streams(fake_upstream, start_proxy) -> None:
    """More concurrent streams than httpx's default pool of 100 connections."""
    import asyncio

    proxy = start_proxy(fake_upstream.url)

    async def run() -> list[bytes]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30, limits=limits) as client:

            async def one() -> bytes:
                return (await client.post(CHAT, json=STREAM_REQUEST)).content

            return await asyncio.gather(*(one() for _ in range(250)))

    bodies = asyncio.run(run())
    expected = b"".join(stream_events(include_usage=False))
    assert all(body == expected for body in bodies)
    assert proxy.sample("prefill_proxy_requests_total", route=CHAT, model="m", status="200") == 250
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


def test_the_engine_gets_the_client_s_path_query_headers_and_body_as_sent(
    fake_upstream, start_proxy
) -> None:
    """On the wire, through the engines' pool (proxy.http1): nothing re-quoted, nothing added
    that the client did not send but what HTTP needs (host, content length)."""
    proxy = start_proxy(fake_upstream.url, passthrough_paths=("*",))
    host, port = proxy.url.removeprefix("http://").split(":")
    body = b'{"odd":  "spacing kept"}'
    target = "/v1/some/path%20x?a=1&b=%2F&c=%7e"
    head = f"PUT {target} HTTP/1.1\r\nhost: p\r\nx-client: c\r\ncontent-type: application/x-odd"
    head += f"\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
    (received,) = fake_upstream.received
    assert (received.method, received.path) == ("PUT", target)
    assert received.body == body
    assert received.header("x-client") == "c"
    assert received.header("content-type") == "application/x-odd"
    assert received.header("content-length") == str(len(body))
    for added in ("user-agent", "accept", "accept-encoding"):
        assert received.header(added) is None


def test_a_cookie_the_upstream_sets_goes_to_no_other_request(fake_upstream, start_proxy) -> None:
    """A transparent proxy keeps no cookie jar: a Set-Cookie answered to one client is
    that client's, never added to the requests of others (by a name, as engines are
    addressed in a cluster: an HTTP client keeps no cookies of IP addresses)."""
    proxy = start_proxy(fake_upstream.url.replace("127.0.0.1", "localhost"))
    with httpx.Client(base_url=proxy.url, timeout=10) as first, httpx.Client(
        base_url=proxy.url, timeout=10
    ) as second:
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        reply = first.post(CHAT, json=request, headers={"x-fault": "set-cookie"})
        assert reply.headers["set-cookie"].startswith("affinity=engine-1")
        assert second.post(CHAT, json=request).status_code == 200
    assert len([r for r in fake_upstream.received if r.path == CHAT]) >= 2
    assert [r.header("cookie") for r in fake_upstream.received if r.header("cookie")] == []
