"""A session record as bytes and back, for stores outside the process (JSON via orjson;
chain keys as hex). Field by field, so a field added to the record and not here fails
the round-trip test (tests/unit/test_session_codec.py) instead of vanishing."""

from __future__ import annotations

from typing import Any

from proxy import jsonio
from proxy.compaction.state import Compaction
from proxy.sessions import Pace, Session

FORMAT = 2  # bumped when the layout changes: older records are then dropped, not misread


class CodecError(ValueError):
    """Bytes that are not a session record of this format."""


def encode(session: Session) -> bytes:
    return jsonio.dumps(
        {
            "format": FORMAT,
            "key": session.key,
            "substitutions": [[k.hex(), m] for k, m in session.substitutions.items()],
            "pinned_template_kwargs": session.pinned_template_kwargs,
            "last_note_lines": list(session.last_note_lines),
            "note_carriers": [key.hex() for key in session.note_carriers],
            "system_digest": session.system_digest.hex(),
            "system_lines": [line.hex() for line in session.system_lines],
            "learned": [[key.hex(), count] for key, count in session.learned.items()],
            "last_chain": [k.hex() for k in session.last_chain],
            "last_tools": session.last_tools.hex(),
            "last_prompt_tokens": session.last_prompt_tokens,
            "last_completion_tokens": session.last_completion_tokens,
            "last_reply_tool_calls": session.last_reply_tool_calls,
            "warmed": session.warmed,
            "warmed_tokens": session.warmed_tokens,
            "pace": [session.pace.replied_at, session.pace.gaps],
            "compaction": _compaction(session.compaction),
            "summary_failed_at": session.summary_failed_at,
            "engine": session.engine,
            "router_token": session.router_token,
            "head": session.head.hex(),
            "system_key": session.system_key.hex(),
            "alias_of": session.alias_of,
            "version": session.version,
        }
    )


def decode(data: bytes) -> Session:
    try:
        raw = jsonio.loads(data)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CodecError("not a session record of this format")
        replied_at, gaps = raw["pace"]
        return Session(
            key=raw["key"],
            substitutions={bytes.fromhex(k): m for k, m in raw["substitutions"]},
            pinned_template_kwargs=raw["pinned_template_kwargs"],
            last_note_lines=tuple(raw["last_note_lines"]),
            note_carriers=tuple(bytes.fromhex(key) for key in raw["note_carriers"]),
            system_digest=bytes.fromhex(raw["system_digest"]),
            system_lines=tuple(bytes.fromhex(line) for line in raw["system_lines"]),
            learned={bytes.fromhex(key): int(count) for key, count in raw["learned"]},
            last_chain=tuple(bytes.fromhex(k) for k in raw["last_chain"]),
            last_tools=bytes.fromhex(raw["last_tools"]),
            last_prompt_tokens=raw["last_prompt_tokens"],
            last_completion_tokens=raw["last_completion_tokens"],
            last_reply_tool_calls=raw["last_reply_tool_calls"],
            warmed=raw["warmed"],
            warmed_tokens=raw.get("warmed_tokens", 0),  # absent in an older replica's record
            pace=Pace(replied_at, list(gaps)),
            compaction=_from_compaction(raw["compaction"]),
            summary_failed_at=raw["summary_failed_at"],
            engine=raw["engine"],
            router_token=raw["router_token"],
            head=bytes.fromhex(raw["head"]),
            system_key=bytes.fromhex(raw["system_key"]),
            alias_of=raw["alias_of"],
            version=raw["version"],
        )
    except CodecError:
        raise
    except (jsonio.InvalidJSON, KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"not a session record: {exc!r}") from exc


def _hex(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


def _compaction(state: Compaction | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "cut_key": _hex(state.cut_key),
        "cut_hint": state.cut_hint,
        "stand_in": state.stand_in,
        "summary": state.summary,
        "facts": state.facts,
        "elided": [[k.hex(), stand_in, size] for k, (stand_in, size) in state.elided.items()],
        "events": state.events,
        "unreported": state.unreported,
        "sizes": [[k.hex(), size] for k, size in state.sizes.items()],
        "ratio": state.ratio,
        "last_estimate": state.last_estimate,
        "last_used": state.last_used,
    }


def _from_compaction(raw: dict[str, Any] | None) -> Compaction | None:
    if raw is None:
        return None
    return Compaction(
        cut_key=_bytes(raw["cut_key"]),
        cut_hint=raw["cut_hint"],
        stand_in=raw["stand_in"],
        summary=raw["summary"],
        facts=list(raw["facts"]),
        elided={bytes.fromhex(k): (stand_in, size) for k, stand_in, size in raw["elided"]},
        events=raw["events"],
        unreported=raw["unreported"],
        sizes={bytes.fromhex(k): size for k, size in raw["sizes"]},
        ratio=raw["ratio"],
        last_estimate=raw["last_estimate"],
        last_used=raw["last_used"],
    )
