"""The console end to end, in a real Chromium against a real `flowyard serve`.

The server runs as `make run` would (the `server` fixture of tests/test_readme.py: embedded
SQLite and a generated administrator password in a temporary directory). One browser session
drives the issue's scenario: sign in; create a flow from a template; see its graph; start it
and watch it reach `active` without reloading; POST webhooks and see the executions appear;
open the failing execution and see the failing step's error and its log entry; stop the flow;
the editor shows the server's validation error beside its field; the counts show the
executions; an API token is created and shown once; sign out.

Each page is screenshotted at 1280x800 and 390x844 (folder printed; ``FLOWYARD_CONSOLE_SCREENS``
chooses it) and checked with axe-core (no violation of any impact) and for fit (nothing wider
than the screen, no squeezed table cell). Any browser console
message of level SEVERE and any failed request (network error or HTTP status >= 400) fails the
test, except the single 400 the editor step provokes on purpose.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_readme import server  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow]

AXE = Path(__file__).with_name("assets") / "axe-core-4.10.2" / "axe.min.js"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
WAIT = 20.0
ADMIN = "admin@flowyard.local"

TEMPLATE = {
    "name": "Order totals",
    "description": "Logs each order, then reads its total (fails when the order has none).",
    "status": "published",
    "tags": ["demo", "orders"],
    "type": "ordinary",
    "graph": {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {"id": "note", "componentId": "log", "fields": {"message": "order received"}},
            {"id": "total", "componentId": "jsonata", "fields": {"expression": "total"}},
        ],
        "edges": [
            {"source": "in", "target": "note", "config": {"condition": "$exists(id)"}},
            {"source": "note", "target": "total", "config": {"mapper": {"total": "total", "id": "id"}}},
        ],
    },
}


class Browser:
    """One Chromium session with the checks every page gets."""

    def __init__(self, chromium: str, chromedriver: str, base: str, screens: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(arg)
        options.add_argument("--window-size=1280,800")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.driver = webdriver.Chrome(service=Service(chromedriver), options=options)
        self.driver.set_script_timeout(30)
        self.base = base
        self.screens = screens
        self.console_errors: list[str] = []
        self.failed_requests: list[str] = []
        self.expected_failures: list[tuple[str, int]] = []  # (url pattern, status) allowed once
        self.axe_source = AXE.read_text()
        self.size("desktop")

    def size(self, name: str) -> None:
        width, height = SIZES[name]
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": name == "phone"},
        )

    def go(self, fragment: str) -> None:
        self.driver.get(f"{self.base}/console/#{fragment}")

    def wait(self, what: str, predicate: Callable[[Any], Any]) -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT, poll_frequency=0.1).until(predicate, message=what)

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.wait(f"element {css}", lambda d: d.find_element(By.CSS_SELECTOR, css))

    def find_all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def wait_text(self, css: str, pattern: str) -> str:
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
        from selenium.webdriver.common.by import By

        def check(d: Any) -> str | None:
            try:
                for el in d.find_elements(By.CSS_SELECTOR, css):
                    if re.search(pattern, el.text):
                        return str(el.text)
            except (NoSuchElementException, StaleElementReferenceException):
                return None
            return None

        return str(self.wait(f"{css} matching {pattern!r}", check))

    def click_text(self, tag: str, label: str) -> None:
        from selenium.webdriver.common.by import By

        xpath = f"//{tag}[normalize-space(.)={json.dumps(label)}]"
        el = self.wait(f"{tag} {label!r}", lambda d: d.find_element(By.XPATH, xpath))
        self.wait(f"{tag} {label!r} enabled", lambda d: el.is_enabled() or None)
        el.click()

    def click(self, css: str) -> None:
        """Click the element, looked up again if a live refresh replaced it meanwhile."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        def attempt(d: Any) -> bool:
            try:
                d.find_element(By.CSS_SELECTOR, css).click()
            except StaleElementReferenceException:
                return False
            return True

        self.wait(f"click {css}", attempt)

    def button(self, label: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.XPATH, f"//button[normalize-space(.)={json.dumps(label)}]")

    def settle(self) -> None:
        """No request in flight and the page's loading placeholder gone."""
        self.wait("page loaded", lambda d: not d.find_elements("css selector", "main > .loading"))

    def check_page(self, name: str) -> None:
        """Screenshots at both sizes, axe-core, and the logs so far."""
        self.settle()
        for size in SIZES:
            self.size(size)
            self.driver.execute_script("return new Promise(r => requestAnimationFrame(() => r()))")
            self.driver.save_screenshot(str(self.screens / f"{name}-{size}.png"))
            self.axe(f"{name} at {size}")
            self.fits(f"{name} at {size}")
        self.size("desktop")
        self.collect_logs()

    def fits(self, where: str) -> None:
        """Nothing is cut off on the right: the page never scrolls sideways (wide tables and
        graphs scroll inside their own box), and no table cell is squeezed to one word a line."""
        wide = self.driver.execute_script(
            "const w = document.documentElement.clientWidth;"
            "const out = e => e.getBoundingClientRect().right > w + 1;"
            "const all = [document.body, ...document.body.querySelectorAll('*')];"
            "return [document.documentElement.scrollWidth, w, all"
            ".filter(e => out(e) && !(e.parentElement && out(e.parentElement))"
            " && !(e.parentElement && e.parentElement.closest('.table-wrap, .graph-box, pre')))"
            ".slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + e.id)]"
        )
        assert wide[0] <= wide[1] + 1 and not wide[2], f"{where}: the page is wider than the screen: {wide}"
        narrow = self.driver.execute_script(
            "return [...document.querySelectorAll('main td')].filter(td => td.offsetParent"
            " && td.textContent.trim().includes(' ') && td.getBoundingClientRect().width < 60)"
            ".slice(0, 5).map(td => td.textContent.trim())"
        )
        assert not narrow, f"{where}: squeezed table cells: {narrow}"

    def axe(self, where: str) -> None:
        if not self.driver.execute_script("return typeof window.axe !== 'undefined'"):
            self.driver.execute_script(self.axe_source)
        result = self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "axe.run(document, {resultTypes: ['violations']})"
            ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
            " nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}))))"
            ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));"
        )
        bad = result  # every violation, whatever its impact
        assert not bad, f"axe-core on {where}: {json.dumps(bad, indent=1)}"

    def collect_logs(self) -> None:
        for entry in self.driver.get_log("browser"):
            if entry["level"] == "SEVERE":
                self.console_errors.append(entry["message"])
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            method, params = message["method"], message.get("params", {})
            if method == "Network.loadingFailed" and not params.get("canceled"):
                self.failed_requests.append(f"{params.get('errorText')} ({params.get('type')})")
            elif method == "Network.responseReceived":
                status, url = params["response"]["status"], params["response"]["url"]
                if status >= 400:
                    self.failed_requests.append(f"{status} {url}")
        for pattern, status in list(self.expected_failures):
            found = [f for f in self.failed_requests if f.startswith(f"{status} ") and re.search(pattern, f)]
            if found:
                self.failed_requests.remove(found[0])
                # Chrome also reports a fetch answered with an error status on the console.
                console = [m for m in self.console_errors if re.search(pattern, m) and f" {status} " in m]
                if console:
                    self.console_errors.remove(console[0])
                self.expected_failures.remove((pattern, status))

    def close(self) -> None:
        self.driver.quit()


