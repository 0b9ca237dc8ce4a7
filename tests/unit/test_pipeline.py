from __future__ import annotations

import copy

import pytest

from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.pipeline import transform
from proxy.rewrite.stream_usage import request_usage

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CONTEXT = RewriteContext()


@transform("add_a")
def add_a(request: dict, context: RewriteContext) -> dict:
    return {**request, "a": 1}


@transform("noop")
def noop(request: dict, context: RewriteContext) -> None:
    return None


@transform("boom")
def boom(request: dict, context: RewriteContext) -> dict:
    raise RuntimeError("bug")


def test_empty_pipeline_returns_the_same_object() -> None:
    result = Pipeline([]).apply(REQUEST, CONTEXT)
    assert result.request is REQUEST and not result.changed


def test_applied_transforms_are_named_in_order() -> None:
    result = Pipeline([noop, add_a]).apply(REQUEST, CONTEXT)
    assert result.request == {**REQUEST, "a": 1}
    assert result.applied == ("add_a",)
    assert REQUEST == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_raising_transform_fails_open_with_the_original_request() -> None:
    original = copy.deepcopy(REQUEST)
    result = Pipeline([add_a, boom]).apply(REQUEST, CONTEXT)
    assert result.request is REQUEST and result.request == original
    assert result.applied == () and result.failed == ("boom",)


def test_disabled_transforms_do_not_run() -> None:
    pipeline = Pipeline([add_a, boom], disabled=["boom"])
    assert pipeline.names == ("add_a",)
    assert pipeline.apply(REQUEST, CONTEXT).failed == ()


def test_disabling_an_unknown_transform_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="unknown rewrites"):
        Pipeline([add_a], disabled=["add_b"])


def test_deterministic() -> None:
    pipeline = Pipeline([add_a])
    assert pipeline.apply(REQUEST, CONTEXT) == pipeline.apply(copy.deepcopy(REQUEST), CONTEXT)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, {"include_usage": True}),
        ({"include_usage": False}, {"include_usage": True}),
        (
            {"continuous_usage_stats": False},
            {"continuous_usage_stats": False, "include_usage": True},
        ),
    ],
)
def test_usage_is_requested_for_streams(options: dict | None, expected: dict) -> None:
    request = {**REQUEST, "stream": True}
    if options is not None:
        request["stream_options"] = options
    rewritten = request_usage(request)
    assert rewritten is not None and rewritten["stream_options"] == expected
    assert request.get("stream_options") == options  # the input is not mutated


def test_usage_left_alone_when_the_client_asked() -> None:
    assert request_usage({**REQUEST, "stream_options": {"include_usage": True}}) is None
