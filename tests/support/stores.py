"""A session store that keeps only bytes (proxy.session_codec), as a networked store does:
whatever the proxy needs of a session must survive the round trip."""

from __future__ import annotations

import collections

from proxy import session_codec
from proxy.sessions import Session


class CodecStore:
    waits = False

    def __init__(self) -> None:
        self._records: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._versions: dict[str, int] = {}

    async def get(self, key: str) -> Session | None:
        data = self._records.get(key)
        return None if data is None else session_codec.decode(data)

    async def save(self, session: Session) -> bool:
        stored = self._versions.get(session.key)
        if stored is not None and stored != session.version:
            return False
        session.version += 1
        self._records[session.key] = session_codec.encode(session)
        self._versions[session.key] = session.version
        return True

    async def delete(self, key: str) -> None:
        self._records.pop(key, None)
        self._versions.pop(key, None)

    async def aclose(self) -> None:
        pass

    def held(self) -> int:
        return len(self._records)

    def __len__(self) -> int:
        return len(self._records)