@pytest.fixture
def browser(
    chromium_paths: tuple[str, str],
    server: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> Iterator[Browser]:
    screens = Path(os.environ.get("FLOWYARD_CONSOLE_SCREENS") or tmp_path / "screens").resolve()
    screens.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {screens}")
    b = Browser(*chromium_paths, f"http://{server}", screens)
    try:
        yield b
    finally:
        b.close()


def _admin_password(tmp_path: Path) -> str:
    text = (tmp_path / "data" / "initial-admin-password").read_text()
    found = re.search(r"^password: (.+)$", text, re.M)
    assert found
    return found.group(1)


def _admin_api(address: str, tmp_path: Path) -> tuple[httpx.Client, dict[str, str], str]:
    """An API client of the served console, the administrator's bearer header and password."""
    password = _admin_password(tmp_path)
    api = httpx.Client(base_url=f"http://{address}", timeout=10)
    token = api.post("/login", json={"username": ADMIN, "password": password}).json()["token"]
    return api, {"Authorization": f"Bearer {token}"}, password


def _sign_in(b: Browser, username: str, password: str) -> None:
    """On the sign-in form: sign in and land on the flows."""
    b.find("input[name=username]").send_keys(username)
    b.find("input[name=password]").send_keys(password)
    b.click_text("button", "Sign in")
    b.wait_text("main h1", "^Flows$")


def test_console_scenario(browser: Browser, server: str, tmp_path: Path) -> None:  # noqa: F811
    api, admin, password = _admin_api(server, tmp_path)
    assert api.post("/templates", json=TEMPLATE, headers=admin).status_code == 201
    from selenium.webdriver.support.ui import Select

    b = browser
    d = b.driver

    # Sign in: an unauthenticated visit lands on the sign-in form.
    b.go("/flows")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    b.check_page("signin")
    assert not b.find("#signout").is_displayed() and not b.find("#nav").is_displayed()
    _sign_in(b, ADMIN, password)
    b.wait_text(".empty", "No flows yet")
    assert d.execute_script("return window.localStorage.length") == 0
    assert d.execute_script("return sessionStorage.getItem('flowyard.token')")
    b.check_page("flows-empty")

    # Create a flow from the template.
    b.click_text("a", "Templates")
    b.wait_text(".template h2", "Order totals")
    b.check_page("templates")
    b.click_text("button", "Create flow")
    b.wait_text("main h1", "Order totals")
    flow_id = re.search(r"#/flows/([0-9a-f]{24})", d.current_url).group(1)  # type: ignore[union-attr]

    # Its graph: three nodes, two edges, the condition and the mapper visible.
    b.find("svg.graph")
    assert len(b.find_all("svg.graph g.node")) == 3
    assert len(b.find_all("svg.graph path.edge")) == 2
    labels = " ".join(el.text for el in b.find_all("svg.graph .edge-label"))
    assert "if $exists(id)" in labels and "map total, id" in labels, labels
    assert f"/webhooks/{flow_id}" in b.text("#webhook-url")
    b.wait_text(".status-line", "inactive")
    assert b.button("Start").is_enabled() and not b.button("Stop").is_enabled()
    b.check_page("flow-inactive")

    # Start it and watch it reach active without a reload.
    d.execute_script("window.__sameDocument = true")
    b.click_text("button", "Start")
    b.wait_text(".status-line", r"\bactive\b")
    assert d.execute_script("return window.__sameDocument === true"), "the page reloaded"
    assert not b.button("Start").is_enabled() and b.button("Stop").is_enabled()

    # Webhooks from the test; the executions appear on the flow page by themselves.
    ok = api.post(f"/webhooks/{flow_id}", json={"id": "A-1", "total": 7})
    bad = api.post(f"/webhooks/{flow_id}", json={"id": "A-2"})
    assert ok.status_code == bad.status_code == 202
    failed_id = bad.json()["data"]["executionId"]
    b.wait_text("main table tbody", failed_id)
    b.wait_text("main table tbody", "failed")
    b.wait_text("main table tbody", "succeeded")
    assert d.execute_script("return window.__sameDocument === true"), "the page reloaded"
    b.check_page("flow-active")

    # The executions list, then the failing execution: the step's error and its log entry.
    b.click_text("a", "Executions")
    b.wait_text("main table tbody", failed_id)
    b.check_page("executions")
    b.click(f"a[href='#/executions/{failed_id}']")
    error = b.wait_text(".step-failed .step-error", "yielded no value")
    assert "total" in error
    b.wait_text(".step-failed .step-logs", r"error")
    assert b.find(".step-failed h3").text == "total"
    # The run drawn on the graph of the version it ran: the failed step red, the others green.
    ran = {
        el.find_element("css selector", ".node-label").text: el.get_attribute("class")
        for el in b.find_all("svg.graph g.node")
    }
    assert "run-failed" in ran["total"] and all(
        "run-succeeded" in c for n, c in ran.items() if n != "total"
    ), ran
    assert "order received" in " ".join(el.text for el in b.find_all(".step-succeeded .step-logs"))
    b.check_page("execution-failed")

    # Run it again with the same input: a new execution of the same flow, which fails the same way.
    b.click_text("button", "Run again with this input")
    b.wait("a new execution page", lambda d: failed_id not in d.current_url)
    again = re.search(r"#/executions/([0-9a-f]{24})", d.current_url).group(1)  # type: ignore[union-attr]
    b.wait_text(".status-line", "failed")
    rerun = api.get(f"/executions/{again}", headers=admin).json()["data"]
    assert rerun["trigger"] == "manual" and rerun["flowId"] == flow_id and rerun["input"] == {"id": "A-2"}

    # Retry it from its failed step (SPEC §11): a new execution that names the one it retries;
    # a finished execution offers Re-run, and no Cancel.
    b.wait_text(".actions", "Re-run")
    assert "Cancel execution" not in b.find("main .actions").text
    b.click_text("button", "Retry")
    b.wait("the retry's page", lambda d: again not in d.current_url)
    retried = re.search(r"#/executions/([0-9a-f]{24})", d.current_url).group(1)  # type: ignore[union-attr]
    b.wait_text(".status-line", "failed")
    b.wait_text(".facts", "Retry of")
    assert api.get(f"/executions/{retried}", headers=admin).json()["data"]["retryOf"] == again

    # Stop the flow.
    b.go(f"/flows/{flow_id}")
    b.wait_text(".status-line", r"\bactive\b")
    b.click_text("button", "Stop")
    b.wait_text(".status-line", "inactive")

    # The editor shows the server's validation error next to the field it names.
    b.click_text("a", "Edit")
    cron = b.find("input.mono[placeholder^='empty']")
    cron.send_keys("every tuesday")
    b.expected_failures.append((rf"/flows/{flow_id}(\s|$)", 400))
    b.click_text("button", "Save")
    b.wait_text(f"#{cron.get_attribute('id')}-error", "(?i)cron")
    assert cron.get_attribute("aria-invalid") == "true"
    b.check_page("editor-error")
    b.collect_logs()  # the first 400 is matched before the second one is expected
    # Several problems in the graph: one line each, the path said once.
    cron.clear()
    graph = b.find("textarea.mono")
    graph.clear()
    graph.send_keys(
        json.dumps(
            {"nodes": [{"id": "a", "componentId": "nope"}, {"id": "b", "componentId": "nada"}], "edges": []}
        )
    )
    b.expected_failures.append((rf"/flows/{flow_id}(\s|$)", 400))
    b.click_text("button", "Save")
    graph_error = f"#{graph.get_attribute('id')}-error"
    b.wait_text(graph_error, "nada")
    lines = [el.text for el in b.find_all(f"{graph_error} .field-problem")]
    assert len(lines) == 3, lines  # two unknown components, and no edge
    for line in lines:
        path = line.split(":", 1)[0]
        assert line.count(path) == 1, lines
    b.click_text("a", "Cancel")

    # History: a change of the graph makes version 2, the diff shows the change, and Restore
    # makes version 3 equal to version 1.
    graph = api.get(f"/flows/{flow_id}", headers=admin).json()["data"]["graph"]
    first_graph = json.loads(json.dumps(graph))
    graph["nodes"][0]["name"] = "Renamed step"
    r = api.patch(f"/flows/{flow_id}", headers=admin, json={"graph": graph})
    assert r.status_code == 200 and r.json()["data"]["version"] == 2, r.text
    b.go("/flows")  # away and back: the flow page reads the history again
    b.wait_text("main h1", "Flows")
    b.go(f"/flows/{flow_id}")
    b.wait_text("section[aria-label='History'] table", r"2 \(current\)")
    b.click_text("button", "Show diff")
    b.wait_text("pre.diff", "Renamed step")
    assert any(
        el.text.startswith("+") and "Renamed step" in el.text for el in b.find_all("pre.diff .diff-add")
    )
    b.check_page("flow-history")
    b.click_text("button", "Restore")
    d.switch_to.alert.accept()
    b.wait_text("section[aria-label='History'] table", r"3 \(current\)")
    restored = api.get(f"/flows/{flow_id}", headers=admin).json()["data"]
    assert restored["version"] == 3 and restored["graph"] == first_graph

    # Text from the API is text: a flow named like markup shows as typed and runs nothing.
    hostile = '<img src="x" onerror="window.__pwned = 1">'
    r = api.post(
        "/flows",
        headers=admin,
        json={"name": hostile, "type": "ordinary", "graph": {"nodes": [{"id": hostile[:60]}]}},
    )
    assert r.status_code == 201, r.text
    b.click_text("a", "Flows")
    b.wait_text("main table tbody", re.escape(hostile))
    b.click(f"a[href='#/flows/{r.json()['data']['id']}']")
    b.wait_text("main h1", re.escape(hostile))
    assert b.find("svg.graph .node-label").text == hostile[:60]
    assert d.execute_script("return window.__pwned") is None
    assert not b.find_all("main img")

    # Delete (the flow is inactive), then the list's status filter as the API offers it.
    b.click_text("button", "Delete")
    d.switch_to.alert.accept()
    b.wait_text("main h1", "^Flows$")
    b.wait("the deleted flow gone", lambda d: "Order totals" in d.find_element("id", "main").text)
    assert hostile not in d.find_element("id", "main").text
    Select(b.find("#main form.filters select")).select_by_value("active")
    b.wait_text(".empty", "No flow matches these filters")
    assert "status=active" in d.current_url

    # Logs: the failing step's error entry among them.
    b.click_text("a", "Logs")
    b.wait_text("main table tbody", "order received")
    b.check_page("logs")

    # Counts: four executions today (two webhooks, the run again and the retry).
    b.click_text("a", "Counts")
    assert b.wait_text("#counts-total", "^4$")
    assert len(b.find_all("canvas")) == 4
    b.check_page("counts")

    # An API token, shown once.
    b.click_text("a", "Admin")
    b.wait_text("main h2", "Create an API token")
    d.find_element("css selector", "form.card input[type=text]").send_keys("console test token")
    b.click_text("button", "Create token")
    new_token = b.text("#new-token")
    assert len(new_token) >= 32
    assert api.get("/flows", headers={"Authorization": f"Bearer {new_token}"}).status_code == 200
    b.wait_text("main table tbody", "console test token")
    b.check_page("tokens-created")
    d.refresh()
    b.wait_text("main table tbody", "console test token")
    assert new_token not in d.page_source
    for tab in ("Users", "Tenants", "Roles"):
        b.click_text("a", tab)
        b.wait_text("main h2", f"^{tab}$")
        b.check_page(f"admin-{tab.lower()}")

    # A step that fails twice (a thrown error is retryable; retried once), then its failure
    # edge: the edge is drawn apart, the step shows its attempts and each failed attempt's
    # error, and the run succeeds.
    fallback = {
        "name": "Fallback",
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "total",
                    "componentId": "code",
                    "fields": {
                        "source": "function main(data) { throw new Error('no total in ' + data.id); }"
                    },
                    "retry": {"maxAttempts": 2, "initialInterval": 0},
                },
                {"id": "alert", "componentId": "log", "fields": {"message": "no total"}},
            ],
            "edges": [
                {"source": "in", "target": "total"},
                {"source": "total", "target": "alert", "on": "failure"},
            ],
        },
    }
    made = api.post("/flows", json=fallback, headers=admin)
    assert made.status_code == 201, made.text
    fallback_id = made.json()["data"]["id"]
    assert api.post(f"/flows/{fallback_id}/start", headers=admin).status_code == 200
    b.go(f"/flows/{fallback_id}")
    b.wait_text(".status-line", r"\bactive\b")
    assert len(b.find_all("svg.graph path.edge-failure")) == 1
    assert len(b.find_all("svg.graph path.edge")) == 2
    b.wait_text("svg.graph", "on failure")
    sent = api.post(f"/webhooks/{fallback_id}", json={"id": "A-3"})
    assert sent.status_code == 202, sent.text
    b.go(f"/executions/{sent.json()['data']['executionId']}")
    b.wait_text(".status-line", "succeeded")
    b.wait_text(".step-failed .step-facts", "2 attempts")
    assert "Failed attempts (2)" in b.text(".step-failed details.attempts summary")
    b.check_page("execution-failure-edge")

    # Sign out: the token is gone from the page and from the server.
    b.click_text("button", "Sign out")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    assert d.execute_script("return sessionStorage.length") == 0
    assert not b.find("#signout").is_displayed()
    assert d.execute_script("return window.localStorage.length") == 0
    assert api.get("/flows", headers=admin).status_code == 200  # the test's own session lives on

    # A reader (tenant.flows.read only) is offered nothing that would end in a permission error.
    tenant = api.post("/tenants", json={"name": "readers"}, headers=admin)
    assert tenant.status_code == 201, tenant.text
    tenant_id = tenant.json().get("id") or tenant.json()["data"]["id"]
    reader = ("reader@example.com", "reader-password-1")
    made = api.post(
        "/api/users",
        json={
            "username": reader[0],
            "password": reader[1],
            "tenant": tenant_id,
            "permissions": ["tenant.flows.read"],
        },
        headers=admin,
    )
    assert made.status_code == 201, made.text
    _sign_in(b, reader[0], reader[1])
    b.wait_text(".empty", r"^No flows yet\.$")
    shown = [el.text for el in b.find_all("#nav a, main a, main button") if el.is_displayed()]
    for offered in ("Templates", "New flow", "From a template", "Browse the templates"):
        assert offered not in shown, shown
    b.check_page("flows-reader")
    b.click_text("button", "Sign out")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    b.collect_logs()
    assert not b.expected_failures, f"expected failures not seen: {b.expected_failures}"
    assert not b.console_errors, b.console_errors
    assert not b.failed_requests, b.failed_requests


