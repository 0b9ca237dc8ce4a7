"""Which lines of a system prompt carry values that change from one request to the next:
clocks, dates, UUIDs, Unix times, labelled ids, and the patterns settings add
(VolatileDetector). proxy.rewrite.volatile moves those lines out of the prompt; session
and message keys mask them (``key``). No I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

from proxy.rewrite.learned import shape

PLACEHOLDER = "<volatile>"
_WEEKDAY = (
    r"(?:Mon(?:day)?|Tue(?:s|sday)?|Wed(?:nesday)?|Thu(?:r|rs|rsday)?|Fri(?:day)?"
    r"|Sat(?:urday)?|Sun(?:day)?)\.?"
)
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t|tember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_YEAR = r"(?:19|20)\d\d"
_MM = r"(?:0[1-9]|1[0-2])"
_DD = r"(?:0[1-9]|[12]\d|3[01])"
_M = r"(?:0?[1-9]|1[0-2])"
_D = r"(?:0?[1-9]|[12]\d|3[01])"
_ORDINAL = r"(?:st|nd|rd|th)?"
_DATE = (
    rf"(?:{_YEAR}-{_MM}-{_DD}"  # 2026-11-29
    rf"|{_YEAR}/{_MM}/{_DD}"  # 2026/11/29
    rf"|{_M}/{_D}/{_YEAR}"  # 11/29/2026
    rf"|{_D}\.{_M}\.{_YEAR}"  # 29.11.2026
    rf"|{_MONTH} {_D}{_ORDINAL},? {_YEAR}"  # November 29, 2026
    rf"|{_D}{_ORDINAL} {_MONTH},? {_YEAR})"  # 29 Nov 2026
)
# A day without a year ("Sunday, November 29") counts only after a weekday.
_SHORT_DATE = rf"(?:{_MONTH} {_D}{_ORDINAL}|{_D}{_ORDINAL} {_MONTH})"
_ZONE = (
    r"(?:\s?(?:Z|[+-](?:[01]\d|2[0-3]):?[0-5]\d)"  # Z, +01:00
    r"|\s(?:UTC|GMT)(?:[+-]\d\d?(?::?\d\d)?)?"  # UTC, GMT+1
    r"|\s[A-Z]{2,4}T)"  # EST, CEST
)
_TIME = (
    r"(?:(?:[01]?\d|2[0-3]):[0-5]\d:[0-5]\d(?:[.,]\d+)?(?:\s?[AaPp]\.?[Mm]\b\.?)?"  # 10:15:42
    r"|(?:0?[1-9]|1[0-2]):[0-5]\d\s?[AaPp]\.?[Mm]\b\.?"  # 10:15 AM
    r"|(?:[01]\d|2[0-3]):[0-5]\d(?![:\d]))"  # 14:30 (two-digit hour only)
    rf"{_ZONE}?"
)
_DATETIME = (
    rf"(?:{_WEEKDAY},?\s+(?:{_DATE}|{_SHORT_DATE})|{_DATE})"
    rf"(?:(?:T|\s+|,\s*|\s+at\s+){_TIME})?"
)
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
# Unix time in seconds or milliseconds from mid-2017 to mid-2036, standing alone.
_UNIX = r"(?:1[5-9]|20)\d{8}(?:\d{3})?"
# An id only where it is labelled as one, and only if the value has a digit in it.
_MARKED_ID = (
    r"(?i:\b(?:request|req|trace|span|correlation|session|run|message|call|invocation)"
    r"[ _-]?id\b\s*[:=#]?\s*[\"']?)(?P<value>(?=[\w.:-]*\d)[\w.:-]{4,})"
)

_DIGIT = re.compile(r"\d")

BUILTIN_PATTERNS: tuple[str, ...] = (
    rf"(?<![\w/.:-])(?:{_DATETIME})(?![\w/-]|\.\d)",
    rf"(?<![\w-]){_UUID}(?![\w-])",
    rf"(?<![\w.:/-]){_UNIX}(?![\w:/-]|\.\d)",
    # No bare time of day: in system prompts those are opening hours and format examples
    # ("from 8:00 to 20:00", '"02:30:00" means 2:30 AM'), stable text; a current time
    # comes with its date, which the pattern above takes together.
    _MARKED_ID,
)


@dataclasses.dataclass(frozen=True)
class VolatileDetector:
    """Finds values that change from one request to the next. Build it once (the regular
    expressions compile here, a bad one raises ``re.error``); ``extra_patterns`` come from
    settings. A pattern with a group named ``value`` marks only that group as volatile
    (its label stays when masking)."""

    extra_patterns: tuple[str, ...] = ()
    _builtin: tuple[re.Pattern[str], ...] = dataclasses.field(init=False, repr=False, compare=False)
    _extra: tuple[re.Pattern[str], ...] = dataclasses.field(init=False, repr=False, compare=False)
    _line_spans: Callable[[str], tuple[tuple[int, int], ...]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    _key: Callable[[str], str] = dataclasses.field(init=False, repr=False, compare=False)
    _split: Callable[..., tuple[str, tuple[str, ...]]] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("_builtin", tuple(re.compile(p) for p in BUILTIN_PATTERNS))
        set_("_extra", tuple(re.compile(p) for p in self.extra_patterns))
        # System prompts repeat from request to request, and most of their lines do even
        # when one changes: scanning a line once is enough (a 7k-character prompt takes
        # about a millisecond to scan).
        set_("_line_spans", functools.lru_cache(maxsize=16_384)(self._scan_line))
        # A system prompt is keyed on every request of every conversation sharing it.
        set_("_key", functools.lru_cache(maxsize=1024)(lambda text: shape(text, self.mask)))
        set_("_split", functools.lru_cache(maxsize=1024)(self._split_text))

    def _scan_line(self, line: str) -> tuple[tuple[int, int], ...]:
        # Every built-in pattern needs a digit: most lines of a system prompt have none.
        regexes = (*self._builtin, *self._extra) if _DIGIT.search(line) else self._extra
        found = sorted(
            match.span("value" if "value" in regex.groupindex else 0)
            for regex in regexes
            for match in regex.finditer(line)
            if match.end() > match.start()
        )
        merged: list[tuple[int, int]] = []
        for start, end in found:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return tuple(merged)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The volatile spans of ``text``, sorted, overlapping ones merged. Values never
        span lines."""
        found: list[tuple[int, int]] = []
        offset = 0
        for line in text.split("\n"):
            found += [(offset + start, offset + end) for start, end in self._line_spans(line)]
            offset += len(line) + 1
        return found

    def finds(self, text: str) -> bool:
        return bool(self.spans(text))

    def mask(self, text: str) -> str:
        """``text`` with each volatile span replaced by ``PLACEHOLDER``: two prompts that
        differ only in volatile values mask to the same string."""
        pieces, last = [], 0
        for start, end in self.spans(text):
            pieces += [text[last:start], PLACEHOLDER]
            last = end
        return "".join([*pieces, text[last:]])

    def key(self, text: str) -> str:
        """``text`` as session and message keys see it: masked, and every number 0, so a
        line whose numbers change (a clock no pattern knows, a counter) keeps its keys."""
        return self._key(text)

    def split(
        self, text: str, also: Callable[[str], bool] | None = None
    ) -> tuple[str, tuple[str, ...]]:
        """(``text`` without its volatile lines, those lines in order): the patterns', and
        those ``also`` says are (learned for the session). Lines split on ``\\n`` only. A
        moved line at the start or after a blank line takes the blank lines that follow it
        along, so "<clock>\\n\\n<prompt>" leaves exactly "<prompt>". Cached: a system
        prompt is split several times a request, on every request (``also`` is the same
        object for the same learned lines, proxy.rewrite.learned.learned_line)."""
        return self._split(text, also)

    def _split_text(
        self, text: str, also: Callable[[str], bool] | None
    ) -> tuple[str, tuple[str, ...]]:
        kept: list[str] = []
        moved: list[str] = []
        eat_blanks = False
        for line in text.split("\n"):
            if self._line_spans(line) or (also is not None and also(line)):
                moved.append(line)
                eat_blanks = eat_blanks or not kept or kept[-1] == ""
            elif line == "" and eat_blanks:
                continue
            else:
                kept.append(line)
                eat_blanks = False
        return "\n".join(kept), tuple(moved)


DEFAULT_DETECTOR = VolatileDetector()
