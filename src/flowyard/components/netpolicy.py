"""The outbound network policy of flow code, and the one HTTP client factory that enforces it.

After Stripe's smokescreen: resolve the name once, classify every resolved address,
refuse by default whatever is not a public unicast address, and connect to the
exact address that was vetted, never resolving the name a second time (DNS
rebinding). The check lives in an httpcore network backend, under the
connection pool: every connection the client opens goes through it, whatever
the URL spelling, and each hop of a followed redirect opens its own connection
through it too. TLS still verifies the certificate and sends SNI for the host
*name* (httpcore starts TLS on the stream with the URL's host), so connecting
to an IP address changes nothing for HTTPS.

``classify`` is the function that decides; tests prove refusals there and never
let the service try to connect to anything but loopback.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
import httpcore
import httpx

if TYPE_CHECKING:
    from flowyard.config import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""Resolves (host, port) to address strings, in the order to try them."""

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Documented cloud metadata and platform endpoints (checked before the ranges they sit in,
# so the refusal names them).
_METADATA: dict[IPAddress, str] = {
    ipaddress.ip_address("169.254.169.254"): "cloud metadata (AWS, GCP, Azure, OCI, DigitalOcean...)",
    ipaddress.ip_address("169.254.170.2"): "cloud metadata (AWS ECS task endpoint)",
    ipaddress.ip_address("169.254.169.123"): "cloud platform endpoint (AWS time sync)",
    ipaddress.ip_address("169.254.0.23"): "cloud metadata (Tencent Cloud)",
    ipaddress.ip_address("100.100.100.200"): "cloud metadata (Alibaba Cloud)",
    ipaddress.ip_address("192.0.0.192"): "cloud metadata (Oracle Cloud)",
    ipaddress.ip_address("168.63.129.16"): "cloud platform endpoint (Azure WireServer)",
    ipaddress.ip_address("fd00:ec2::254"): "cloud metadata (AWS IPv6)",
    ipaddress.ip_address("fd00:ec2::123"): "cloud platform endpoint (AWS IPv6 time sync)",
    ipaddress.ip_address("0.0.0.0"): "unspecified address (a connection to it reaches this host)",
    ipaddress.ip_address("::"): "unspecified address (a connection to it reaches this host)",
}

# Denied ranges, most specific first where they nest.
_DENIED: tuple[tuple[IPNetwork, str], ...] = (
    (_V4("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (_V4("10.0.0.0/8"), "private network (10.0.0.0/8)"),
    (_V4("100.64.0.0/10"), "carrier-grade NAT (100.64.0.0/10)"),
    (_V4("127.0.0.0/8"), "loopback (127.0.0.0/8)"),
    (_V4("169.254.0.0/16"), "link-local (169.254.0.0/16)"),
    (_V4("172.16.0.0/12"), "private network (172.16.0.0/12)"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments (192.0.0.0/24)"),
    (_V4("192.0.2.0/24"), "documentation (192.0.2.0/24)"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast (192.88.99.0/24)"),
    (_V4("192.168.0.0/16"), "private network (192.168.0.0/16)"),
    (_V4("198.18.0.0/15"), "benchmarking (198.18.0.0/15)"),
    (_V4("198.51.100.0/24"), "documentation (198.51.100.0/24)"),
    (_V4("203.0.113.0/24"), "documentation (203.0.113.0/24)"),
    (_V4("224.0.0.0/4"), "multicast (224.0.0.0/4)"),
    (_V4("240.0.0.0/4"), "reserved (240.0.0.0/4)"),
    (_V6("::1/128"), "loopback (::1)"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"),
    (_V6("100::/64"), "discard-only (100::/64)"),
    (_V6("2001:2::/48"), "benchmarking (2001:2::/48)"),
    (_V6("2001:db8::/32"), "documentation (2001:db8::/32)"),
    (_V6("3fff::/20"), "documentation (3fff::/20)"),
    (_V6("fc00::/7"), "unique-local (fc00::/7)"),
    (_V6("fe80::/10"), "link-local (fe80::/10)"),
    (_V6("fec0::/10"), "site-local (fec0::/10)"),
    (_V6("ff00::/8"), "multicast (ff00::/8)"),
)

_IPV4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_SIXTOFOUR = _V6("2002::/16")
_TEREDO = _V6("2001::/32")


def parse_ip(value: str | IPAddress) -> IPAddress:
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    return ipaddress.ip_address(value.split("%", 1)[0])  # drop an IPv6 zone id ("fe80::1%eth0")


def embedded_ipv4(ip: IPAddress) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), with its form."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # not :: or ::1
        return low32, "IPv4-compatible"
    if ip in _NAT64:
        return low32, "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    return None


def classify(value: str | IPAddress) -> str | None:
    """Why flow code may not connect to this address, or None when it may (a public unicast address).

    Embedded IPv4 forms (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``,
    NAT64 ``64:ff9b::a.b.c.d``, 6to4 ``2002:AABB:CCDD::``, Teredo) are judged by the
    IPv4 address they carry. Anything else not globally routable per the IANA
    special-purpose registries is refused too.
    """
    ip = parse_ip(value)
    inner = embedded_ipv4(ip)
    if inner is not None:
        v4, form = inner
        reason = classify(v4)
        return f"{form} form of {v4}: {reason}" if reason else None
    if isinstance(ip, ipaddress.IPv6Address) and ip in _TEREDO:
        teredo = ip.teredo
        if teredo is not None:
            for part in teredo:
                reason = classify(part)
                if reason:
                    return f"Teredo form of {part}: {reason}"
        return "Teredo (2001::/32)"
    named = _METADATA.get(ip)
    if named:
        return named
    for network, reason in _DENIED:
        if ip.version == network.version and ip in network:
            return reason
    if not ip.is_global:
        return "not a globally routable address"
    return None


def effective_address(value: str | IPAddress) -> IPAddress:
    """The address a connection to ``value`` really reaches: an IPv4-mapped address is the
    IPv4 address; connecting to the unspecified address reaches this host (loopback)."""
    ip = parse_ip(value)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip == ipaddress.IPv4Address("0.0.0.0"):
        return ipaddress.IPv4Address("127.0.0.1")
    if ip == ipaddress.IPv6Address("::"):
        return ipaddress.IPv6Address("::1")
    return ip


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(v.strip(), strict=False) for v in values if v.strip())


class NetworkPolicy:
    """Deny by default (``classify``); ``allow`` opens networks an operator wants reachable."""

    def __init__(self, allow: Iterable[IPNetwork | str] = ()) -> None:
        self.allow = tuple(
            n if isinstance(n, _V4 | _V6) else ipaddress.ip_network(n, strict=False) for n in allow
        )

    def check(self, value: str | IPAddress) -> str | None:
        """None when a connection to this address is allowed, else the reason it is refused."""
        ip = parse_ip(value)
        target = effective_address(ip)
        for network in self.allow:
            for candidate in (ip, target):
                if candidate.version == network.version and candidate in network:
                    return None
        return classify(ip)


class DestinationRefused(httpcore.ConnectError):
    """The network policy refused every address of the destination."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in out:
            out.append(addr)
    return out


class VettingBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that resolves once, vets, and connects to the vetted address."""

    def __init__(
        self,
        policy: NetworkPolicy,
        *,
        resolver: Resolver | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self.policy = policy
        self.resolver = resolver or system_resolver
        # AnyIO works under any running event loop; nothing here is bound to one.
        self.backend = backend or httpcore.AnyIOBackend()

    async def vetted_addresses(self, host: str, port: int, deadline: float | None) -> list[str]:
        try:
            with anyio.fail_after(deadline):
                addresses = await self.resolver(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        allowed: list[str] = []
        refused: list[str] = []
        for address in addresses:
            try:
                reason = self.policy.check(address)
            except ValueError:
                reason = "not an IP address"
            if reason is None:
                allowed.append(str(effective_address(address)))
            else:
                refused.append(f"{address} ({reason})")
        if not allowed:
            detail = "; ".join(refused) if refused else "no address"
            raise DestinationRefused(
                f"refusing to connect to {host}: {detail}; the network policy allows public "
                "addresses and FLOWYARD_OUTBOUND_ALLOW_NETWORKS"
            )
        return allowed

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        last: Exception | None = None
        for address in await self.vetted_addresses(host, port, timeout):
            try:
                return await self.backend.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise DestinationRefused("flow code may not connect to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)


def build_client(settings: Settings, *, resolver: Resolver | None = None) -> httpx.AsyncClient:
    """The HTTP client of flow code (the http component and any component using ``ctx.http``).

    Every connection is vetted by the network policy (``FLOWYARD_HTTP_ALLOW_NETWORKS``
    opens networks); proxy environment variables are ignored; redirects are not
    followed unless a request asks (and then each hop is vetted). Safe to call in
    any process and under any event loop: the client holds no loop-bound state
    until it is used. ``resolver`` replaces DNS (tests).
    """
    backend = VettingBackend(NetworkPolicy(settings.http_allow_networks), resolver=resolver)
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    # httpx's transport takes no network backend; its pool is rebuilt with ours (same
    # arguments httpx uses, and the transport's own TLS context).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=transport._pool._ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        timeout=settings.step_timeout,
    )


def refusal_of(exc: BaseException) -> DestinationRefused | None:
    """The policy refusal behind an httpx error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DestinationRefused):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def redact_url(url: str) -> str:
    """``url`` fit for an error text or a log line: the password of its userinfo replaced by
    ``***`` (``https://user:***@host/``). Every text that echoes a URL flow code asked for
    goes through this (the step error is readable by the flow's readers)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    netloc = f"{user}:***@{hostport}" if colon else f"{user}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def scrub_userinfo(text: str, url: str) -> str:
    """``text`` (an exception's, which may quote the URL or its parts) with the password of
    ``url``'s userinfo, raw and percent-decoded, replaced by ``***``."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        text = text.replace(url, redact_url(url))
        for secret in {password, unquote(password)}:
            if secret:
                text = text.replace(secret, "***")
    return text
