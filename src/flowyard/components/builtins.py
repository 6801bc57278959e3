"""The built-in components. They are registered through the same entry-point
group as third-party ones (see pyproject.toml)."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from flowyard.components.context import StepContext
from flowyard.components.expressions import (
    ExpressionError,
    apply_mapper,
    compile_expression,
    compile_mapper,
)
from flowyard.components.netpolicy import redact_url, refusal_of, scrub_userinfo
from flowyard.components.registry import Component, Message
from flowyard.components.retry import CallFlow, ComponentError, NonRetryable, Park, parse_retry_after
from flowyard.ids import is_valid_id


def _expr(value: str) -> str:
    compile_expression(value)
    return value


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def passthrough(message: Message, _ctx: StepContext) -> Message:
    return message


WEBHOOK = Component.single(
    "webhook",
    "Trigger: receives the JSON posted to the flow's webhook and passes it on.",
    "receive",
    passthrough,
    _Fields,
    trigger=True,
    awaits=False,
)

SCHEDULE = Component.single(
    "schedule",
    "Trigger: starts the flow on its cron schedule with the scheduled time as data.",
    "tick",
    passthrough,
    _Fields,
    trigger=True,
    awaits=False,
)


class JsonataFields(_Fields):
    expression: str = Field(
        description="JSONata evaluated against the message data; the result is the new data."
    )

    _check = field_validator("expression")(_expr)


async def jsonata_transform(message: Message, ctx: StepContext) -> Message:
    result = compile_expression(ctx.fields.expression).evaluate(message["data"])
    if result is None:
        raise NonRetryable(f"expression {ctx.fields.expression!r} yielded no value")
    return {"data": result, "metadata": message["metadata"]}


JSONATA = Component.single(
    "jsonata",
    "Transform the message data with a JSONata expression.",
    "transform",
    jsonata_transform,
    JsonataFields,
    awaits=False,
)


class FilterFields(_Fields):
    condition: str = Field(description="JSONata; the message passes on only when it is truthy.")

    _check = field_validator("condition")(_expr)


def truthy(value: Any) -> bool:
    """JSONata's boolean cast: empty arrays, strings, objects, 0 and null are false."""
    if isinstance(value, list):
        return any(truthy(v) for v in value)
    return bool(value)


async def filter_messages(message: Message, ctx: StepContext) -> Message | None:
    return message if truthy(compile_expression(ctx.fields.condition).evaluate(message["data"])) else None


FILTER = Component.single(
    "filter",
    "Drop the message unless a JSONata condition holds.",
    "filter",
    filter_messages,
    FilterFields,
    awaits=False,
)


class SplitFields(_Fields):
    expression: str = Field("$", description="JSONata yielding the array to split; default: the data itself.")

    _check = field_validator("expression")(_expr)


async def split_array(message: Message, ctx: StepContext) -> list[Message]:
    value = compile_expression(ctx.fields.expression).evaluate(message["data"])
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    budget = ctx.settings.max_messages
    if len(items) > budget:
        raise NonRetryable(f"split would emit {len(items)} messages; the limit per execution is {budget}")
    meta = message["metadata"]
    return [{"data": item, "metadata": {**meta, "splitIndex": i}} for i, item in enumerate(items)]


SPLIT = Component.single(
    "split",
    "Emit one message per element of an array.",
    "split",
    split_array,
    SplitFields,
    awaits=False,
)


class LogFields(_Fields):
    level: Literal["debug", "info", "warn", "error"] = "info"
    message: str | None = Field(None, max_length=2000, description="Text of the entry; default: 'message'.")
    includeData: bool = Field(True, description="Attach the message data to the entry.")


async def log_message(message: Message, ctx: StepContext) -> Message:
    ctx.log(
        ctx.fields.level, ctx.fields.message or "message", message["data"] if ctx.fields.includeData else None
    )
    return message


LOG = Component.single(
    "log",
    "Write the message to the flow's logs and pass it on.",
    "log",
    log_message,
    LogFields,
    awaits=False,
)


class DelayFields(_Fields):
    seconds: float = Field(
        ge=0,
        le=30 * 86400,
        description="How long to wait before passing the message on (at most 30 days); more than "
        "FLOWYARD_DELAY_PARK_SECONDS parks the execution durably.",
    )


