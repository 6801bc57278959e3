"""The ``email`` component: send a message through SMTP (aiosmtplib).

``smtps://`` speaks TLS from the first byte; ``smtp://`` upgrades with STARTTLS and
refuses a server that does not offer it (unless the credential says
``"starttls": false``, for a relay on a trusted network). The socket goes to the
address the network policy vetted; TLS verifies the certificate against the
credential's host name. One connection per step (SMTP sessions are short).

aiosmtplib is imported by ``send`` on first use: a process that only lists or validates
components (the API) or runs flows without email steps never loads it
(``tests/unit/test_lazy_imports.py``).
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
from email.message import EmailMessage
from typing import Any

from pydantic import Field, field_validator, model_validator

from flowyard.components.builtins import ComponentError, _Fields
from flowyard.components.connectors.common import check_expression, credential_url, tls_context, vet_host
from flowyard.components.context import StepContext
from flowyard.components.expressions import compile_expression
from flowyard.components.registry import Component, Message

_SCHEMES = {"smtp": 587, "smtps": 465}
_MAX_RECIPIENTS = 100
_MAX_BODY = 1024 * 1024


class EmailFields(_Fields):
    sender: str | None = Field(
        None,
        max_length=320,
        description="From address (a constant); default: the credential's 'from', else its username.",
    )
    to: str = Field(
        description="JSONata yielding an address or an array of them, e.g. \"'ops@example.com'\"."
    )
    cc: str | None = Field(None, description="JSONata yielding Cc addresses.")
    subject: str = Field(description="JSONata for the subject, e.g. \"'Order ' & id\".")
    text: str | None = Field(None, description="JSONata for the plain-text body.")
    html: str | None = Field(
        None, description="JSONata for the HTML body (sent with the text as alternative)."
    )
    timeout: float = Field(30.0, gt=0, le=300, description="Connect and send timeout, seconds.")

    _exprs = field_validator("to", "cc", "subject", "text", "html")(check_expression)

    @model_validator(mode="after")
    def _body(self) -> EmailFields:
        if self.text is None and self.html is None:
            raise ValueError("give text, html or both")
        return self


def _addresses(expression: str | None, data: Any, what: str) -> list[str]:
    if expression is None:
        return []
    value = compile_expression(expression).evaluate(data)
    items = value if isinstance(value, list) else [value] if value is not None else []
    out: list[str] = []
    for item in items:
        if not isinstance(item, str) or "\r" in item or "\n" in item:
            raise ComponentError(f"email: {what} must be addresses (strings), got {item!r}")
        for _name, address in email.utils.getaddresses([item]):
            if "@" not in address:
                raise ComponentError(f"email: {what} address {item!r} is not an e-mail address")
            out.append(address)
    if len(out) > _MAX_RECIPIENTS:
        raise ComponentError(f"email: more than {_MAX_RECIPIENTS} recipients")
    return out


def _text(expression: str | None, data: Any, what: str) -> str | None:
    if expression is None:
        return None
    value = compile_expression(expression).evaluate(data)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ComponentError(f"email: the {what} expression must yield a string")
    if len(value.encode()) > _MAX_BODY:
        raise ComponentError(f"email: the {what} exceeds {_MAX_BODY} bytes")
    return value


async def _socket_to(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def send(message: Message, ctx: StepContext) -> Message:
    import aiosmtplib

    f: EmailFields = ctx.fields
    data = message["data"]
    creds = ctx.credentials or {}
    ep = credential_url(creds, "email", _SCHEMES)
    sender = f.sender or creds.get("from") or ep.username
    if not sender or "@" not in str(sender):
        raise ComponentError("email: no sender address (fields.sender or the credential's 'from')")
    to = _addresses(f.to, data, "to")
    cc = _addresses(f.cc, data, "cc")
    if not to:
        raise ComponentError("email: the to expression yielded no address")
    subject = _text(f.subject, data, "subject") or ""
    plain, html = _text(f.text, data, "text"), _text(f.html, data, "html")
    mail = EmailMessage()
    try:
        mail["From"] = str(sender)
        mail["To"] = ", ".join(to)
        if cc:
            mail["Cc"] = ", ".join(cc)
        mail["Subject"] = subject
    except ValueError as exc:  # a header with a line break: refused, never folded into new headers
        raise ComponentError(f"email: {exc}") from None
    mail["Date"] = email.utils.formatdate(localtime=False)
    domain = str(sender).rsplit("@", 1)[-1].strip("> ")
    mail["Message-ID"] = email.utils.make_msgid(idstring=ctx.execution_id, domain=domain or None)
    mail.set_content(plain if plain is not None else "")
    if html is not None:
        mail.add_alternative(html, subtype="html")
    implicit = ep.scheme == "smtps"
    starttls = not implicit and creds.get("starttls", True) is not False
    tls = tls_context(creds) if implicit or starttls else None
    try:
        async with asyncio.timeout(f.timeout):
            address = await vet_host(ctx.settings, ep.host, ep.port, within=f.timeout)
            # The library takes the socket over (its transport closes it); ours closes it only
            # when connecting it failed.
            smtp = aiosmtplib.SMTP(
                hostname=ep.host,
                sock=await _socket_to(address, ep.port),
                use_tls=implicit,
                start_tls=False,
                tls_context=tls,
                local_hostname="flowyard",
                timeout=f.timeout,
            )
            try:
                await smtp.connect()
                if starttls:
                    await smtp.ehlo()
                    if not smtp.supports_extension("starttls"):
                        raise ComponentError(
                            'email: the server does not offer STARTTLS (set "starttls": false in the '
                            "credential only for a relay on a trusted network)"
                        )
                    await smtp.starttls(server_hostname=ep.host, tls_context=tls)
                if ep.username:
                    await smtp.login(ep.username, ep.password or "")
                refused, _reply = await smtp.send_message(mail, sender=str(sender), recipients=to + cc)
            finally:
                smtp.close()
    except TimeoutError:
        raise ComponentError(f"email: timed out after {f.timeout:g} s") from None
    except aiosmtplib.SMTPAuthenticationError as exc:
        raise ComponentError(f"email: authentication failed: {exc.code} {exc.message}") from None
    except aiosmtplib.SMTPResponseException as exc:
        raise ComponentError(f"email: the server answered {exc.code} {exc.message}") from None
    except (aiosmtplib.SMTPException, OSError) as exc:
        raise ComponentError(f"email: {type(exc).__name__}: {exc}") from None
    meta = {
        **message["metadata"],
        "email": {"messageId": mail["Message-ID"], "recipients": to + cc, "refused": sorted(refused)},
    }
    return {"data": data, "metadata": meta}


COMPONENT = Component(
    id="email",
    description="Send an e-mail through SMTP (STARTTLS or TLS). Credentials: {url} "
    "(smtp://user:pw@host:587 for STARTTLS, smtps://...:465 for TLS), optional {password}, {from}, "
    "{ca} (PEM), {starttls: false}.",
    functions={"send": send},
    default_function="send",
    fields=EmailFields,
    function_descriptions={"send": "Send one e-mail per message; passes the message on with metadata.email."},
)