def test_code_step_editor_and_test_this_step(browser: Browser, server: str, tmp_path: Path) -> None:  # noqa: F811
    """Issue 20's console: a code step's source in a highlighted editor (not a string inside the
    graph's JSON), typed by keyboard and written back into the graph, and "Test step" running
    it alone on a sample message in a runner; a throwing step shows its error with the line."""
    api, admin, password = _admin_api(server, tmp_path)
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {
                "id": "calc",
                "componentId": "code",
                "fields": {"source": "function main(data) {\n  return data;\n}"},
            },
        ],
        "edges": [{"source": "in", "target": "calc"}],
    }
    r = api.post("/flows", json={"name": "Coded", "type": "ordinary", "graph": graph}, headers=admin)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    b = browser
    b.go("/flows")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    _sign_in(b, ADMIN, password)
    b.go(f"/flows/{fid}/edit")
    b.wait_text("main h1", "Edit Coded")
    b.wait(
        "the code editor, highlighted",
        lambda d: d.find_elements("css selector", ".code-editor .code-view .hljs-keyword"),
    )
    area = b.find(".code-editor textarea")
    from selenium.webdriver.common.keys import Keys

    area.send_keys(Keys.CONTROL, "a")
    area.send_keys(Keys.DELETE)
    area.send_keys("function main(data) {\n")
    area.send_keys(Keys.TAB, "return {n: data.n * 2};\n}")
    graph_json = json.loads(b.find("textarea.mono").get_attribute("value"))
    source = graph_json["nodes"][1]["fields"]["source"]
    assert source == "function main(data) {\n  return {n: data.n * 2};\n}", repr(source)
    sample = b.driver.find_element(
        "xpath", "//label[contains(., 'Sample message for step calc')]/following-sibling::textarea"
    )
    sample.clear()
    sample.send_keys('{"n": 21}')
    b.click_text("button", "Test step calc")
    out = b.wait_text(".trial.ok", "Succeeded")
    assert '"n": 42' in out, out
    b.check_page("editor-code-step")
    area.send_keys(Keys.CONTROL, "a")
    area.send_keys(Keys.DELETE)
    area.send_keys("function main(data) {\n")
    area.send_keys(Keys.TAB, "return data.x.y;\n}")
    b.click_text("button", "Test step calc")
    error = b.wait_text(".trial.failed .error-text", "TypeError")
    assert "line 2" in error, error
    b.click_text("button", "Save")
    b.wait_text("main h1", "^Coded$")
    saved = api.get(f"/flows/{fid}", headers=admin).json()["data"]["graph"]["nodes"][1]["fields"]["source"]
    assert "data.x.y" in saved, saved


