from __future__ import annotations

from proxy import headers

CLIENT = [
    (b"host", b"proxy:8080"),
    (b"authorization", b"Bearer sk-secret"),
    (b"content-type", b"application/json"),
    (b"content-length", b"12"),
    (b"connection", b"keep-alive, x-hop"),
    (b"x-hop", b"1"),
    (b"keep-alive", b"timeout=5"),
    (b"accept-encoding", b"gzip"),
    (b"x-custom", b"a"),
    (b"x-custom", b"b"),
]


def test_request_headers_drop_hop_by_hop_and_keep_the_rest_in_order() -> None:
    assert headers.upstream_request(CLIENT, parsed_body=False) == [
        (b"authorization", b"Bearer sk-secret"),
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"gzip"),
        (b"x-custom", b"a"),
        (b"x-custom", b"b"),
    ]


def test_parsed_bodies_ask_for_an_uncompressed_reply() -> None:
    kept = headers.upstream_request(CLIENT, parsed_body=True)
    assert (b"accept-encoding", b"identity") in kept
    assert (b"accept-encoding", b"gzip") not in kept


def test_response_headers_keep_length_only_when_asked_and_add_overhead() -> None:
    upstream = [
        (b"Content-Type", b"text/event-stream"),
        (b"Content-Length", b"10"),
        (b"Transfer-Encoding", b"chunked"),
        (b"set-cookie", b"a"),
        (b"set-cookie", b"b"),
    ]
    kept = headers.client_response(upstream, b"0.250", keep_length=False)
    assert kept == [
        (b"content-type", b"text/event-stream"),
        (b"set-cookie", b"a"),
        (b"set-cookie", b"b"),
        (b"x-prefill-proxy-overhead-ms", b"0.250"),
    ]
    assert (b"content-length", b"10") in headers.client_response(upstream, b"0", keep_length=True)
    assert headers.is_event_stream(upstream)
