"""The email component against a real SMTP server the test starts (aiosmtpd) with STARTTLS or
TLS on a self-signed certificate made here."""

from __future__ import annotations

import email
import ssl
from collections.abc import Iterator
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from flowyard.config import Settings
from tests.connectors.conftest import REGISTRY, outputs, step, step_error
from tests.engine.test_processes import _free_port
from tests.tlsfixtures import self_signed

USER, PASSWORD = "mailer", "s3cret-pw"


class _Inbox:
    def __init__(self) -> None:
        self.mails: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=default_policy)
        assert isinstance(parsed, EmailMessage)
        self.mails.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 OK"


def _authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (USER.encode(), PASSWORD.encode())
    return AuthResult(success=ok, handled=False)  # not handled: aiosmtpd answers 535 itself


class Smtp:
    def __init__(self, port: int, inbox: _Inbox, ca: str) -> None:
        self.port, self.inbox, self.ca = port, inbox, ca


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path, str]:
    return self_signed(tmp_path, "localhost")


def _start(inbox: _Inbox, cert: tuple[Path, Path, str], *, mode: str) -> Controller:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert[0], cert[1])
    kwargs: dict[str, Any] = {"authenticator": _authenticate, "auth_require_tls": True}
    if mode == "starttls":
        kwargs.update(tls_context=context, require_starttls=True)
    elif mode == "tls":
        # aiosmtpd advertises AUTH only after its own STARTTLS; this transport is TLS from the start.
        kwargs.update(ssl_context=context, auth_require_tls=False)
    else:  # plain: no TLS offered at all
        kwargs.update(auth_require_tls=False)
    controller = Controller(
        inbox, hostname="127.0.0.1", port=_free_port(), server_hostname="localhost", **kwargs
    )
    controller.start()
    return controller


@pytest.fixture(params=["starttls", "tls"])
def smtp(request: pytest.FixtureRequest, cert: tuple[Path, Path, str]) -> Iterator[Smtp]:
    inbox = _Inbox()
    controller = _start(inbox, cert, mode=request.param)
    try:
        yield Smtp(controller.port, inbox, cert[2])
    finally:
        controller.stop()


def _scheme(request: pytest.FixtureRequest) -> str:
    return "smtps" if request.node.callspec.params["smtp"] == "tls" else "smtp"


FIELDS = {
    "sender": "flows@example.com",
    "to": "customer.email",
    "cc": "['audit@example.com']",
    "subject": "'Order ' & id & ' confirmed'",
    "text": "'Hello ' & customer.name & ', total ' & $string(total)",
    "html": "'<p>Hello <b>' & customer.name & '</b></p>'",
}
ORDER = {"id": "A-7", "total": 12.5, "customer": {"name": "Ada", "email": "ada@example.org"}}


async def test_sends_text_and_html_over_tls_with_login(
    http: httpx.AsyncClient, settings: Settings, smtp: Smtp, request: pytest.FixtureRequest
) -> None:
    creds = {"url": f"{_scheme(request)}://{USER}@localhost:{smtp.port}", "password": PASSWORD, "ca": smtp.ca}
    out = await step(http, settings, "email", "send", FIELDS, creds, ORDER)
    assert outputs(out) == [ORDER]
    [(sender, recipients, mail)] = smtp.inbox.mails
    assert sender == "flows@example.com" and recipients == ["ada@example.org", "audit@example.com"]
    assert mail["Subject"] == "Order A-7 confirmed" and mail["To"] == "ada@example.org"
    plain, html = mail.get_body(("plain",)), mail.get_body(("html",))
    assert plain is not None and plain.get_content().strip() == "Hello Ada, total 12.5"
    assert html is not None and html.get_content().strip() == "<p>Hello <b>Ada</b></p>"


async def test_wrong_password_untrusted_certificate_and_header_injection(
    http: httpx.AsyncClient, settings: Settings, smtp: Smtp, request: pytest.FixtureRequest
) -> None:
    base = f"{_scheme(request)}://{USER}@localhost:{smtp.port}"
    error = step_error(
        await step(
            http, settings, "email", "send", FIELDS, {"url": base, "password": "nope", "ca": smtp.ca}, ORDER
        )
    )
    assert error.startswith("email: authentication failed") and "nope" not in error, error
    error = step_error(
        await step(http, settings, "email", "send", FIELDS, {"url": base, "password": PASSWORD}, ORDER)
    )
    assert "CERTIFICATE_VERIFY_FAILED" in error, error
    # A subject from message data with a line break cannot add headers (e.g. a hidden Bcc).
    evil = {**ORDER, "id": "1\r\nBcc: thief@example.net"}
    error = step_error(
        await step(
            http, settings, "email", "send", FIELDS, {"url": base, "password": PASSWORD, "ca": smtp.ca}, evil
        )
    )
    assert error.startswith("email: "), error
    evil_to = {**ORDER, "customer": {"name": "x", "email": "a@example.org\r\nRCPT TO:<thief@example.net>"}}
    error = step_error(
        await step(
            http,
            settings,
            "email",
            "send",
            FIELDS,
            {"url": base, "password": PASSWORD, "ca": smtp.ca},
            evil_to,
        )
    )
    assert "must be addresses" in error
    assert smtp.inbox.mails == []


async def test_a_server_without_starttls_is_refused_unless_the_credential_allows_it(
    http: httpx.AsyncClient, settings: Settings, cert: tuple[Path, Path, str]
) -> None:
    inbox = _Inbox()
    controller = _start(inbox, cert, mode="plain")
    try:
        url = f"smtp://localhost:{controller.port}"
        error = step_error(await step(http, settings, "email", "send", FIELDS, {"url": url}, ORDER))
        assert "does not offer STARTTLS" in error and inbox.mails == []
        out = await step(http, settings, "email", "send", FIELDS, {"url": url, "starttls": False}, ORDER)
        assert out.status == "succeeded", out.error
        assert len(inbox.mails) == 1
    finally:
        controller.stop()


async def test_errors_closed_port_timeout_policy(
    http: httpx.AsyncClient, settings: Settings, closed_settings: Settings, silent_port: int
) -> None:
    closed = {"url": f"smtp://127.0.0.1:{_free_port()}"}
    error = step_error(await step(http, settings, "email", "send", {**FIELDS, "timeout": 3}, closed, ORDER))
    assert error.startswith("email: ") and "refused" in error.lower(), error
    silent = {"url": f"smtp://127.0.0.1:{silent_port}"}
    error = step_error(await step(http, settings, "email", "send", {**FIELDS, "timeout": 0.5}, silent, ORDER))
    assert error == "email: timed out after 0.5 s", error
    error = step_error(
        await step(http, closed_settings, "email", "send", FIELDS, {"url": "smtp://localhost:25"}, ORDER)
    )
    assert "refusing to connect to localhost" in error


def test_fields_need_a_body_and_valid_expressions() -> None:
    component = REGISTRY.get("email")
    assert component is not None
    assert component.validate_fields({"to": "a", "subject": "'s'"})
    assert component.validate_fields({"to": "$$(", "subject": "'s'", "text": "'t'"})[0][0] == ".to"
    assert component.validate_fields({"to": "a", "subject": "'s'", "text": "'t'"}) == []