def test_credentials_page_and_the_picker(browser: Browser, server: str, tmp_path: Path) -> None:  # noqa: F811
    """Issue 21's credentials: stored, listed without their values, rotated and deleted from
    Administration → Credentials, and picked for a step in the flow editor."""
    api, admin, password = _admin_api(server, tmp_path)
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {
                "id": "call",
                "componentId": "http",
                "fields": {"url": "https://partner.example/api", "method": "POST"},
            },
        ],
        "edges": [{"source": "in", "target": "call"}],
    }
    r = api.post("/flows", json={"name": "Partner", "type": "ordinary", "graph": graph}, headers=admin)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    b = browser
    b.go("/flows")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    _sign_in(b, ADMIN, password)
    b.go("/admin/credentials")
    b.wait_text(".empty", "No credentials yet")
    b.driver.find_element("xpath", "//label[.='Name']/following-sibling::input").send_keys("partner")
    value = b.driver.find_element("xpath", "//label[.='Value (JSON object)']/following-sibling::textarea")
    value.send_keys('{"token": "first-secret-4711"}')
    b.click_text("button", "Store credentials")
    b.wait_text("main table tbody", "partner")
    assert "first-secret-4711" not in b.driver.page_source, "a stored value is never shown"
    b.check_page("admin-credentials")
    sid = api.get("/secrets", headers=admin).json()["data"][0]["id"]
    b.click("button[aria-label='Rotate credentials partner']")
    area = b.driver.find_element("xpath", "//label[.='New value (JSON object)']/following-sibling::textarea")
    area.send_keys('{"token": "second-secret-0815"}')
    b.click_text("button", "Rotate")
    b.wait("the rotate form closed", lambda d: not d.find_elements("xpath", "//h2[.='Rotate partner']"))
    assert "second-secret-0815" not in b.driver.page_source

    b.go(f"/flows/{fid}/edit")
    b.wait_text("main h1", "Edit Partner")
    from selenium.webdriver.support.ui import Select

    picker = b.driver.find_element("xpath", "//label[.='Credentials of step call']/following-sibling::select")
    Select(picker).select_by_value(sid)
    graph_json = json.loads(b.find("textarea.mono").get_attribute("value"))
    assert graph_json["nodes"][1]["credentials_id"] == sid
    b.check_page("editor-credentials")
    b.click_text("button", "Save")
    b.wait_text("main h1", "^Partner$")
    assert (
        api.get(f"/flows/{fid}", headers=admin).json()["data"]["graph"]["nodes"][1]["credentials_id"] == sid
    )

    b.go("/admin/credentials")
    b.wait_text("main table tbody", "partner")
    b.driver.execute_script("window.confirm = () => true")
    b.click("button[aria-label='Delete credentials partner']")
    b.wait_text(".empty", "No credentials yet")