async def delay(message: Message, ctx: StepContext) -> Message:
    """A wait longer than FLOWYARD_DELAY_PARK_SECONDS parks the execution durably (SPEC §11:
    it holds no runner or slot meanwhile); a shorter one sleeps here."""
    seconds = ctx.fields.seconds
    if ctx.resumed:
        return message  # parked for it already: the wait is over
    if seconds > ctx.settings.delay_park_seconds:
        raise Park(seconds)
    await asyncio.sleep(seconds)
    return message


DELAY = Component.single(
    "delay",
    "Wait, then pass the message on; a wait of more than FLOWYARD_DELAY_PARK_SECONDS parks the "
    "execution (status waiting) and holds nothing meanwhile.",
    "delay",
    delay,
    DelayFields,
)


# -- join and flow (SPEC §12): both wait durably, holding nothing (docs/components.md) ---------

JOIN_MAX_TIMEOUT = 7 * 24 * 3600.0  # a week: longer is a mistake, not a join
FLOW_MAX_TIMEOUT = 24 * 3600.0


class JoinFields(_Fields):
    count: int | None = Field(
        None,
        ge=1,
        le=10_000,
        strict=True,
        description="Emit once this many messages have arrived (from any incoming edges); "
        "absent: once one has arrived from each incoming edge.",
    )
    timeout: float = Field(
        60.0,
        gt=0,
        le=JOIN_MAX_TIMEOUT,
        description="Seconds from the first message of a set until the step fails if the set is "
        "not complete (at most a week).",
    )

    @field_validator("timeout", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number of seconds")
        return value


async def join(message: Message, _ctx: StepContext) -> Message:
    """The runner gathers the set (runtime/join.py) and calls this with its list as data."""
    return message


JOIN = Component(
    id="join",
    description="Wait for a message from each incoming edge (or fields.count messages), then emit "
    "one message whose data is the list of their data, in edge order. The wait is durable and "
    "holds nothing; fields.timeout (default 60 s) fails the step if the set does not complete.",
    functions={"join": join},
    default_function="join",
    fields=JoinFields,
    awaits=False,
    joins=True,
)


class FlowFields(_Fields):
    flowId: str = Field(
        description="The flow to run (24 hex characters): a flow of this flow's tenant that its "
        "owners can see. Its execution gets the message data as trigger data."
    )
    timeout: float = Field(
        300.0,
        gt=0,
        le=FLOW_MAX_TIMEOUT,
        description="Seconds the step waits for the sub-flow's execution to finish (at most a day); "
        "the execution waits parked, holding nothing.",
    )

    @field_validator("flowId")
    @classmethod
    def _id(cls, value: str) -> str:
        if not is_valid_id(value):
            raise ValueError("must be a flow id (24 hex characters)")
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number of seconds")
        return value


def flow_refusal(flow_id: str) -> str:
    """The one answer, on save and when the step runs, for a flow a ``flow`` step may not run:
    one that does not exist, one of another tenant and one its owners cannot see read the same."""
    return f"flow {flow_id} is not a flow of this tenant that this flow's owners can see"


async def call_flow(message: Message, ctx: StepContext) -> Message:
    """Park until the child execution finishes (queue/subflows.py starts it and resumes this
    execution), then emit its result, or fail with why it did not succeed."""
    if not ctx.resumed:
        raise CallFlow(ctx.fields.flowId, ctx.fields.timeout)
    child = ctx.child
    if child is None:
        raise ComponentError(f"flow: the sub-flow's execution did not finish within {ctx.fields.timeout:g} s")
    if "id" not in child:  # it could not start: not retryable, the same answer would come
        raise NonRetryable(f"flow: {child.get('error')}")
    if child.get("status") != "succeeded":
        raise ComponentError(
            f"flow: sub-flow execution {child['id']} {child.get('status')}: {child.get('error')}"
        )
    result = child.get("result")
    data = None
    if isinstance(result, dict):
        reply = result.get("reply")
        data = result["data"] if "data" in result else reply.get("body") if isinstance(reply, dict) else None
    return {"data": data, "metadata": message["metadata"]}


FLOW = Component.single(
    "flow",
    "Run another flow of this tenant (fields.flowId) with the message data as trigger data and "
    "emit its result. The execution parks while the sub-flow runs (it holds nothing).",
    "call",
    call_flow,
    FlowFields,
)

# The reply of a synchronous webhook goes to an anonymous caller from the service's own origin,
# so a flow sets only headers that cannot act on that origin or on the caller's browser (the one
# policy, docs/security.md "Webhook replies"): these names, a JSON Content-Type, a Location that
# is a path on this origin, and custom X- headers but the ones proxies act on. Everything else
# (Set-Cookie, Access-Control-*, WWW-Authenticate, Strict-Transport-Security, CSP, Refresh,
# Content-Disposition, Content-Encoding, Link...) is refused when the flow is saved and dropped
# from a reply.
REPLY_HEADERS_ALLOWED = frozenset(
    {"cache-control", "content-language", "etag", "expires", "last-modified", "retry-after", "vary"}
)
_REPLY_X_REFUSED = ("x-accel-", "x-sendfile", "x-lighttpd-", "x-forwarded-", "x-real-ip", "x-flowyard-")
_JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json\s*(?:;\s*charset=utf-8\s*)?", re.IGNORECASE)


def reply_header_refusal(name: str, value: str) -> str | None:
    """Why a flow may not set this header on a webhook reply, or None when it may."""
    low = name.lower()
    if low in REPLY_HEADERS_ALLOWED:
        return None
    if low == "content-type":
        return None if _JSON_TYPE.fullmatch(value.strip()) else "the reply is JSON: only a JSON Content-Type"
    if low == "location":
        v = value.strip()
        if v.startswith("/") and not v.startswith("//") and "\\" not in v:
            return None
        return "a Location must be a path on this service (starting with one '/')"
    if low.startswith("x-") and not low.startswith(_REPLY_X_REFUSED):
        return None
    return "not one of the headers a webhook reply may carry (docs/security.md)"


class RespondFields(_Fields):
    status: int = Field(200, ge=200, le=599, description="HTTP status of the synchronous webhook reply.")
    body: str | None = Field(None, description="JSONata for the reply body; default: the message data.")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Reply headers: Cache-Control, Content-Language, ETag, Expires, Last-Modified, "
        "Retry-After, Vary, a JSON Content-Type, a Location that is a path on this service, custom "
        "X- headers (docs/security.md).",
    )

    @field_validator("body")
    @classmethod
    def _body(cls, value: str | None) -> str | None:
        if value is not None:
            compile_expression(value)
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        refused = {k: why for k, v in value.items() if (why := reply_header_refusal(k, v))}
        if refused and (info.context or {}).get("saving"):
            raise ValueError("; ".join(f"{k}: {why}" for k, why in refused.items()))
        # A flow saved before the policy still runs, without the headers it refuses.
        return {k: v for k, v in value.items() if k not in refused}


