"""deploy/ is checked by the tools that will read it: `systemd-analyze verify` for the units,
`nginx -t` for the reverse proxy, `promtool check rules` / `promtool test rules` for the alert
rules; and against flowyard itself: the commands the units run exist, the environment file names
only settings flowyard reads, the proxy's limits match the service's.

The tools come from Debian packages (.ci/run installs what is missing): outside CI a test skips
with the reason when its tool is absent; in CI it fails."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from flowyard.cli import main
from flowyard.config import Settings
from flowyard.webhooks.handler import MAX_WAIT
from tests.conftest import IN_CI
from tests.engine.test_processes import _free_port
from tests.engine.test_serve_processes import Serve, _flow
from tests.tlsfixtures import self_signed

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = {
    "flowyard.service": ["serve"],
    "flowyard-api.service": ["serve", "--no-engine", "--no-migrate"],
    "flowyard-worker@.service": ["worker"],
}
BINARY = "/opt/flowyard/bin/flowyard"
# The metric names agreed for issue 9 (docs/observability.md), prefix flowyard_.
METRICS = {
    "http_requests_total",
    "http_request_duration_seconds",
    "webhooks_total",
    "executions_started_total",
    "executions_finished_total",
    "execution_duration_seconds",
    "queue_executions",
    "queue_oldest_queued_age_seconds",
    "lease_expiries_total",
    "execution_reruns_total",
    "cron_ticks_total",
    "lifecycle_moves_total",
    "lifecycle_fallbacks_total",
    "runners_alive",
    "runner_kills_total",
    "db_commit_duration_seconds",
}


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )
    if found is None:
        reason = f"{name} is not installed (.ci/run installs it from Debian packages)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _checked(*argv: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    return proc.stdout + proc.stderr


def _service_section(unit: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    section = None
    for line in (DEPLOY / "systemd" / unit).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def _env_file() -> tuple[dict[str, str], set[str]]:
    """The environment example: its set values, and every name it mentions (set or commented)."""
    values: dict[str, str] = {}
    names: set[str] = set()
    for line in (DEPLOY / "flowyard.env.example").read_text().splitlines():
        m = re.match(r"^(#?)(FLOWYARD_[A-Z0-9_]+)=(.*)$", line)
        if m:
            names.add(m.group(2))
            if not m.group(1):
                values[m.group(2)] = m.group(3)
    return values, names


def test_environment_file_names_only_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    values, names = _env_file()
    known = {f"FLOWYARD_{n.upper()}" for n in Settings.model_fields}
    assert names and names <= known, names - known
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings = Settings()  # every value parses
    assert str(settings.data_dir) == "/var/lib/flowyard"
    assert settings.max_body_bytes == Settings.model_fields["max_body_bytes"].default


def test_units_run_real_commands_and_stop_gracefully() -> None:
    values, _names = _env_file()
    grace = float(values["FLOWYARD_STOP_GRACE_SECONDS"])
    for unit, args in UNITS.items():
        service = _service_section(unit)
        argv = shlex.split(service["ExecStart"][0])
        assert argv[0] == BINARY and argv[1:] == args, (unit, argv)
        # The options exist (click refuses unknown ones before --help answers).
        result = CliRunner().invoke(main, [*argv[1:], "--help"])
        assert result.exit_code == 0, (unit, result.output)
        assert service["User"] == ["flowyard"] and service["Group"] == ["flowyard"]
        assert service["EnvironmentFile"] == ["/etc/flowyard/flowyard.env"]
        assert service["KillSignal"] == ["SIGTERM"]
        # Only the main process gets SIGTERM: serve forwards it; a second one means "exit now".
        assert service["KillMode"] == ["mixed"]
        # Beyond the grace and the 10 s the supervisor waits for its children after it.
        assert float(service["TimeoutStopSec"][0]) > grace + 10
        for key, value in {
            "NoNewPrivileges": "yes",
            "ProtectSystem": "strict",
            "ProtectHome": "yes",
            "PrivateTmp": "yes",
            "ReadWritePaths": values["FLOWYARD_DATA_DIR"],
            "UMask": "0077",
        }.items():
            assert service[key] == [value], (unit, key)


def test_systemd_units_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    # An image of the target machine: systemd's own units, the venv's flowyard, the env file.
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(DEPLOY / "systemd" / unit, units / unit)
    binary = root / BINARY.lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (root / "etc/flowyard").mkdir()
    shutil.copy(DEPLOY / "flowyard.env.example", root / "etc/flowyard/flowyard.env")
    names = [u.replace("@.", "@1.") for u in UNITS]
    out = _checked(analyze, "verify", f"--root={root}", *names, cwd=units)
    # verify exits 0 on unknown keys and bad values, but says so: any output is a finding.
    assert out.strip() == "", out

    # And it does find them (the check is not blind).
    text = (units / "flowyard-api.service").read_text()
    (units / "flowyard-api.service").write_text(text.replace("NoNewPrivileges=", "NoNewPrivilege="))
    proc = subprocess.run(
        [analyze, "verify", f"--root={root}", "flowyard-api.service"],
        capture_output=True,
        text=True,
        cwd=units,
        check=False,
    )
    assert "Unknown key" in proc.stderr


def _nginx_conf(tmp: Path, ports: dict[str, int] | None = None) -> Path:
    """The example, with this test's certificate and log paths (and loopback ports when given),
    inside a minimal nginx.conf of its own."""
    host = "flowyard.example.com"
    self_signed(tmp, host, ip="127.0.0.1", cert_name="fullchain.pem", key_name="privkey.pem")
    site = (DEPLOY / "nginx" / "flowyard.conf").read_text()
    site = site.replace("/etc/ssl/flowyard/", f"{tmp}/").replace("/var/log/nginx/", f"{tmp}/")
    if ports is not None:
        site = site.replace("listen [::]:80;", "").replace("listen [::]:443 ssl http2;", "")
        site = site.replace("listen 80;", f"listen 127.0.0.1:{ports['http']};")
        site = site.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{ports['https']} ssl http2;")
        site = site.replace("server 127.0.0.1:8000;", f"server 127.0.0.1:{ports['api']};")
    (tmp / "flowyard.conf").write_text(site)
    conf = tmp / "nginx.conf"
    conf.write_text(
        ("user root;\n" if os.getuid() == 0 else "")  # workers may then use this test's 0700 dirs
        + f"pid {tmp}/nginx.pid;\n"
        f"error_log {tmp}/error.log;\n"
        "events {}\n"
        "http {\n"
        f"  client_body_temp_path {tmp}/body;\n"
        f"  proxy_temp_path {tmp}/proxy;\n"
        f"  include {tmp}/flowyard.conf;\n"
        "}\n"
    )
    return conf


def test_nginx_config(tmp_path: Path) -> None:
    text = (DEPLOY / "nginx" / "flowyard.conf").read_text()
    # In line with the service: the body limit, the longest ?wait=, the request id.
    limit = Settings.model_fields["max_body_bytes"].default
    assert re.search(r"^\s*client_max_body_size 1m;", text, re.M) and limit == 1024 * 1024
    assert f"Request body exceeds {limit} bytes." in text  # the service's own 413 message
    read_timeout = re.search(r"proxy_read_timeout (\d+)s;", text)
    assert read_timeout and int(read_timeout.group(1)) > MAX_WAIT
    assert "proxy_set_header X-Request-ID $flowyard_request_id;" in text
    assert "non_idempotent" not in re.sub(r"#.*", "", text)  # a webhook is never sent twice

    nginx = _tool("nginx")
    conf = _nginx_conf(tmp_path)
    out = _checked(nginx, "-t", "-e", "stderr", "-p", str(tmp_path), "-c", str(conf))
    assert "test is successful" in out, out


@pytest.mark.slow
def test_nginx_in_front_of_serve(tmp_path: Path) -> None:
    """The example proxy, running, in front of a real `flowyard serve`: TLS, the request id
    reaches flowyard, a too large body gets the service's error shape, `?wait=` is answered."""
    nginx = _tool("nginx")
    data = tmp_path / "data"
    data.mkdir()
    s = Serve(None, data)
    proxy: subprocess.Popen[bytes] | None = None
    try:
        s.wait_ready()
        fid = _flow(s)
        ports = {"http": _free_port(), "https": _free_port(), "api": s.port}
        conf = _nginx_conf(tmp_path, ports)
        proxy = subprocess.Popen(
            [nginx, "-e", "stderr", "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
        )
        tls = ssl.create_default_context(cafile=str(tmp_path / "fullchain.pem"))
        base = f"https://127.0.0.1:{ports['https']}"
        with httpx.Client(base_url=base, verify=tls, timeout=30) as c:
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = c.get("/health/ready")
                    break
                except httpx.ConnectError:
                    assert proxy.poll() is None and time.monotonic() < deadline, "nginx did not start"
                    time.sleep(0.1)
            assert r.status_code == 200
            # The caller's request id reaches flowyard, which answers with it.
            r = c.get("/health", headers={"X-Request-ID": "trace-4711"})
            assert r.headers["x-request-id"] == "trace-4711"
            # Without one, nginx makes one (32 hex digits; flowyard's own have 16) and forwards it.
            assert re.fullmatch(r"[0-9a-f]{32}", c.get("/health").headers["x-request-id"])
            # ?wait= through the proxy: the flow's answer, whole.
            r = c.post(f"/webhooks/{fid}?wait=20", json={"through": "nginx"})
            assert r.status_code == 200 and r.json() == {"through": "nginx"}, r.text
            # Above the body limit: refused (by nginx, before any API process) in the service's shape.
            json_type = {"Content-Type": "application/json"}
            r = c.post(f"/webhooks/{fid}", content=b"x" * (1024 * 1024 + 1), headers=json_type)
            assert r.status_code == 413 and r.headers["content-type"] == "application/json"
            assert r.json() == {"errors": [{"message": "Request body exceeds 1048576 bytes.", "code": 413}]}
            # Just below it: passed on.
            big = b'{"size": "' + b"y" * (1024 * 1024 - 100) + b'"}'
            r = c.post(f"/webhooks/{fid}", content=big, headers=json_type)
            assert r.status_code == 202, r.text
        plain = httpx.get(f"http://127.0.0.1:{ports['http']}/health", follow_redirects=False)
        assert plain.status_code == 301 and plain.headers["location"].startswith("https://")
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            try:
                proxy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
        code = s.stop()
    assert code == 0, s.log()


def test_prometheus_rules(tmp_path: Path) -> None:
    text = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    used = set(re.findall(r"\bflowyard_([a-z_]+?)(?:_bucket|_count|_sum)?\b", text))
    assert used and used <= METRICS, used - METRICS
    promtool = _tool("promtool")
    out = _checked(promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    assert "SUCCESS" in out, out
    out = _checked(promtool, "test", "rules", "alerts.test.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS" in out, out
