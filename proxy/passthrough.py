"""Every other path: the request forwarded as it came, the response relayed as it comes."""

from __future__ import annotations

from proxy.call import Call, Services
from proxy.downstream import Downstream
from proxy.errors import NotForwarded
from proxy.paths import PathPolicy

# Routes named in metrics and logs; any other path counts as "other" (bounded labels).
KNOWN_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/models",
        "/tokenize",
        "/detokenize",
    }
)


class PassthroughCall(Call):
    def __init__(self, services: Services, down: Downstream, paths: PathPolicy) -> None:
        path = down.scope["path"]
        super().__init__(services, down, route=path if path in KNOWN_ROUTES else "other")
        self.paths = paths

    async def handle(self) -> None:
        refusal = self.paths.refusal(self.down.scope["path"])
        if refusal is not None:
            raise NotForwarded(refusal)
        body = await self.down.read_body(self.settings.max_body_bytes)
        await self.send(body or None, parsed_body=False)
        await self.relay(self.response_headers())
