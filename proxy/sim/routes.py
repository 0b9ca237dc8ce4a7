"""The simulator's HTTP handlers: parse, render, submit to the engine, answer like vLLM."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy import jsonio
from proxy.responses.items import NotAConversation
from proxy.sim import reply as replies
from proxy.sim import responses
from proxy.sim import responses_api as api
from proxy.sim.config import SimConfig
from proxy.sim.conversation import InvalidConversation
from proxy.sim.engine import Engine, Handle
from proxy.sim.prompt import Prompt, PromptBuilder
from proxy.sim.request import (
    ChatRequest,
    RequestError,
    check_model,
    output_limit,
    parse_chat,
    parse_completion,
)
from proxy.sim.template import TemplateError

JSON = "application/json"


def error(exc: RequestError) -> Response:
    body = responses.error_body(exc.message, exc.kind, exc.status, exc.param)
    return Response(body, status_code=exc.status, media_type=JSON)


def _usage(handle: Handle) -> responses.Usage:
    return responses.Usage(
        handle.prompt_tokens,
        handle.completion_tokens,
        handle.cached_tokens,
        handle.created_cache_tokens,
    )


class SimRoutes:
    def __init__(
        self,
        config: SimConfig,
        prompts: PromptBuilder,
        engine: Engine,
        registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.engine = engine
        self.registry = registry

    async def _json(self, request: Request) -> Any:
        try:
            return jsonio.loads(await request.body())
        except jsonio.InvalidJSON as exc:
            raise RequestError(400, f"JSON decode error: {exc}", "Bad Request", "body") from exc

    def _render(self, payload: dict[str, Any], messages: Any) -> Prompt:
        """The prompt of a chat request or a /tokenize request (same fields, as in vLLM)."""
        variables = payload.get("chat_template_kwargs") or {}
        if not isinstance(variables, dict):
            raise RequestError(400, "chat_template_kwargs must be an object", "Bad Request")
        try:
            return self.prompts.chat(
                messages,
                payload.get("tools"),
                add_generation_prompt=bool(payload.get("add_generation_prompt", True)),
                continue_final_message=bool(payload.get("continue_final_message", False)),
                variables=variables,
            )
        except (InvalidConversation, TemplateError) as exc:
            raise RequestError(400, str(exc), "BadRequestError") from exc

    def _prepare(self, payload: Any) -> tuple[ChatRequest, Prompt, int]:
        """A chat request read, rendered and given its output limit (raises RequestError)."""
        chat = parse_chat(payload, self.config.model_name, self.config.max_model_len)
        prompt = self._render(payload, chat.messages)
        return chat, prompt, output_limit(chat, len(prompt.tokens), self.config.max_model_len)

    def _plan(self, chat: ChatRequest, prompt: Prompt, limit: int) -> replies.Plan:
        if chat.reply is not None:
            answer = chat.reply
            tokens = self.prompts.answer_tokens(prompt, answer.message())
        elif chat.ignore_eos and chat.max_tokens is not None:
            tokens = replies.synthetic_tokens(prompt.tokens, self.tokenizer, limit)
            answer = replies.Reply(self.tokenizer.decode(tokens))
        else:
            words = replies.synthetic_tokens(
                prompt.tokens, self.tokenizer, self.config.reply_tokens - 1
            )
            answer = replies.Reply(self.tokenizer.decode(words))
            tokens = self.prompts.answer_tokens(prompt, answer.message())
        return replies.plan(answer, tokens, self.tokenizer, limit)

    async def chat_completions(self, request: Request) -> Response:
        try:
            payload = await self._json(request)
            chat, prompt, limit = self._prepare(payload)
        except RequestError as exc:
            return error(exc)
        plan = self._plan(chat, prompt, limit)
        request_id = f"chatcmpl-{secrets.token_hex(8)}"
        handle = self.engine.submit(
            request_id, prompt.tokens, plan.tokens, plan.engine_finish_reason, chat.cache_salt
        )
        if chat.stream:
            fmt = responses.ChunkFormat(
                request_id,
                int(time.time()),
                self.config.model_name,
                self.config.fingerprint,
                chat.include_usage,
                chat.continuous_usage,
            )
            return StreamingResponse(
                self._stream(handle, plan, fmt), media_type="text/event-stream"
            )
        return await self._complete(handle, plan, request_id)

    async def _complete(self, handle: Handle, plan: replies.Plan, request_id: str) -> Response:
        try:
            async for _ in handle.tokens():
                pass
        finally:
            self.engine.abort(handle)  # no-op when finished; frees blocks if we were cancelled
        body = responses.completion_body(
            request_id=request_id,
            created=int(time.time()),
            model=self.config.model_name,
            fingerprint=self.config.fingerprint,
            message=plan.message(),
            finish_reason=plan.finish_reason,
            usage=_usage(handle),
        )
        return Response(body, media_type=JSON)

    async def _stream(
        self, handle: Handle, plan: replies.Plan, fmt: responses.ChunkFormat
    ) -> AsyncIterator[bytes]:
        prompt_tokens = handle.prompt_tokens
        last = len(plan.tokens) - 1
        try:
            async for index in handle.tokens():
                running = responses.running_usage(prompt_tokens, index + 1)
                if index == 0:
                    yield fmt.role(responses.running_usage(prompt_tokens, 0))
                deltas = plan.deltas[index]
                if index < last:
                    for delta in deltas:
                        yield fmt.delta(delta, usage=running)
                    continue
                for delta in deltas[:-1]:
                    yield fmt.delta(delta, usage=running)
                final = deltas[-1] if deltas else {}
                yield fmt.delta(final, finish_reason=plan.finish_reason, usage=running)
            if fmt.include_usage:
                yield fmt.usage(_usage(handle))
            yield responses.DONE
        finally:
            self.engine.abort(handle)  # the client left mid-stream: free its blocks now

    async def responses(self, request: Request) -> Response:
        """/v1/responses: the items rendered as vLLM renders them (as chat messages), the
        chat answer written as output items."""
        try:
            payload = await self._json(request)
            if not isinstance(payload, dict):
                raise RequestError(400, "request body must be a JSON object", "Bad Request")
            previous = payload.get("previous_response_id")
            if previous is not None:
                message = f"Response with id '{previous}' not found."
                raise RequestError(404, message, "invalid_request_error", "response_id")
            try:
                chat_payload = api.chat_payload(payload)
            except NotAConversation as exc:
                raise RequestError(400, str(exc), "invalid_request_error", "input") from exc
            chat, prompt, limit = self._prepare(chat_payload)
        except RequestError as exc:
            return error(exc)
        plan = self._plan(chat, prompt, limit)
        fmt = api.ResponseFormat(
            api.new_response_id(), int(time.time()), self.config.model_name, payload
        )
        handle = self.engine.submit(
            fmt.response_id, prompt.tokens, plan.tokens, plan.engine_finish_reason, chat.cache_salt
        )
        status = "incomplete" if plan.finish_reason == "length" else "completed"
        if chat.stream:
            events = self._response_events(handle, plan, fmt, status)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            async for _ in handle.tokens():
                pass
        finally:
            self.engine.abort(handle)
        output = api.output_items(plan.message())
        used = api.usage(handle.prompt_tokens, handle.completion_tokens, handle.cached_tokens)
        return Response(jsonio.dumps(fmt.body(status, output, used)), media_type=JSON)

    async def _response_events(
        self, handle: Handle, plan: replies.Plan, fmt: api.ResponseFormat, status: str
    ) -> AsyncIterator[bytes]:
        output = api.StreamedOutput(fmt)
        try:
            for event in fmt.opening():
                yield event
            async for index in handle.tokens():
                for event in output.deltas(plan.deltas[index]):
                    yield event
            used = api.usage(handle.prompt_tokens, handle.completion_tokens, handle.cached_tokens)
            for event in output.closing(status, used):
                yield event
        finally:
            self.engine.abort(handle)

    async def completions(self, request: Request) -> Response:
        """/v1/completions, non-streamed: a text or token-id prompt, a synthetic answer.
        Proxies warm the prefix cache this way (proxy.warmup)."""
        try:
            payload = await self._json(request)
            completion = parse_completion(
                payload, self.config.model_name, self.config.max_model_len
            )
            prompt = completion.prompt
            if isinstance(prompt, str):
                encode = self.tokenizer.encode_prompt
                prompt = (encode if completion.add_special_tokens else self.tokenizer.encode)(
                    prompt
                )
            limit = output_limit(completion, len(prompt), self.config.max_model_len)
        except RequestError as exc:
            return error(exc)
        outputs = replies.synthetic_tokens(prompt, self.tokenizer, limit)
        finish = "length" if len(outputs) >= completion.max_tokens else "stop"
        request_id = f"cmpl-{secrets.token_hex(8)}"
        handle = self.engine.submit(request_id, prompt, outputs, finish, completion.cache_salt)
        try:
            async for _ in handle.tokens():
                pass
        finally:
            self.engine.abort(handle)  # no-op when finished; frees blocks if we were cancelled
        body = responses.text_completion_body(
            request_id=request_id,
            created=int(time.time()),
            model=self.config.model_name,
            text=self.tokenizer.decode(outputs),
            finish_reason=finish,
            usage=_usage(handle),
        )
        return Response(body, media_type=JSON)

    async def tokenize(self, request: Request) -> Response:
        try:
            payload = await self._json(request)
            if not isinstance(payload, dict):
                raise RequestError(400, "the request body must be a JSON object", "Bad Request")
            check_model(payload, self.config.model_name)
            tokens = self._tokenize(payload)
        except RequestError as exc:
            return error(exc)
        strs = self.tokenizer.token_strs(tokens) if payload.get("return_token_strs") else None
        body = {
            "count": len(tokens),
            "max_model_len": self.config.max_model_len,
            "tokens": tokens,
            "token_strs": strs,
        }
        return Response(jsonio.dumps(body), media_type=JSON)

    def _tokenize(self, payload: dict[str, Any]) -> list[int]:
        if "messages" in payload:
            return self._render(payload, payload["messages"]).tokens
        text = payload.get("prompt")
        if not isinstance(text, str):
            raise RequestError(400, "either messages or a string prompt is required", "Bad Request")
        if payload.get("add_special_tokens", True):
            return self.tokenizer.encode_prompt(text)
        return self.tokenizer.encode(text)

    async def detokenize(self, request: Request) -> Response:
        try:
            payload = await self._json(request)
            tokens = payload.get("tokens") if isinstance(payload, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise RequestError(400, "tokens must be a list of token ids", "Bad Request")
            try:
                text = self.tokenizer.decode(tokens)
            except (ValueError, KeyError, OverflowError) as exc:  # an id outside the vocabulary
                raise RequestError(
                    400, f"cannot decode these tokens: {exc}", "BadRequestError"
                ) from exc
        except RequestError as exc:
            return error(exc)
        return Response(jsonio.dumps({"prompt": text}), media_type=JSON)

    async def models(self, request: Request) -> Response:
        body = responses.models_body(
            model=self.config.model_name,
            root=self.config.tokenizer or self.config.model_name,
            created=int(time.time()),
            max_model_len=self.config.max_model_len,
        )
        return Response(body, media_type=JSON)

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's dev-mode endpoint: refused (success false) while requests hold blocks."""
        success = self.engine.reset_prefix_cache()
        return Response(jsonio.dumps({"success": success}), media_type=JSON)