async def respond(message: Message, ctx: StepContext) -> Message:
    body = message["data"]
    if ctx.fields.body is not None:
        body = compile_expression(ctx.fields.body).evaluate(message["data"])
    ctx.respond(ctx.fields.status, body, ctx.fields.headers)
    return message


RESPOND = Component.single(
    "respond",
    "Set the reply of a synchronous webhook call (?wait=) and pass the message on.",
    "respond",
    respond,
    RespondFields,
    awaits=False,
)


class HttpFields(_Fields):
    url: str = Field(max_length=4000, description="Target URL; may hold {{ JSONata }} placeholders.")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = Field(
        None,
        description="Request JSON: a mapper object (JSONata leaves); default: the data for POST/PUT/PATCH.",
    )
    timeout: float = Field(30.0, gt=0, le=300)
    failOnError: bool = Field(True, description="Fail the step on a 4xx/5xx answer.")
    idempotencyHeader: bool = Field(
        False,
        description="Send the step's idempotency key (stable across retries and redeliveries) as "
        "the Idempotency-Key request header.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if "{{" not in value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("body")
    @classmethod
    def _body(cls, value: Any) -> Any:
        if isinstance(value, dict | str):
            try:
                compile_mapper(value)
            except ExpressionError as exc:
                raise ValueError(str(exc)) from None
        return value


# Answers another attempt may mend (SPEC §11): server errors, request timeout, too early, too many
# requests. Any other 4xx is the request's own fault: no retry.
_RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


def _size(n: int) -> str:
    return f"{n / 1048576:g} MiB" if n % 1048576 == 0 else f"{n} bytes"


async def _read_capped(resp: httpx.Response, cap: int) -> bytes | None:
    """The (decoded) body, or None as soon as it grows past ``cap`` bytes."""
    declared = resp.headers.get("content-length")
    if (
        declared is not None
        and declared.isdigit()
        and int(declared) > cap
        and "content-encoding" not in resp.headers
    ):
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _render_url(template: str, data: Any) -> str:
    out, rest = "", template
    while "{{" in rest:
        before, _, tail = rest.partition("{{")
        expr, sep, rest = tail.partition("}}")
        if not sep:
            raise NonRetryable(f"unclosed '{{{{' in url {redact_url(template)!r}")
        value = compile_expression(expr.strip()).evaluate(data)
        out += before + ("" if value is None else str(value))
    return out + rest


async def http_request(message: Message, ctx: StepContext) -> Message:
    f: HttpFields = ctx.fields
    data = message["data"]
    url = _render_url(f.url, data)
    shown = redact_url(url)  # every error text below names the URL without its password
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NonRetryable(f"url {shown!r} is not an http(s) URL")
    headers = dict(f.headers)
    auth: httpx.Auth | None = None
    creds = ctx.credentials or {}
    if "token" in creds:
        headers.setdefault("Authorization", f"Bearer {creds['token']}")
    elif "username" in creds:
        auth = httpx.BasicAuth(str(creds["username"]), str(creds.get("password", "")))
    for name, value in (creds.get("headers") or {}).items():
        headers[str(name)] = str(value)
    if f.idempotencyHeader and ctx.idempotency_key:
        headers["Idempotency-Key"] = ctx.idempotency_key
    body: Any = None
    if f.body is not None:
        body = apply_mapper(compile_mapper(f.body), data) if isinstance(f.body, dict | str) else f.body
    elif f.method in ("POST", "PUT", "PATCH"):
        body = data
    cap = ctx.settings.http_max_response_bytes
    request = ctx.http.build_request(
        f.method,
        url,
        headers=headers,
        json=body if f.method not in ("GET", "HEAD", "DELETE") or body is not None else None,
        timeout=f.timeout,
    )
    try:
        resp = await ctx.http.send(request, auth=auth or httpx.USE_CLIENT_DEFAULT, stream=True)
        try:
            raw = await _read_capped(resp, cap)
        finally:
            await resp.aclose()
    except httpx.HTTPError as exc:
        refused = refusal_of(exc)
        if refused is not None:  # the network policy: no retry makes it allowed
            raise NonRetryable(f"{f.method} {shown}: {scrub_userinfo(str(refused), url)}") from None
        detail = scrub_userinfo(str(exc), url)
        # Timeouts and connection errors: the far side may come back.
        retryable = isinstance(exc, httpx.TransportError)
        raise ComponentError(
            f"{f.method} {shown} failed: {type(exc).__name__}: {detail}", retryable=retryable
        ) from None
    if raw is None:
        raise NonRetryable(
            f"{f.method} {shown}: the response body exceeds the {_size(cap)} limit "
            "(FLOWYARD_HTTP_MAX_RESPONSE_BYTES)"
        )
    content: Any
    try:
        content = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        content = raw.decode(resp.encoding or "utf-8", errors="replace")
    if f.failOnError and resp.status_code >= 400:
        code = resp.status_code
        retry_after = parse_retry_after(resp.headers.get("retry-after")) if code in (429, 503) else None
        raise ComponentError(
            f"{f.method} {shown} answered {code}",
            retryable=code in _RETRYABLE_STATUS,
            retry_after=retry_after,
        )
    return {
        "data": {"status": resp.status_code, "headers": dict(resp.headers), "body": content},
        "metadata": message["metadata"],
    }


HTTP = Component.single(
    "http",
    "Make an HTTP request; emits {status, headers, body}. Credentials: {token} (Bearer), "
    "{username, password} (Basic) or {headers}.",
    "request",
    http_request,
    HttpFields,
)

ALL: tuple[Component, ...] = (
    WEBHOOK,
    SCHEDULE,
    JSONATA,
    FILTER,
    SPLIT,
    HTTP,
    LOG,
    DELAY,
    RESPOND,
    JOIN,
    FLOW,
)