def test_visual_editor_builds_a_flow_by_mouse_and_keyboard(
    browser: Browser,
    server: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 21's visual editor: webhook → http → sql plus a failure edge built on the canvas
    (a step dragged from the palette, a step added by a click after the selected one, an edge
    dragged from a port, forms generated from the components' schemas, a credential picked, an
    edge removed with the Delete key, undo and redo), saved, started and run: the refused http
    call takes the failure edge, drawn on the execution's graph, with the failed step's input.
    Then a condition previewed on a sample message, and the phone's share: palette and forms."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    api, admin, password = _admin_api(server, tmp_path)
    secret = {"name": "orders-db", "value": {"url": "sqlite:///orders.db"}}
    r = api.post("/secrets", json=secret, headers=admin)
    assert r.status_code == 201, r.text
    sid = r.json()["data"]["id"]
    b = browser
    d = b.driver
    b.go("/flows")
    b.wait("sign-in form", lambda d: "#/login" in d.current_url)
    _sign_in(b, ADMIN, password)
    b.go("/flows/new")
    b.wait_text("main h1", "New flow")

    def graph_now() -> dict[str, Any]:
        return json.loads(b.find("textarea.mono").get_attribute("value"))  # type: ignore[no-any-return]

    def node(node_id: str) -> Any:
        return b.find(f"svg.canvas g[data-node='{node_id}']")

    def labelled(label: str, tag: str = "*") -> Any:
        return b.wait(
            f"the control labelled {label}",
            lambda d: d.find_element(
                "xpath",
                "//section[contains(@class,'visual-editor')]"
                f"//label[.={json.dumps(label)}]/following-sibling::{tag}",
            ),
        )

    def edge_button(text: str) -> Any:
        return b.wait(
            f"the edge {text} in the form",
            lambda d: next((el for el in b.find_all(".edge-list button") if el.text == text), None),
        )

    # The palette is grouped and searchable.
    groups = [el.text for el in b.find_all(".palette-group h3")]
    assert groups == ["Triggers", "Steps"], groups
    search = labelled("Components", "input")
    search.send_keys("sql")
    b.wait("the search narrows the palette", lambda d: len(b.find_all(".palette-item")) == 1)
    search.send_keys(Keys.CONTROL, "a")
    search.send_keys(Keys.BACKSPACE)
    b.wait("every component again", lambda d: len(b.find_all(".palette-item")) > 5)

    # Select "in", then drag http from the palette onto the canvas: it follows "in".
    node("in").click()
    ActionChains(d).click_and_hold(b.find(".palette-item[data-component='http']")).move_by_offset(
        20, 10
    ).move_to_element(b.find(".canvas-box")).release().perform()
    b.wait("http on the canvas", lambda d: d.find_elements("css selector", "svg.canvas g[data-node='http']"))
    g = graph_now()
    assert {"source": "in", "target": "http"} in g["edges"], g
    url = labelled("Url (required)", "input")
    url.send_keys("http://127.0.0.1:9/orders", Keys.TAB)
    b.wait("the url in the JSON", lambda d: graph_now()["nodes"][-1].get("fields", {}).get("url"))
    Select(labelled("Method", "select")).select_by_value("POST")
    b.find(".retry-form summary").click()
    labelled("Attempts", "input").send_keys("3", Keys.TAB)
    b.wait(
        "the retry policy in the JSON", lambda d: graph_now()["nodes"][-1].get("retry") == {"maxAttempts": 3}
    )
    # A click on sql in the palette adds it after the selected http.
    b.find(".palette-item[data-component='sql']").click()
    b.wait("sql on the canvas", lambda d: d.find_elements("css selector", "svg.canvas g[data-node='sql']"))
    labelled("Statement (required)", "textarea").send_keys("INSERT INTO orders (id) VALUES (:id)", Keys.TAB)
    labelled("Params", "textarea").send_keys('{"id": "id"}', Keys.TAB)
    Select(labelled("Credentials of step sql", "select")).select_by_value(sid)
    # A failure edge: dragged from http's port onto "out", then switched to "failure".
    ActionChains(d).click_and_hold(b.find("svg.canvas circle[data-port='http']")).move_by_offset(
        10, 10
    ).move_to_element(node("out")).release().perform()
    b.wait_text(".inspector h3", "Edge http → out")
    Select(labelled("Runs on", "select")).select_by_value("failure")
    b.wait("the failure edge", lambda d: d.find_elements("css selector", "svg.canvas path.edge-failure"))
    b.check_page("visual-editor")
    # The sample's in → out edge goes, by keyboard: the step focused, Enter, its edge, Delete.
    node("in").send_keys(Keys.ENTER)
    edge_button("in → out").click()
    b.wait_text(".inspector h3", "Edge in → out")
    ActionChains(d).send_keys(Keys.DELETE).perform()
    b.wait("in → out removed", lambda d: {"source": "in", "target": "out"} not in graph_now()["edges"])
    ActionChains(d).key_down(Keys.CONTROL).send_keys("z").key_up(Keys.CONTROL).perform()
    b.wait("undone", lambda d: {"source": "in", "target": "out"} in graph_now()["edges"])
    ActionChains(d).key_down(Keys.CONTROL).key_down(Keys.SHIFT).send_keys("z").key_up(Keys.SHIFT).key_up(
        Keys.CONTROL
    ).perform()
    b.wait("redone", lambda d: {"source": "in", "target": "out"} not in graph_now()["edges"])

    g = graph_now()
    assert [n["id"] for n in g["nodes"]] == ["in", "out", "http", "sql"], g
    assert sorted((e["source"], e["target"], e.get("on")) for e in g["edges"]) == [
        ("http", "out", "failure"),
        ("http", "sql", None),
        ("in", "http", None),
    ], g
    http_node, sql_node = g["nodes"][2], g["nodes"][3]
    assert http_node["fields"] == {"url": "http://127.0.0.1:9/orders", "method": "POST"}, http_node
    assert http_node["retry"] == {"maxAttempts": 3}, http_node
    assert sql_node["fields"] == {"statement": "INSERT INTO orders (id) VALUES (:id)", "params": {"id": "id"}}
    assert sql_node["credentials_id"] == sid

    b.find("main form input[type=text]").send_keys("Orders to the database")
    b.click_text("button", "Create flow")
    b.wait_text("main h1", "Orders to the database")
    fid = re.search(r"#/flows/([0-9a-f]{24})", d.current_url).group(1)  # type: ignore[union-attr]
    assert api.get(f"/flows/{fid}", headers=admin).json()["data"]["graph"] == g
    b.click_text("button", "Start")
    b.wait_text(".status-line", r"\bactive\b")
    r = api.post(f"/webhooks/{fid}", json={"id": "A-1"})
    assert r.status_code == 202, r.text
    eid = r.json()["data"]["executionId"]
    b.go(f"/executions/{eid}")
    b.wait_text(".status-line", "succeeded")  # the failure edge handled the refused call
    drawn = b.find("svg.graph").get_attribute("aria-label")
    assert "http failed" in drawn and "out succeeded" in drawn and "sql not run" in drawn, drawn
    failed = b.wait_text(".step-failed", "(?s)http.*Error: .*Input")
    assert "refusing to connect to 127.0.0.1" in failed, failed
    assert '"id": "A-1"' in failed, failed  # the failed step's input

    # A condition on http → sql, previewed on a sample message, then saved on the active flow.
    b.go(f"/flows/{fid}/edit")
    b.wait_text("main h1", "Edit Orders to the database")
    # The sample of in → http taken from the execution above: what "in" emitted there.
    node("in").click()
    edge_button("in → http").click()
    Select(labelled("Sample from a past execution (the output of in)", "select")).select_by_value(eid)
    b.wait(
        "the past input",
        lambda d: (
            json.loads(labelled("Sample message (JSON)", "textarea").get_attribute("value")) == {"id": "A-1"}
        ),
    )
    node("http").click()
    edge_button("http → sql").click()
    cond = labelled("Condition (JSONata)", "input")
    cond.send_keys("id = 'A-1'", Keys.TAB)
    sample = labelled("Sample message (JSON)", "textarea")
    sample.clear()
    sample.send_keys('{"id": "A-1"}')
    b.click_text("button", "Preview")
    b.wait_text(".inspector .trial-result", "Condition: true")
    b.check_page("visual-editor-edge")
    b.click_text("button", "Save")
    b.wait_text("main h1", "^Orders to the database$")
    saved = api.get(f"/flows/{fid}", headers=admin).json()["data"]
    # The editor shows the history: version 2 (this save) above version 1.
    b.go(f"/flows/{fid}/edit")
    b.wait_text("section[aria-label='History'] table", r"2 \(current\)")
    assert saved["status"] == "active"
    assert [e.get("config") for e in saved["graph"]["edges"] if e["target"] == "sql"] == [
        {"condition": "id = 'A-1'"}
    ]

    # On a phone the same flow is built with what a phone offers: taps on the palette and the
    # canvas, the forms, "Connect to" instead of a drag, "Delete edge" instead of the key.
    b.size("phone")
    b.go("/flows/new")
    b.wait_text("main h1", "New flow")
    node("in").click()
    b.find(".palette-item[data-component='http']").click()
    b.wait("http after in", lambda d: {"source": "in", "target": "http"} in graph_now()["edges"])
    labelled("Url (required)", "input").send_keys("http://127.0.0.1:9/orders", Keys.TAB)
    Select(labelled("Method", "select")).select_by_value("POST")
    b.find(".palette-item[data-component='sql']").click()
    b.wait("sql after http", lambda d: {"source": "http", "target": "sql"} in graph_now()["edges"])
    labelled("Statement (required)", "textarea").send_keys("INSERT INTO orders (id) VALUES (:id)", Keys.TAB)
    labelled("Params", "textarea").send_keys('{"id": "id"}', Keys.TAB)
    Select(labelled("Credentials of step sql", "select")).select_by_value(sid)
    node("http").click()
    b.wait_text(".inspector h3", "Step http")
    Select(labelled("Connect to", "select")).select_by_value("out")
    b.click_text("button", "Add edge")
    b.wait_text(".inspector h3", "Edge http → out")
    Select(labelled("Runs on", "select")).select_by_value("failure")
    node("in").click()
    edge_button("in → out").click()
    b.click_text("button", "Delete edge")
    b.wait("in → out removed", lambda d: {"source": "in", "target": "out"} not in graph_now()["edges"])
    b.check_page("visual-editor-phone-build")
    b.size("phone")
    phone = graph_now()
    assert sorted((e["source"], e["target"], e.get("on")) for e in phone["edges"]) == [
        ("http", "out", "failure"),
        ("http", "sql", None),
        ("in", "http", None),
    ], phone
    assert [n.get("fields") for n in phone["nodes"]] == [n.get("fields") for n in g["nodes"]], phone
    b.find("main form input[type=text]").send_keys("Built on a phone")
    b.click_text("button", "Create flow")
    b.wait_text("main h1", "Built on a phone")
    b.size("desktop")
    b.collect_logs()
    assert not b.console_errors, b.console_errors
    assert not b.failed_requests, b.failed_requests


# What each button or link of the console asks of its caller (any one of the permissions).
NEEDS: dict[str, tuple[str, ...]] = {
    "New flow": ("tenant.flows.create",),
    "From a template": ("tenant.flows.create",),
    "Browse the templates": ("flowTemplates.read",),
    "Templates": ("flowTemplates.read",),
    "Create flow": ("tenant.flows.create",),
    "Start": ("tenant.flows.update",),
    "Stop": ("tenant.flows.update",),
    "Edit": ("tenant.flows.update",),
    "Run now": ("tenant.flows.update",),
    "Delete": ("tenant.flows.delete", "iam.secret.delete", "iam.token.delete"),
    "Restore": ("tenant.flows.update",),
    "Retry": ("tenant.flows.update",),
    "Re-run": ("tenant.flows.update",),
    "Cancel execution": ("tenant.flows.update",),
    "Run again with this input": ("tenant.flows.update",),
    "Store credentials": ("iam.secret.create",),
}


def test_every_button_a_caller_is_shown_is_one_it_may_use(
    browser: Browser,
    server: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 21's permission-aware UI, for five kinds of caller: the administrator, a tenant's
    member (the default permissions), an operator (read and update only), a reader (read only)
    and a tenantless user (default permissions, its own flows). Each visits every page it is
    offered: no button or link is shown that needs a permission it lacks, "Run now" (where
    shown) works, and no page asks the API for anything that ends in a 401/403/404."""
    api, admin, password = _admin_api(server, tmp_path)
    r = api.post("/tenants", json={"name": "five-kinds"}, headers=admin)
    assert r.status_code == 201, r.text
    tenant = r.json().get("id") or r.json()["data"]["id"]
    member_default = [
        "tenant.flows.read",
        "tenant.flows.create",
        "tenant.flows.update",
        "tenant.flows.delete",
    ]
    member_default += ["flowTemplates.read", "iam.token.create", "iam.token.delete"]
    kinds: dict[str, tuple[str | None, list[str]]] = {
        "member": (tenant, member_default),
        "operator": (tenant, ["tenant.flows.read", "tenant.flows.update"]),
        "reader": (tenant, ["tenant.flows.read"]),
        "loner": (None, member_default),
    }
    callers: dict[str, tuple[str, str, set[str]]] = {ADMIN: (ADMIN, password, {"all"})}
    for kind, (tid, perms) in kinds.items():
        user = {"username": f"{kind}@example.com", "password": f"{kind}-password-1", "permissions": perms}
        if tid:
            user["tenant"] = tid
        made = api.post("/api/users", json=user, headers=admin)
        assert made.status_code == 201, made.text
        callers[kind] = (user["username"], user["password"], set(perms))

    def run_flow(headers: dict[str, str], **extra: Any) -> tuple[str, str]:
        body = {
            "name": "Visible",
            "type": "ordinary",
            "graph": {"nodes": [{"id": "in", "componentId": "webhook"}]},
        }
        r = api.post("/flows", json={**body, **extra}, headers=headers)
        assert r.status_code == 201, r.text
        fid = r.json()["data"]["id"]
        assert api.post(f"/flows/{fid}/start", headers=headers).status_code == 200
        for _ in range(200):
            if api.get(f"/flows/{fid}", headers=headers).json()["data"]["status"] == "active":
                break
            time.sleep(0.05)
        r = api.post(f"/webhooks/{fid}", json={"n": 1})
        assert r.status_code == 202, r.text
        return fid, r.json()["data"]["executionId"]

    tenant_flow = run_flow(admin, tenant=tenant)
    loner_token = api.post("/login", json={"username": "loner@example.com", "password": "loner-password-1"})
    loner_flow = run_flow({"Authorization": f"Bearer {loner_token.json()['token']}"})

    b = browser
    for kind, (username, secret, perms) in callers.items():
        fid, eid = loner_flow if kind == "loner" else tenant_flow
        b.go("/login")
        b.wait("sign-in form", lambda d: d.find_elements("css selector", "input[name=username]"))
        _sign_in(b, username, secret)
        nav = [el.text for el in b.find_all("#nav a") if el.is_displayed()]
        pages = ["/flows", f"/flows/{fid}", "/executions", f"/executions/{eid}", "/logs", "/counts"]
        if "Templates" in nav:
            pages.append("/templates")
        if "Admin" in nav:
            pages.append("/admin/tokens")
        for page in pages:
            b.go(page)
            b.settle()
            b.wait("the page drawn", lambda d: d.find_elements("css selector", "main h1"))
            time.sleep(0.3)  # a live page's first refresh
            shown = [el.text.strip() for el in b.find_all("#nav a, main a, main button") if el.is_displayed()]
            for label in shown:
                needed = NEEDS.get(label)
                if needed and "all" not in perms:
                    assert perms & set(needed), f"{kind} on {page} is offered {label!r} (needs {needed})"
            if page == f"/flows/{fid}" and "Run now" in shown:
                b.click_text("button", "Run now")
                b.wait("the new execution", lambda d: "#/executions/" in d.current_url)
            if page == f"/flows/{fid}":
                assert ("Run now" in shown) == ("all" in perms or "tenant.flows.update" in perms), (
                    kind,
                    shown,
                )
                assert ("Edit" in shown) == ("all" in perms or "tenant.flows.update" in perms), (kind, shown)
        b.click_text("button", "Sign out")
        b.wait("sign-in form", lambda d: "#/login" in d.current_url)
        b.collect_logs()
        assert not b.console_errors, (kind, b.console_errors)
        assert not b.failed_requests, (kind, b.failed_requests)
