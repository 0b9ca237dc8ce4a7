"""The rewrite pipeline: an ordered list of pure transforms, each switchable, failing open.

A transform is ``(request, context) -> request | None``: it returns a new request dict
when it changes something (it must not mutate its input) and None when it has nothing to
do. It does no I/O, so the same input and context always give the same output.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from proxy.failopen import FailOpenLog
from proxy.known import Known
from proxy.sessions import Session

log = logging.getLogger("prefill_proxy.rewrite")

Request = dict[str, Any]


class Detector(Protocol):
    """Finds volatile values (dates, ids) in text: proxy.rewrite.detector.VolatileDetector."""

    def mask(self, text: str) -> str: ...

    def key(self, text: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class RewriteContext:
    """What a transform may read besides the request. The session is read only here: the
    proxy records into it after the reply, outside the pipeline."""

    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    session: Session | None = None
    volatile: Detector | None = None
    # proxy.transcript.chain_keys of the client's messages, when the session computed them
    message_keys: Sequence[bytes] = ()
    # What the request knows of its messages (proxy.known.Known): scans carried on.
    known: Known | None = None

    def key_of(self, index: int) -> bytes | None:
        return self.message_keys[index] if 0 <= index < len(self.message_keys) else None

    @property
    def mask(self) -> Callable[[str], str] | None:
        return self.volatile.key if self.volatile is not None else None

    @property
    def pinned_template_kwargs(self) -> Mapping[str, Any]:
        return self.session.pinned_template_kwargs if self.session is not None else {}


class Transform(Protocol):
    name: str

    def __call__(self, request: Request, context: RewriteContext) -> Request | None: ...


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    request: Request
    applied: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.applied)


class Pipeline:
    def __init__(self, transforms: Sequence[Transform], disabled: Iterable[str] = ()) -> None:
        known = {t.name for t in transforms}
        unknown = sorted(set(disabled) - known)
        if unknown:
            raise ValueError(f"unknown rewrites to disable: {', '.join(unknown)}")
        self._transforms = tuple(t for t in transforms if t.name not in set(disabled))
        self._failures = FailOpenLog(log)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._transforms)

    def __bool__(self) -> bool:
        return bool(self._transforms)

    def apply(self, request: Request, context: RewriteContext) -> RewriteResult:
        """Run each transform in order. If one raises, the client's request goes upstream
        unchanged (fail open): a half-rewritten request could break what later ones keep."""
        original = request
        applied: list[str] = []
        for transform in self._transforms:
            try:
                rewritten = transform(request, context)
            except Exception as exc:  # a transform bug must never fail the agent's step
                self._failures.failed(f"rewrite {transform.name}", exc)
                return RewriteResult(original, (), (transform.name,))
            if rewritten is not None and rewritten is not request:
                request = rewritten
                applied.append(transform.name)
        return RewriteResult(request, tuple(applied))


def transform(
    name: str,
) -> Callable[[Callable[[Request, RewriteContext], Request | None]], Transform]:
    """Name a plain function as a transform."""

    def wrap(function: Callable[[Request, RewriteContext], Request | None]) -> Transform:
        function.name = name  # type: ignore[attr-defined]
        return function  # type: ignore[return-value]

    return wrap
