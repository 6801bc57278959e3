// flowyard console: a single page over the public API (bearer token in sessionStorage only).
// Everything is built with DOM APIs (textContent, never innerHTML with data), so no text that
// comes from the API can become markup, and the page needs no inline script or style.

const main = document.getElementById("main");
const toastBox = document.getElementById("toast");
const TOKEN_KEY = "flowyard.token";
const ME_KEY = "flowyard.me";
const POLL_MS = 1500;
const STATUSES = ["inactive", "starting", "active", "stopping"];
const EXEC_STATUSES = ["queued", "running", "waiting", "succeeded", "failed", "cancelled"];

// ---------------------------------------------------------------- helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// replaceChildren() would write null as the text "null": leave out what is not there.
function put(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

// Live pages poll: rebuild a region only when its data changed, so focus and clicks survive.
const lastRendered = new WeakMap();
function changed(el, data) {
  const key = JSON.stringify(data);
  if (lastRendered.get(el) === key) return false;
  lastRendered.set(el, key);
  return true;
}

let idCounter = 0;
const uid = (prefix) => `${prefix}-${++idCounter}`;

function field(label, control, help) {
  const id = control.id || uid("f");
  control.id = id;
  const errId = `${id}-error`;
  const err = h("p", { class: "field-error", id: errId, hidden: true });
  const helpEl = help ? h("p", { class: "help", id: `${id}-help` }, help) : null;
  control.setAttribute("aria-describedby", [helpEl ? helpEl.id : "", errId].join(" ").trim());
  return h("div", { class: "field" }, h("label", { for: id }, label), control, helpEl, err);
}

function setFieldError(control, messages) {
  const err = document.getElementById(`${control.id}-error`);
  if (!err) return;
  // One line per problem, not run together.
  err.replaceChildren(...messages.map((m) => h("span", { class: "field-problem" }, m)));
  err.hidden = messages.length === 0;
  if (messages.length) control.setAttribute("aria-invalid", "true");
  else control.removeAttribute("aria-invalid");
}

function select(options, value, attrs) {
  return h(
    "select",
    attrs || {},
    options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)),
  );
}

function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

function fmtJson(value) {
  return value === undefined ? "" : JSON.stringify(value, null, 2);
}

function badge(status) {
  return h("span", { class: `badge badge-${status}` }, status);
}

function toast(message, kind) {
  toastBox.textContent = message;
  toastBox.className = `toast show ${kind || ""}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => {
    toastBox.className = "toast";
  }, 4000);
}

function errorBox(err) {
  const errors = err && err.errors ? err.errors : [{ message: String(err && err.message ? err.message : err) }];
  return h(
    "div",
    { class: "alert", role: "alert" },
    h("ul", {}, errors.map((e) => h("li", {}, problemText(e)))),
  );
}

// A problem as one line: its field first, unless the server's message already starts with it.
function problemText(e) {
  return e.field && !e.message.startsWith(`${e.field}:`) && !e.message.startsWith(e.field + " ") ? `${e.field}: ${e.message}` : e.message;
}

function emptyState(text, action) {
  return h("div", { class: "empty" }, h("p", {}, text), action || null);
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    toast("Copied to the clipboard.");
  } catch {
    toast("Copy failed: select the text and copy it by hand.", "error");
  }
}

function copyButton(text, label) {
  return h("button", { type: "button", class: "secondary small", onclick: () => copyText(text) }, label || "Copy");
}

// ---------------------------------------------------------------- session and API

class ApiError extends Error {
  constructor(status, errors) {
    super(errors.map((e) => e.message).join("; "));
    this.status = status;
    this.errors = errors;
  }
}

const session = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  get me() {
    const raw = sessionStorage.getItem(ME_KEY);
    return raw ? JSON.parse(raw) : null;
  },
  set(token, me) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(ME_KEY, JSON.stringify(me));
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(ME_KEY);
  },
};

function isAdmin() {
  const me = session.me;
  return Boolean(me && me.permissions.includes("all"));
}

function hasPermission(name) {
  const me = session.me;
  if (!me) return false;
  const perms = me.permissions;
  return perms.includes("all") || perms.includes(name) || (name.startsWith("tenant.") && perms.includes("tenant.all"));
}

function qs(params) {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") search.set(k, v);
  }
  const s = search.toString();
  return s ? `?${s}` : "";
}

async function api(method, path, body, { auth = true } = {}) {
  const headers = { Accept: "application/json" };
  if (auth && session.token) headers.Authorization = `Bearer ${session.token}`;
  const init = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, [{ message: "The server cannot be reached. Check that flowyard is running, then retry." }]);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 401 && auth) {
      session.clear();
      showChrome();
      if (!location.hash.startsWith("#/login")) location.hash = "#/login";
    }
    const errors = data && Array.isArray(data.errors) ? data.errors : [{ message: `HTTP ${response.status}` }];
    throw new ApiError(response.status, errors);
  }
  return data;
}

// ---------------------------------------------------------------- router

let cleanup = [];
function onLeave(fn) {
  cleanup.push(fn);
}

// Stops the page's polling; resolves when a refresh already under way has finished.
function stopLivePage() {
  const waits = cleanup.map((fn) => fn());
  cleanup = [];
  return Promise.all(waits);
}

// Calls fn now and every POLL_MS while the page is visible; stops when the route changes.
function poll(fn) {
  let stopped = false;
  let timer = null;
  let inflight = Promise.resolve();
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden) {
      inflight = fn().catch((err) => {
        if (!(err instanceof ApiError)) throw err;
      });
      await inflight;
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  };
  timer = setTimeout(tick, POLL_MS);
  onLeave(() => {
    stopped = true;
    clearTimeout(timer);
    return inflight.catch(() => undefined);
  });
}

const routes = [
  [/^\/login$/, viewLogin, "login"],
  [/^\/flows$/, viewFlows, "flows"],
  [/^\/flows\/new$/, (p, q) => viewEditor(null, q), "flows"],
  [/^\/flows\/([0-9a-f]{24})$/, (p) => viewFlow(p[1]), "flows"],
  [/^\/flows\/([0-9a-f]{24})\/edit$/, (p) => viewEditor(p[1]), "flows"],
  [/^\/executions$/, viewExecutions, "executions"],
  [/^\/executions\/([0-9a-f]{24})$/, (p) => viewExecution(p[1]), "executions"],
  [/^\/logs$/, viewLogs, "logs"],
  [/^\/counts$/, viewCounts, "counts"],
  [/^\/templates$/, viewTemplates, "templates"],
  [/^\/admin\/(tokens|credentials|users|tenants|roles)$/, (p) => viewAdmin(p[1]), "admin"],
];

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/flows";
  const [path, query] = raw.split("?");
  return { path, query: new URLSearchParams(query || "") };
}

function navigate(path, query) {
  location.hash = `#${path}${query ? qs(query) : ""}`;
}

async function route() {
  await stopLivePage();
  const { path, query } = parseHash();
  if (!session.token && path !== "/login") {
    navigate("/login", { next: path === "/" ? "" : path });
    return;
  }
  showChrome();
  for (const [pattern, view, section] of routes) {
    const match = path.match(pattern);
    if (!match) continue;
    for (const link of document.querySelectorAll("#nav a")) {
      if (link.dataset.section === section) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    put(main, h("p", { class: "loading" }, "Loading…"));
    try {
      await view(match, query);
    } catch (err) {
      if (err instanceof ApiError) {
        put(main, 
          h("h1", {}, err.status === 404 ? "Not found" : err.status === 403 ? "Not allowed" : "Something went wrong"),
          errorBox(err),
          h("p", {}, h("a", { href: "#/flows" }, "Back to the flows")),
        );
      } else {
        throw err;
      }
    }
    return;
  }
  put(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/flows" }, "Go to the flows")));
}

function setTitle(text) {
  document.title = `${text} · flowyard`;
}

function showChrome() {
  const me = session.me;
  document.getElementById("nav").hidden = !me;
  document.getElementById("who").hidden = !me;
  document.getElementById("who-name").textContent = me ? me.username : "";
  // Offer only what the caller may open: the templates need flowTemplates.read.
  const templates = document.querySelector('#nav a[data-section="templates"]');
  if (templates) templates.parentElement.hidden = !canUseTemplates();
}

function canUseTemplates() {
  return hasPermission("flowTemplates.read");
}

function canCreateFromTemplate() {
  return canUseTemplates() && hasPermission("tenant.flows.create");
}

// ---------------------------------------------------------------- sign in / out

async function viewLogin(_m, query) {
  setTitle("Sign in");
  const user = h("input", { type: "email", name: "username", autocomplete: "username", required: true });
  const pass = h("input", { type: "password", name: "password", autocomplete: "current-password", required: true });
  const out = h("div", { "aria-live": "polite" });
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    {
      class: "card narrow",
      onsubmit: async (ev) => {
        ev.preventDefault();
        submit.disabled = true;
        put(out, );
        try {
          const login = await api("POST", "/login", { username: user.value, password: pass.value }, { auth: false });
          sessionStorage.setItem(TOKEN_KEY, login.token);
          const found = await api("GET", `/api/users${qs({ username: user.value.trim().toLowerCase() })}`);
          const me = found.find((u) => u.username === user.value.trim().toLowerCase());
          if (!me) throw new ApiError(0, [{ message: "Signed in, but your user record is not readable; ask an administrator." }]);
          const permissions = new Set(me.permissions);
          for (const role of me.roles) for (const p of role.permissions) permissions.add(p);
          session.set(login.token, { id: me.id, username: me.username, tenant: me.tenant, permissions: [...permissions] });
          navigate(query.get("next") || "/flows");
        } catch (err) {
          session.clear();
          put(out, errorBox(err));
          submit.disabled = false;
        }
      },
    },
    h("h1", {}, "Sign in to flowyard"),
    field("E-mail", user),
    field("Password", pass, "After make run, the first administrator's password is in data/initial-admin-password."),
    out,
    submit,
  );
  put(main, form);
  user.focus();
}

document.getElementById("signout").addEventListener("click", async () => {
  try {
    await api("POST", "/logout");
  } catch {
    // the token may already be gone; signing out locally is what matters
  }
  session.clear();
  showChrome();
  navigate("/login");
  toast("Signed out.");
});

// ---------------------------------------------------------------- lists

function pager(meta, onPage) {
  const page = meta.page || 1;
  const pages = meta.totalPages || 0;
  // The history lists, and flow searches, count up to a bound (docs/api.md "Totals of the lists").
  const more = meta.totalExact === false;
  const where = more ? `Page ${page} of ${pages}+ · over ${meta.total}` : `Page ${page} of ${pages} · ${meta.total} in all`;
  return h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    h("button", { type: "button", class: "secondary small", disabled: page <= 1, onclick: () => onPage(page - 1) }, "Previous"),
    h("span", {}, pages ? where : "No results"),
    h(
      "button",
      { type: "button", class: "secondary small", disabled: page >= pages && !more, onclick: () => onPage(page + 1) },
      "Next",
    ),
  );
}

function table(caption, headers, rows) {
  return h(
    "div",
    { class: "table-wrap", tabindex: 0, role: "region", "aria-label": caption },
    h(
      "table",
      {},
      h("caption", { class: "visually-hidden" }, caption),
      // An empty header (a column of buttons) still names itself to screen readers.
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t || h("span", { class: "visually-hidden" }, "Actions"))))),
      h("tbody", {}, rows),
    ),
  );
}

// ---------------------------------------------------------------- flows

async function viewFlows(_m, query) {
  setTitle("Flows");
  const state = {
    search: query.get("search") || "",
    status: query.get("status") || "",
    type: query.get("type") || "",
    sort: query.get("sort") || "-updatedAt",
    page: Number(query.get("page") || 1),
  };
  const search = h("input", { type: "search", value: state.search, placeholder: "Name or description" });
  const status = select([["", "Any status"], ...STATUSES.map((s) => [s, s])], state.status);
  const type = select([["", "Any type"], ["ordinary", "ordinary"], ["realtime", "realtime"]], state.type);
  const sort = select(
    [
      ["-updatedAt", "Recently changed"],
      ["-createdAt", "Newest"],
      ["createdAt", "Oldest"],
      ["name", "Name A–Z"],
      ["-name", "Name Z–A"],
    ],
    state.sort,
  );
  const apply = (page) =>
    navigate("/flows", { search: search.value, status: status.value, type: type.value, sort: sort.value, page: page > 1 ? page : "" });
  const filters = h(
    "form",
    { class: "filters", role: "search", onsubmit: (ev) => { ev.preventDefault(); apply(1); } },
    field("Search", search),
    field("Status", status),
    field("Type", type),
    field("Sort", sort),
    h("button", { type: "submit" }, "Apply"),
  );
  for (const el of [status, type, sort]) el.addEventListener("change", () => apply(1));
  const body = h("div", {});
  put(main, 
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Flows"),
      h(
        "div",
        { class: "actions" },
        hasPermission("tenant.flows.create") ? h("a", { class: "button", href: "#/flows/new" }, "New flow") : null,
        canCreateFromTemplate() ? h("a", { class: "button secondary", href: "#/templates" }, "From a template") : null,
      ),
    ),
    filters,
    body,
  );
  const load = async () => {
    const res = await api(
      "GET",
      `/flows${qs({
        search: state.search,
        "filter[status]": state.status,
        "filter[type]": state.type,
        sort: state.sort,
        "page[size]": 20,
        "page[number]": state.page,
      })}`,
    );
    if (!changed(body, res)) return;
    if (!res.data.length) {
      put(body, 
        emptyState(
          state.search || state.status || state.type
            ? "No flow matches these filters. Clear them to see every flow."
            : canCreateFromTemplate()
              ? "No flows yet. Create one from scratch or from a template."
              : "No flows yet.",
          canCreateFromTemplate() ? h("a", { class: "button", href: "#/templates" }, "Browse the templates") : null,
        ),
      );
      return;
    }
    put(body, 
      table(
        "Flows",
        ["Name", "Status", "Type", "Trigger", "Changed"],
        res.data.map((f) =>
          h(
            "tr",
            {},
            h("td", {}, h("a", { href: `#/flows/${f.id}` }, f.name), f.description ? h("div", { class: "muted" }, f.description) : null),
            h("td", {}, badge(f.status)),
            h("td", {}, f.type),
            h("td", {}, f.cron ? h("code", {}, f.cron) : "webhook"),
            h("td", {}, fmtTime(f.updatedAt)),
          ),
        ),
      ),
      pager(res.meta, apply),
    );
  };
  await load();
  poll(load);
}

// runs: optional Map nodeId -> step status (an execution drawn on its graph); a node without
// one did not run (skipped, or not reached yet).
const SVG_NS = "http://www.w3.org/2000/svg";

// An SVG element; attributes that are null or undefined are left out.
function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// The <svg> of a dagre layout (`info`: its graph label) with an arrow marker `markerId`
// for the edges; natural size up to 640 px wide at least, so a phone scrolls the graph rather
// than shrinking it.
function graphSvg(info, markerId, attrs) {
  const svg = svgEl("svg", { viewBox: `0 0 ${Math.ceil(info.width)} ${Math.ceil(info.height)}`, ...attrs });
  svg.style.minWidth = `${Math.min(Math.ceil(info.width), 640)}px`;
  const marker = svgEl("marker", { id: markerId, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "8", markerHeight: "8", orient: "auto-start-reverse" });
  marker.append(svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }));
  const defs = svgEl("defs", {});
  defs.append(marker);
  svg.append(defs);
  return svg;
}

function drawGraph(graph, runs) {
  const nodes = graph.nodes || [];
  const edges = graph.edges || [];
  const g = new window.dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: "LR", nodesep: 30, ranksep: 80, marginx: 16, marginy: 16 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const n of nodes) {
    const label = n.name || n.id;
    let sub = n.componentId ? `${n.componentId}${n.function ? `.${n.function}` : ""}` : "pass-through";
    const f = n.fields || {};
    // SPEC §12: a join says what it waits for, a sub-flow which flow it calls.
    if (n.componentId === "join") sub = f.count ? `join: ${f.count} messages` : "join: one per edge";
    if (n.componentId === "flow") sub = `sub-flow ${String(f.flowId || "?").slice(0, 8)}…`;
    let kind = n.componentId === "join" ? "node node-join" : n.componentId === "flow" ? "node node-flow" : "node";
    if (runs) {
      const status = runs.get(n.id) || "not run";
      sub = `${sub} · ${status}`;
      kind = `${kind} run-${status.replace(" ", "-")}`;
    }
    const width = Math.max(120, 8 * Math.max(label.length, sub.length) + 24);
    g.setNode(n.id, { label, sub, width, height: 52, kind, title: n.componentId === "flow" ? `calls flow ${f.flowId}` : null });
  }
  edges.forEach((e, i) => {
    const cfg = e.config || {};
    const parts = [];
    if (cfg.condition) parts.push(`if ${cfg.condition}`);
    if (cfg.mapper) parts.push(`map ${Object.keys(cfg.mapper).join(", ")}`);
    if (e.on === "failure") parts.unshift("on failure");
    const label = parts.join(" · ");
    g.setEdge(e.source, e.target, { label, failure: e.on === "failure", width: label ? Math.min(220, 7 * label.length) : 0, height: label ? 18 : 0, labelpos: "c" }, `e${i}`);
  });
  window.dagre.layout(g);
  const s = svgEl;
  const svg = graphSvg(g.graph(), "arrow", {
    role: "img",
    "aria-label": runs
      ? `The run on the flow's graph: ${nodes.map((n) => `${n.id} ${runs.get(n.id) || "not run"}`).join(", ")}`
      : `Flow graph: ${nodes.length} nodes, ${edges.length} edges`,
    class: "graph",
  });
  for (const e of g.edges()) {
    const edge = g.edge(e);
    const d = edge.points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    // A failure edge (SPEC §11) is drawn red and dotted, apart from the normal path.
    svg.append(s("path", { d, class: edge.failure ? "edge edge-failure" : edge.label ? "edge edge-config" : "edge", "marker-end": "url(#arrow)" }));
    if (edge.label) {
      const text = edge.label.length > 34 ? `${edge.label.slice(0, 33)}…` : edge.label;
      const t = s("text", { x: edge.x, y: edge.y + 4, class: "edge-label", "text-anchor": "middle" }, text);
      t.append(s("title", {}, edge.label));
      svg.append(t);
    }
  }
  for (const id of g.nodes()) {
    const n = g.node(id);
    const grp = s("g", { class: n.kind, transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})` });
    grp.append(s("rect", { width: n.width, height: n.height, rx: n.kind.startsWith("node node-join") ? 26 : 8 }));
    if (n.title) grp.append(s("title", {}, n.title));
    grp.append(s("text", { x: n.width / 2, y: 22, "text-anchor": "middle", class: "node-label" }, n.label));
    grp.append(s("text", { x: n.width / 2, y: 40, "text-anchor": "middle", class: "node-sub" }, n.sub));
    svg.append(grp);
  }
  return svg;
}

function executionsTable(items, withFlow, names) {
  return table(
    "Executions",
    ["Execution", ...(withFlow ? ["Flow"] : []), "Status", "Trigger", "Created", "Duration"],
    items.map((x) =>
      h(
        "tr",
        {},
        h("td", {}, h("a", { href: `#/executions/${x.id}`, class: "mono" }, x.id)),
        withFlow
          ? h("td", {}, flowLink(x.flowId, names))
          : null,
        h("td", {}, badge(x.status)),
        h("td", {}, x.trigger),
        h("td", {}, fmtTime(x.createdAt)),
        h("td", {}, duration(x.startedAt, x.finishedAt)),
      ),
    ),
  );
}

function duration(start, end) {
  if (!start || !end) return "—";
  const ms = new Date(end) - new Date(start);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

async function viewFlow(id) {
  let flow = (await api("GET", `/flows/${id}`)).data;
  setTitle(flow.name);
  const statusEl = h("div", { class: "status-line", "aria-live": "polite" });
  const factsEl = h("dl", { class: "facts" });
  const actions = h("div", { class: "actions" });
  const graphBox = h("div", { class: "graph-box", tabindex: 0, role: "region", "aria-label": "Flow graph (scrolls sideways)" });
  const execBox = h("div", {});
  const runBox = h("div", {});
  const hookBox = h("div", {});
  const historyBox = h("div", {});
  const problems = h("div", {});
  const canUpdate = hasPermission("tenant.flows.update");

  const act = async (fn) => {
    put(problems, );
    try {
      await fn();
      await refresh();
    } catch (err) {
      put(problems, errorBox(err));
    }
  };

  const renderStatus = () => {
    put(factsEl, fact("Id", h("span", { class: "mono" }, flow.id)), fact("Type", flow.type), fact("Changed", fmtTime(flow.updatedAt)), fact("Last execution", fmtTime(flow.lastExecutionAt)));
    put(statusEl, 
      h("span", {}, "Status "),
      badge(flow.status),
      flow.statusMessage ? h("span", { class: "status-message" }, flow.statusMessage) : null,
      flow.nextRunAt ? h("span", { class: "muted" }, ` · next run ${fmtTime(flow.nextRunAt)}`) : null,
    );
    put(actions, 
      canUpdate
        ? h("button", { type: "button", disabled: flow.status !== "inactive", onclick: () => act(() => api("POST", `/flows/${id}/start`)) }, "Start")
        : null,
      canUpdate
        ? h("button", { type: "button", class: "secondary", disabled: flow.status !== "active", onclick: () => act(() => api("POST", `/flows/${id}/stop`)) }, "Stop")
        : null,
      canUpdate && (flow.status === "inactive" || flow.status === "active") ? h("a", { class: "button secondary", href: `#/flows/${id}/edit`, title: flow.status === "active" ? "Saving applies to executions that start afterwards." : "" }, "Edit") : null,
      hasPermission("tenant.flows.delete") && flow.status === "inactive"
        ? h(
            "button",
            {
              type: "button",
              class: "danger",
              onclick: () => {
                if (!confirm(`Delete the flow "${flow.name}"? Its execution history stays.`)) return;
                // Quiet first: once the flow is gone no refresh may ask for it again.
                stopLivePage()
                  .then(() => api("DELETE", `/flows/${id}`))
                  .then(
                    () => {
                      toast("Flow deleted.");
                      navigate("/flows");
                    },
                    (err) => {
                      put(problems, errorBox(err));
                      poll(refresh);
                    },
                  );
              },
            },
            "Delete",
          )
        : null,
    );
    const runnable = flow.status === "active";
    if (canUpdate) {
      const input = h("textarea", { rows: 4, class: "mono", spellcheck: "false" }, "{}");
      const out = h("div", { "aria-live": "polite" });
      put(runBox, 
        h("h2", {}, "Run now"),
        runnable ? null : h("p", { class: "muted" }, "Start the flow to run it by hand."),
        h(
          "form",
          {
            onsubmit: async (ev) => {
              ev.preventDefault();
              put(out, );
              let body;
              try {
                body = input.value.trim() ? JSON.parse(input.value) : {};
              } catch (e) {
                setFieldError(input, [`Not valid JSON: ${e.message}`]);
                return;
              }
              setFieldError(input, []);
              try {
                const res = await api("POST", `/flows/${id}/executions`, body);
                navigate(`/executions/${res.data.executionId}`);
              } catch (err) {
                put(out, errorBox(err));
              }
            },
          },
          field("Input (JSON)", input),
          out,
          h("button", { type: "submit", disabled: !runnable }, "Run now"),
        ),
      );
      // keep what the user typed across refreshes: only rebuild when runnability changes
      runBox.dataset.runnable = String(runnable);
    }
    if (flow.cron) {
      put(hookBox, h("h2", {}, "Schedule"), h("p", {}, "Runs on the schedule ", h("code", {}, flow.cron), " (UTC); it takes no webhooks."));
    } else {
      const url = `${location.origin}/webhooks/${flow.id}`;
      const curl = `curl -X POST '${url}' -H 'Content-Type: application/json' -d '{"hello": "world"}'`;
      put(hookBox, 
        h("h2", {}, "Webhook"),
        h("p", {}, flow.status === "active" ? "Active: POST JSON to this address to start an execution." : "Answers only while the flow is active."),
        h("div", { class: "copy-row" }, h("code", { class: "copy-text", id: "webhook-url" }, url), copyButton(url, "Copy URL")),
        h("div", { class: "copy-row" }, h("code", { class: "copy-text" }, curl), copyButton(curl, "Copy curl")),
        flow.webhookSigned ? h("p", { class: "muted" }, "Signed: callers must send X-Flowyard-Signature (see docs/api.md).") : null,
      );
    }
  };

  const loadExecutions = async () => {
    let res;
    try {
      res = await api("GET", `/flows/${id}/executions${qs({ "page[size]": 10 })}`);
      if (!changed(execBox, [res, flow.status])) return;
    } catch (err) {
      lastRendered.delete(execBox);
      put(execBox, h("h2", {}, "Latest executions"), errorBox(err.status === 403 ? { message: "You may not read executions (tenant.flows.read); ask an administrator." } : err));
      return;
    }
    put(execBox, 
      h("div", { class: "section-head" }, h("h2", {}, "Latest executions"), h("a", { href: `#/executions${qs({ flow: id })}` }, "All executions of this flow")),
      res.data.length ? executionsTable(res.data, false) : emptyState(flow.status === "active" ? "No executions yet: send a webhook or use Run now." : "No executions yet."),
    );
  };

  const refresh = async () => {
    const next = (await api("GET", `/flows/${id}`)).data;
    const changed = next.status !== flow.status || next.statusMessage !== flow.statusMessage || next.nextRunAt !== flow.nextRunAt || next.lastExecutionAt !== flow.lastExecutionAt;
    flow = next;
    if (changed) renderStatus();
    await loadExecutions();
  };

  graphBox.append(drawGraph(flow.graph));
  renderStatus();
  put(main, 
    h("p", { class: "crumbs" }, h("a", { href: "#/flows" }, "Flows"), " / "),
    h("div", { class: "page-head" }, h("h1", {}, flow.name), actions),
    statusEl,
    flow.description ? h("p", {}, flow.description) : null,
    problems,
    factsEl,
    h("section", { "aria-label": "Graph" }, h("h2", {}, "Graph"), graphBox),
    h("div", { class: "two-col" }, h("section", {}, hookBox), h("section", {}, runBox)),
    h("section", {}, execBox),
    h("section", { "aria-label": "History" }, historyBox),
  );
  await loadExecutions();
  await loadHistory(id, historyBox, () => flow, canUpdate, async () => {
    flow = (await api("GET", `/flows/${id}`)).data;
    graphBox.replaceChildren(drawGraph(flow.graph));
    renderStatus();
  });
  poll(refresh);
}

// ---------------------------------------------------------------- history (SPEC §12)

// The versioned content of a version, as the lines a diff compares.
function versionLines(v) {
  return JSON.stringify({ graph: v.graph, cron: v.cron, errorFlowId: v.errorFlowId }, null, 2).split("\n");
}

// A line diff (longest common subsequence): [[" "|"-"|"+", line], ...].
function lineDiff(a, b) {
  if (a.length * b.length > 4_000_000) return [...a.map((l) => ["-", l]), ...b.map((l) => ["+", l])];
  const n = a.length, m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (lcs[i + 1][j] >= lcs[i][j + 1]) out.push(["-", a[i++]]);
    else out.push(["+", b[j++]]);
  }
  while (i < n) out.push(["-", a[i++]]);
  while (j < m) out.push(["+", b[j++]]);
  return out;
}

async function loadHistory(id, box, currentFlow, canUpdate, reloadFlow) {
  let res;
  try {
    res = await api("GET", `/flows/${id}/versions${qs({ "page[size]": 50 })}`);
  } catch (err) {
    put(box, h("h2", {}, "History"), errorBox(err));
    return;
  }
  const versions = res.data;
  const diffOut = h("div", { "aria-live": "polite" });
  const problems = h("div", {});
  const pick = (selected) => h("select", {}, ...versions.map((v) => h("option", { value: String(v.version), selected: v.version === selected }, `Version ${v.version}`)));
  const older = pick(versions.length > 1 ? versions[1].version : versions[0]?.version);
  const newer = pick(versions[0]?.version);
  const showDiff = async () => {
    put(diffOut, );
    try {
      const [a, b] = await Promise.all([older.value, newer.value].map((n) => api("GET", `/flows/${id}/versions/${n}`)));
      const rows = lineDiff(versionLines(a.data), versionLines(b.data));
      const changedRows = rows.filter((r) => r[0] !== " ").length;
      put(diffOut,
        h("p", { class: "muted" }, changedRows ? `${changedRows} changed lines between version ${older.value} and version ${newer.value}.` : "No difference."),
        h("pre", { class: "diff mono", tabindex: 0, role: "region", "aria-label": `Differences between version ${older.value} and version ${newer.value}` }, ...rows.map(([mark, line]) => h("div", { class: mark === "+" ? "diff-add" : mark === "-" ? "diff-del" : "diff-same" }, `${mark} ${line}`))),
      );
    } catch (err) {
      put(diffOut, errorBox(err));
    }
  };
  const restore = async (n) => {
    if (!confirm(`Make a new version equal to version ${n}?`)) return;
    put(problems, );
    try {
      await api("POST", `/flows/${id}/versions/${n}/restore`);
      toast(`Version ${n} restored.`);
      await reloadFlow();
      await loadHistory(id, box, currentFlow, canUpdate, reloadFlow);
    } catch (err) {
      put(problems, errorBox(err));
    }
  };
  const editable = ["inactive", "active"].includes(currentFlow().status);
  put(box,
    h("h2", {}, "History"),
    h("p", { class: "muted" }, "A version is made by every change of the graph, the schedule or the error flow."),
    problems,
    h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Version"), h("th", {}, "Made"), h("th", {}, "By"), h("th", {}, canUpdate ? "Restore" : ""))),
      h("tbody", {}, ...versions.map((v) => h("tr", {},
        h("td", {}, `${v.version}`, v.current ? " (current)" : "", v.restoredFrom ? h("span", { class: "muted" }, ` restores ${v.restoredFrom}`) : null),
        h("td", {}, fmtTime(v.createdAt)),
        h("td", { class: "mono" }, v.author ? v.author.slice(-8) : "—"),
        h("td", {}, canUpdate && !v.current
          ? h("button", { type: "button", class: "secondary", disabled: !editable, title: editable ? "" : "Wait until the flow is active or inactive to restore a version.", onclick: () => restore(v.version) }, "Restore")
          : null),
      ))),
    ),
    res.meta.total > versions.length ? h("p", { class: "muted" }, `The newest ${versions.length} of ${res.meta.total} versions.`) : null,
    versions.length > 1
      ? h("div", { class: "actions" }, h("label", {}, "Compare ", older), h("label", {}, " with ", newer), h("button", { type: "button", class: "secondary", onclick: showDiff }, "Show diff"))
      : null,
    diffOut,
  );
}

function fact(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

// ---------------------------------------------------------------- editor

const SAMPLE_GRAPH = {
  nodes: [
    { id: "in", componentId: "webhook" },
    { id: "out", componentId: "log" },
  ],
  edges: [{ source: "in", target: "out" }],
};

async function viewEditor(id) {
  const flow = id ? (await api("GET", `/flows/${id}`)).data : null;
  setTitle(flow ? `Edit ${flow.name}` : "New flow");
  const name = h("input", { type: "text", value: flow ? flow.name : "", required: true, maxlength: 200 });
  const description = h("textarea", { rows: 2 }, flow && flow.description ? flow.description : "");
  const type = select([["ordinary", "ordinary"], ["realtime", "realtime"]], flow ? flow.type : "ordinary");
  const cron = h("input", { type: "text", value: flow && flow.cron ? flow.cron : "", placeholder: "empty: runs on webhooks", class: "mono" });
  const graph = h("textarea", { rows: 16, class: "mono", spellcheck: "false" }, fmtJson(flow ? flow.graph : SAMPLE_GRAPH));
  const general = h("div", {});
  const steps = h("div", { class: "steps-editor" });
  const components = await componentKinds();
  const credentials = await credentialChoices();
  const renderSteps = () => put(steps, stepEditors(flow, graph, components, credentials));
  graph.addEventListener("change", renderSteps);
  renderSteps();
  const visual = visualEditor(flow, graph, components, credentials);
  const controls = { name, description, type, cron, graph };
  const form = h(
    "form",
    {
      class: "card",
      novalidate: true,
      onsubmit: async (ev) => {
        ev.preventDefault();
        for (const c of Object.values(controls)) setFieldError(c, []);
        put(general, );
        let graphValue;
        try {
          graphValue = JSON.parse(graph.value);
        } catch (e) {
          setFieldError(graph, [`Not valid JSON: ${e.message}`]);
          graph.focus();
          return;
        }
        const body = { name: name.value, description: description.value || null, type: type.value, cron: cron.value.trim() || null, graph: graphValue };
        try {
          const res = flow ? await api("PATCH", `/flows/${flow.id}`, body) : await api("POST", "/flows", body);
          toast(flow ? "Flow saved." : "Flow created.");
          navigate(`/flows/${res.data.id}`);
        } catch (err) {
          const rest = [];
          const byControl = new Map();
          for (const e of err.errors || []) {
            const top = (e.field || "").split(/[.[]/)[0];
            const control = controls[top];
            if (control) {
              if (!byControl.has(control)) byControl.set(control, []);
              byControl.get(control).push(e.field === top ? e.message : problemText(e));
            } else rest.push(e);
          }
          for (const [control, messages] of byControl) setFieldError(control, messages);
          if (rest.length || !byControl.size) put(general, errorBox(rest.length ? new ApiError(err.status, rest) : err));
          const first = byControl.keys().next().value;
          if (first) first.focus();
        }
      },
    },
    field("Name", name),
    field("Description", description),
    field("Type", type),
    field("Cron", cron, "Five fields (or six with seconds first) in UTC, e.g. */5 * * * *. Empty: the flow runs on webhooks."),
    visual,
    field("Graph as JSON", graph, "The same graph as text (every change above is written here; an edit here redraws it). nodes: [{id, componentId, function?, fields?}], edges: [{source, target, on?, config?: {condition?, mapper?}}]."),
    steps,
    general,
    h("div", { class: "actions" }, h("button", { type: "submit" }, flow ? "Save" : "Create flow"), h("a", { class: "button secondary", href: flow ? `#/flows/${flow.id}` : "#/flows" }, "Cancel")),
  );
  const history = flow ? h("p", { class: "muted" }, `Version ${flow.version}${flow.status === "active" ? " · active: a save applies to executions accepted afterwards" : ""} · the history is under the form`) : null;
  // SPEC §12: the flow's versions under the editor (diff any two; Restore reloads the editor).
  const historyBox = h("div", {});
  put(main, h("p", { class: "crumbs" }, h("a", { href: "#/flows" }, "Flows"), " / "), h("h1", {}, flow ? `Edit ${flow.name}` : "New flow"), history, form, flow ? h("section", { class: "card", "aria-label": "History" }, historyBox) : null);
  name.focus();
  if (flow) {
    await loadHistory(flow.id, historyBox, () => flow, hasPermission("tenant.flows.update"), async () => {
      await viewEditor(flow.id);
    });
  }
}

// ---------------------------------------------------------------- the visual editor
// A palette from GET /components, the graph drawn by dagre (auto-layout: positions are not part
// of a flow), steps added by a click or by dragging from the palette onto the canvas, edges by
// dragging from a step's port onto another step (or "Connect to" in the form), a form per step
// generated from its component's JSON schema, edges edited in place with a preview on a sample
// message, undo/redo and keyboard shortcuts. The JSON below stays the source of truth: every
// change is written into it, and an edit of the JSON redraws the canvas.

function flatNodes(graph) {
  const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
  return nodes.length && Array.isArray(nodes[0]) ? nodes.flat() : nodes;
}

function readGraph(area) {
  try {
    const g = JSON.parse(area.value);
    if (!g || typeof g !== "object" || Array.isArray(g)) return null;
    return { ...g, nodes: flatNodes(g).filter((n) => n && typeof n === "object"), edges: Array.isArray(g.edges) ? g.edges.filter((e) => e && typeof e === "object") : [] };
  } catch {
    return null;
  }
}

// The property's own schema (Optional[X] is anyOf [X, null]; $ref into $defs).
function schemaOf(prop, root) {
  let p = prop || {};
  if (p.$ref && root && root.$defs) p = root.$defs[p.$ref.split("/").pop()] || {};
  if (Array.isArray(p.anyOf)) {
    const real = p.anyOf.filter((x) => x.type !== "null");
    if (real.length === 1) p = { ...real[0], description: p.description, default: p.default, title: p.title };
  }
  return p;
}

// JSONata for the preview of an edge: a condition as its boolean, a mapper (an object whose
// leaves are JSONata) as the object constructor it stands for.
function mapperExpression(m) {
  if (typeof m === "string") return `(${m})`;
  if (Array.isArray(m)) return `[${m.map(mapperExpression).join(", ")}]`;
  if (m && typeof m === "object") return `{${Object.entries(m).map(([k, v]) => `${JSON.stringify(k)}: ${mapperExpression(v)}`).join(", ")}}`;
  return JSON.stringify(m);
}

function visualEditor(flow, graphArea, components, credentials) {
  let graph = readGraph(graphArea) || { nodes: [], edges: [] };
  let selected = null; // {node: id} or {edge: index}
  const undo = [];
  const redo = [];
  const canvasBox = h("div", { class: "graph-box canvas-box" });
  const inspector = h("div", { class: "inspector" });
  const status = h("p", { class: "visually-hidden", role: "status" });

  const write = () => {
    graphArea.value = fmtJson(graph);
    graphArea.dispatchEvent(new Event("change"));
  };
  const commit = (mutate, said) => {
    const before = JSON.stringify(graph);
    const next = JSON.parse(before);
    mutate(next);
    if (JSON.stringify(next) === before) return;
    undo.push(before);
    if (undo.length > 200) undo.shift();
    redo.length = 0;
    graph = next;
    write();
    render();
    if (said) status.textContent = said;
  };
  const travel = (from, to, said) => {
    if (!from.length) return;
    to.push(JSON.stringify(graph));
    graph = JSON.parse(from.pop());
    if (selected && selected.node && !graph.nodes.some((n) => n.id === selected.node)) selected = null;
    if (selected && selected.edge !== undefined && !graph.edges[selected.edge]) selected = null;
    write();
    render();
    status.textContent = said;
  };
  const undoIt = () => travel(undo, redo, "Undone.");
  const redoIt = () => travel(redo, undo, "Redone.");
  // Typing in the JSON redraws as soon as the text parses (not on blur: a redraw there would
  // move the page under the pointer that is pressing Save).
  const fromText = () => {
    const typed = readGraph(graphArea);
    if (!typed || JSON.stringify(typed) === JSON.stringify(graph)) return;
    undo.push(JSON.stringify(graph));
    redo.length = 0;
    graph = typed;
    render();
  };
  graphArea.addEventListener("input", fromText);
  graphArea.addEventListener("change", fromText);

  const nodeById = (g, id) => g.nodes.find((n) => n.id === id);
  const freshId = (base) => {
    const stem = (base || "step").replace(/[^A-Za-z0-9_-]/g, "").slice(0, 40) || "step";
    if (!graph.nodes.some((n) => n.id === stem)) return stem;
    for (let i = 2; ; i++) if (!graph.nodes.some((n) => n.id === `${stem}-${i}`)) return `${stem}-${i}`;
  };
  const addNode = (componentId) => {
    const id = freshId(componentId);
    const from = selected && selected.node && nodeById(graph, selected.node) ? selected.node : null;
    const comp = components.get(componentId);
    commit((g) => {
      g.nodes.push({ id, componentId });
      // Added while a step is selected: connected after it, as the next step.
      if (from && !(comp && comp.trigger)) g.edges.push({ source: from, target: id });
    }, `Step ${id} added${from ? ` after ${from}` : ""}.`);
    selected = { node: id };
    render();
    focusNode(id);
  };
  const addEdge = (source, target) => {
    if (!source || !target || source === target) return;
    if (graph.edges.some((e) => e.source === source && e.target === target && !e.on)) return;
    commit((g) => g.edges.push({ source, target }), `Edge ${source} to ${target} added.`);
    selected = { edge: graph.edges.length - 1 };
    render();
  };
  const removeSelected = () => {
    if (!selected) return;
    if (selected.node) {
      const id = selected.node;
      selected = null;
      commit((g) => {
        g.nodes = g.nodes.filter((n) => n.id !== id);
        g.edges = g.edges.filter((e) => e.source !== id && e.target !== id);
      }, `Step ${id} deleted.`);
    } else {
      const i = selected.edge;
      selected = null;
      commit((g) => g.edges.splice(i, 1), "Edge deleted.");
    }
  };
  const focusNode = (id) => {
    const el = canvasBox.querySelector(`g[data-node="${CSS.escape(id)}"]`);
    if (el) el.focus();
  };

  // -- the palette: grouped, searchable; a click adds, a drag onto the canvas adds.
  const search = h("input", { type: "search", placeholder: "Search components", class: "palette-search" });
  const list = h("div", { class: "palette-list" });
  let drag = null;
  const renderPalette = () => {
    const q = search.value.trim().toLowerCase();
    const all = [...components.values()].filter((c) => !q || c.id.includes(q) || (c.description || "").toLowerCase().includes(q));
    const groups = [["Triggers", all.filter((c) => c.trigger || c.id === "webhook")], ["Steps", all.filter((c) => !(c.trigger || c.id === "webhook"))]];
    put(list, groups.filter(([, items]) => items.length).map(([title, items]) => h("div", { class: "palette-group" },
      h("h3", {}, title),
      h("ul", {}, items.map((c) => h("li", {}, h("button", {
        type: "button",
        class: "palette-item secondary",
        "data-component": c.id,
        title: c.description,
        "aria-label": `Add ${c.id}: ${c.description}`,
        onpointerdown: (ev) => { drag = { componentId: c.id, x: ev.clientX, y: ev.clientY, moved: false }; },
        onclick: () => {
          if (drag && drag.moved) { drag = null; return; }
          drag = null;
          addNode(c.id);
        },
      }, c.id)))),
    )), all.length ? null : h("p", { class: "muted" }, "No component matches."));
  };
  search.addEventListener("input", renderPalette);
  renderPalette();

  // -- dragging: a palette item onto the canvas, or a port onto a step.
  let wire = null; // {source, path}
  const svgPoint = (svg, ev) => {
    const pt = svg.createSVGPoint();
    pt.x = ev.clientX;
    pt.y = ev.clientY;
    return pt.matrixTransform(svg.getScreenCTM().inverse());
  };
  const onMove = (ev) => {
    if (drag && Math.hypot(ev.clientX - drag.x, ev.clientY - drag.y) > 6) {
      drag.moved = true;
      canvasBox.classList.add("drop-target");
    }
    if (wire) {
      const p = svgPoint(wire.svg, ev);
      wire.path.setAttribute("d", `M${wire.x},${wire.y} L${p.x.toFixed(1)},${p.y.toFixed(1)}`);
    }
  };
  const onUp = (ev) => {
    canvasBox.classList.remove("drop-target");
    const under = document.elementFromPoint(ev.clientX, ev.clientY);
    if (drag && drag.moved) {
      const componentId = drag.componentId;
      if (under && canvasBox.contains(under)) {
        const target = under.closest("g[data-node]");
        if (target) selected = { node: target.getAttribute("data-node") };
        addNode(componentId);
      }
      setTimeout(() => { drag = null; }, 0); // the click that follows the drag is not another add
    } else drag = null;
    if (wire) {
      const target = under && under.closest && under.closest("g[data-node]");
      const source = wire.source;
      wire.path.remove();
      wire = null;
      if (target) addEdge(source, target.getAttribute("data-node"));
    }
  };
  document.addEventListener("pointermove", onMove);
  document.addEventListener("pointerup", onUp);
  onLeave(() => {
    document.removeEventListener("pointermove", onMove);
    document.removeEventListener("pointerup", onUp);
  });

  // -- the canvas
  const s = svgEl;
  const drawCanvas = () => {
    if (!graph.nodes.length) {
      put(canvasBox, h("p", { class: "muted canvas-empty" }, "Drag a component here, or click one in the palette."));
      return;
    }
    const g = new window.dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "LR", nodesep: 30, ranksep: 90, marginx: 20, marginy: 20 });
    g.setDefaultEdgeLabel(() => ({}));
    const ids = new Set(graph.nodes.map((n) => n.id));
    for (const n of graph.nodes) {
      const label = String(n.name || n.id);
      const sub = n.componentId ? `${n.componentId}${n.function ? `.${n.function}` : ""}` : "pass-through";
      g.setNode(String(n.id), { label, sub, width: Math.max(130, 8 * Math.max(label.length, sub.length) + 34), height: 54 });
    }
    graph.edges.forEach((e, i) => {
      if (!ids.has(e.source) || !ids.has(e.target)) return;
      const cfg = e.config || {};
      const parts = [];
      if (e.on === "failure") parts.push("on failure");
      if (cfg.condition) parts.push(`if ${cfg.condition}`);
      if (cfg.mapper) parts.push("map");
      const label = parts.join(" · ");
      g.setEdge(e.source, e.target, { index: i, label, width: label ? Math.min(200, 7 * label.length) : 0, height: label ? 18 : 0, labelpos: "c" }, `e${i}`);
    });
    window.dagre.layout(g);
    const svg = graphSvg(g.graph(), "canvas-arrow", { class: "graph canvas", role: "group", "aria-label": `Canvas: ${graph.nodes.length} steps, ${graph.edges.length} edges` });
    for (const e of g.edges()) {
      const edge = g.edge(e);
      const d = edge.points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      const raw = graph.edges[edge.index];
      const isSel = selected && selected.edge === edge.index;
      const cls = `edge${raw.on === "failure" ? " edge-failure" : edge.label ? " edge-config" : ""}${isSel ? " selected" : ""}`;
      const grp = s("g", { class: "canvas-edge", "data-edge": edge.index });
      grp.append(s("path", { d, class: cls, "marker-end": "url(#canvas-arrow)" }));
      const hit = s("path", { d, class: "edge-hit" });
      grp.append(hit);
      grp.addEventListener("click", () => { selected = { edge: edge.index }; render(); });
      if (edge.label) {
        const text = edge.label.length > 30 ? `${edge.label.slice(0, 29)}…` : edge.label;
        grp.append(s("text", { x: edge.x, y: edge.y + 4, class: "edge-label", "text-anchor": "middle" }, text));
      }
      svg.append(grp);
    }
    for (const id of g.nodes()) {
      const n = g.node(id);
      const raw = nodeById(graph, id);
      const isSel = selected && selected.node === id;
      const grp = s("g", {
        class: `node${isSel ? " selected" : ""}`,
        transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})`,
        "data-node": id,
        tabindex: "0",
        role: "button",
        "aria-pressed": isSel ? "true" : "false",
        "aria-label": `Step ${id}, ${raw && raw.componentId ? raw.componentId : "pass-through"}`,
      });
      grp.append(s("rect", { width: n.width, height: n.height, rx: 8 }));
      grp.append(s("text", { x: n.width / 2 - 6, y: 23, "text-anchor": "middle", class: "node-label" }, n.label));
      grp.append(s("text", { x: n.width / 2 - 6, y: 41, "text-anchor": "middle", class: "node-sub" }, n.sub));
      const port = s("circle", { cx: n.width, cy: n.height / 2, r: 8, class: "port", "data-port": id });
      port.append(s("title", {}, `Drag from here onto a step to connect ${id} to it`));
      port.addEventListener("pointerdown", (ev) => {
        ev.preventDefault();
        ev.stopPropagation();
        const x = n.x + n.width / 2;
        const y = n.y;
        const path = s("path", { d: `M${x},${y} L${x},${y}`, class: "edge wire" });
        svg.append(path);
        wire = { source: id, path, svg, x, y };
      });
      grp.append(port);
      const pick = () => { selected = { node: id }; render(); focusNode(id); };
      grp.addEventListener("click", pick);
      grp.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(); }
      });
      svg.append(grp);
    }
    put(canvasBox, svg);
  };

  // -- the inspector: a form for the selected step or edge.
  const jsonArea = (value, rows) => h("textarea", { rows: rows || 3, class: "json-input", spellcheck: "false" }, value === undefined ? "" : fmtJson(value));
  const nodeForm = (node) => {
    const comp = components.get(node.componentId);
    const parts = [h("h3", {}, `Step ${node.id}`), h("p", { class: "muted" }, comp ? comp.description : node.componentId ? `${node.componentId} (not installed)` : "pass-through: forwards its message")];
    const idInput = h("input", { type: "text", value: node.id, maxlength: 64, class: "mono" });
    idInput.addEventListener("change", () => {
      const next = idInput.value.trim();
      if (!next || next === node.id) return;
      if (graph.nodes.some((n) => n.id === next)) { setFieldError(idInput, [`Another step is called ${next}.`]); return; }
      const old = node.id;
      selected = { node: next };
      commit((g) => {
        nodeById(g, old).id = next;
        for (const e of g.edges) {
          if (e.source === old) e.source = next;
          if (e.target === old) e.target = next;
        }
      }, `Step ${old} renamed ${next}.`);
    });
    parts.push(field("Step id", idInput));
    const nameInput = h("input", { type: "text", value: node.name || "" });
    nameInput.addEventListener("change", () => commit((g) => {
      const t = nodeById(g, node.id);
      if (nameInput.value.trim()) t.name = nameInput.value.trim();
      else delete t.name;
    }));
    parts.push(field("Display name", nameInput));
    if (comp && comp.functions.length > 1) {
      const fn = select(comp.functions.map((f) => [f.name, f.default ? `${f.name} (default)` : f.name]), node.function || (comp.functions.find((f) => f.default) || {}).name);
      fn.addEventListener("change", () => commit((g) => { nodeById(g, node.id).function = fn.value; }));
      parts.push(field("Function", fn));
    }
    const schema = comp ? comp.fields || {} : {};
    const props = schema.properties || {};
    const required = new Set(schema.required || []);
    const values = node.fields || {};
    for (const [name, raw] of Object.entries(props)) {
      if (node.componentId === "code" && name === "source") continue; // its own editor, under Steps
      const p = schemaOf(raw, schema);
      const label = `${p.title || name}${required.has(name) ? " (required)" : ""}`;
      const setField = (value) => commit((g) => {
        const t = nodeById(g, node.id);
        t.fields = { ...(t.fields || {}) };
        if (value === undefined) delete t.fields[name];
        else t.fields[name] = value;
        if (!Object.keys(t.fields).length) delete t.fields;
      });
      let control;
      const current = values[name];
      if (Array.isArray(p.enum)) {
        control = select([["", "(default)"], ...p.enum.map((v) => [String(v), String(v)])], current === undefined ? "" : String(current));
        control.addEventListener("change", () => setField(control.value === "" ? undefined : p.enum.find((v) => String(v) === control.value)));
      } else if (p.type === "boolean") {
        control = select([["", `(default${p.default !== undefined ? `: ${p.default}` : ""})`], ["true", "true"], ["false", "false"]], current === undefined ? "" : String(current));
        control.addEventListener("change", () => setField(control.value === "" ? undefined : control.value === "true"));
      } else if (p.type === "integer" || p.type === "number") {
        control = h("input", { type: "number", step: p.type === "integer" ? "1" : "any", value: current === undefined ? "" : String(current), placeholder: p.default !== undefined ? String(p.default) : "" });
        control.addEventListener("change", () => setField(control.value === "" ? undefined : Number(control.value)));
      } else if (p.type === "string") {
        // Long texts (an SQL statement, a message body) get a text area, short ones a line.
        const long = (p.maxLength || 0) >= 10000;
        const shown = current === undefined ? "" : String(current);
        const hint = p.default !== undefined && p.default !== null ? String(p.default) : "";
        control = long ? h("textarea", { rows: 3, class: "json-input", spellcheck: "false", placeholder: hint }, shown) : h("input", { type: "text", value: shown, placeholder: hint });
        control.addEventListener("change", () => setField(control.value === "" ? undefined : control.value));
      } else {
        control = jsonArea(current);
        control.addEventListener("change", () => {
          if (!control.value.trim()) { setFieldError(control, []); setField(undefined); return; }
          try {
            const v = JSON.parse(control.value);
            setFieldError(control, []);
            setField(v);
          } catch (e) {
            setFieldError(control, [`Not valid JSON: ${e.message}`]);
          }
        });
      }
      parts.push(field(label, control, p.description));
    }
    if (credentials && WITH_CREDENTIALS.has(node.componentId)) {
      parts.push(credentialPicker(node, credentials, (id) => commit((g) => {
        const t = nodeById(g, node.id);
        if (id) t.credentials_id = id;
        else delete t.credentials_id;
      })));
    }
    if (comp && !comp.trigger && node.componentId !== "webhook") {
      // SPEC §11: the step's retry policy; empty fields take the defaults.
      const retry = node.retry || {};
      const RETRY = [
        ["maxAttempts", "Attempts", "1 (no retry) to 20", "1"],
        ["initialInterval", "First wait (s)", "seconds before the second attempt", "1"],
        ["backoff", "Backoff", "each wait is this many times the one before (≥ 1)", "2"],
        ["maxInterval", "Longest wait (s)", "no wait is longer", "300"],
      ];
      const inputs = RETRY.map(([key, label, help, dflt]) => {
        const input = h("input", { type: "number", step: "any", min: key === "maxAttempts" ? "1" : "0", value: retry[key] === undefined ? "" : String(retry[key]), placeholder: dflt });
        input.addEventListener("change", () => commit((g) => {
          const t = nodeById(g, node.id);
          const next = { ...(t.retry || {}) };
          if (input.value === "") delete next[key];
          else next[key] = Number(input.value);
          if (Object.keys(next).length) t.retry = next;
          else delete t.retry;
        }));
        return field(label, input, help);
      });
      parts.push(h("details", { class: "retry-form", open: Boolean(node.retry) }, h("summary", {}, "Retry on failure"), h("div", { class: "retry-grid" }, inputs)));
    }
    const others = graph.nodes.filter((n) => n.id !== node.id);
    if (others.length) {
      const to = select(others.map((n) => [n.id, n.id]), others[0].id);
      parts.push(h("div", { class: "connect" }, field("Connect to", to), h("button", { type: "button", class: "secondary", onclick: () => addEdge(node.id, to.value) }, "Add edge")));
    }
    const out = graph.edges.map((e, i) => [e, i]).filter(([e]) => e.source === node.id || e.target === node.id);
    if (out.length) {
      parts.push(h("h4", {}, "Edges"), h("ul", { class: "edge-list" }, out.map(([e, i]) => h("li", {}, h("button", { type: "button", class: "secondary small", onclick: () => { selected = { edge: i }; render(); } }, `${e.source} → ${e.target}${e.on === "failure" ? " (on failure)" : ""}`)))));
    }
    parts.push(h("div", { class: "actions" }, h("button", { type: "button", class: "danger", onclick: removeSelected }, `Delete step ${node.id}`)));
    return parts;
  };
  const edgeForm = (edge, index) => {
    const cfg = edge.config || {};
    const parts = [h("h3", {}, `Edge ${edge.source} → ${edge.target}`)];
    const on = select([["", "success (the message goes on)"], ["failure", "failure (the source step failed)"]], edge.on === "failure" ? "failure" : "");
    on.addEventListener("change", () => commit((g) => {
      if (on.value) g.edges[index].on = "failure";
      else delete g.edges[index].on;
    }));
    parts.push(field("Runs on", on, "A failure edge takes the failed step's error and input (SPEC §11)."));
    const cond = h("input", { type: "text", value: cfg.condition || "", class: "mono", placeholder: "e.g. total > 100" });
    const mapper = jsonArea(cfg.mapper, 3);
    const setConfig = (key, value) => commit((g) => {
      const t = g.edges[index];
      t.config = { ...(t.config || {}) };
      if (value === undefined) delete t.config[key];
      else t.config[key] = value;
      if (!Object.keys(t.config).length) delete t.config;
    });
    cond.addEventListener("change", () => setConfig("condition", cond.value.trim() || undefined));
    mapper.addEventListener("change", () => {
      if (!mapper.value.trim()) { setFieldError(mapper, []); setConfig("mapper", undefined); return; }
      try {
        const v = JSON.parse(mapper.value);
        if (!v || typeof v !== "object" || Array.isArray(v)) throw new Error("a mapper is an object");
        setFieldError(mapper, []);
        setConfig("mapper", v);
      } catch (e) {
        setFieldError(mapper, [`Not a JSON object: ${e.message}`]);
      }
    });
    parts.push(field("Condition (JSONata)", cond, "The message takes this edge only when it is true."));
    parts.push(field("Mapper (JSON object of JSONata)", mapper, "Reshapes the message on the way, e.g. {\"id\": \"order.id\"}."));
    const sample = jsonArea({}, 3);
    const result = h("div", { class: "trial-result", "aria-live": "polite" });
    const preview = async () => {
      let data;
      try {
        data = JSON.parse(sample.value || "{}");
        setFieldError(sample, []);
      } catch (e) {
        setFieldError(sample, [`Not valid JSON: ${e.message}`]);
        return;
      }
      const shown = [];
      const run = async (what, expression) => {
        try {
          const res = await api("POST", `/flows/${flow.id}/test-step`, { node: { id: "preview", componentId: "jsonata", fields: { expression } }, data });
          const x = res.data;
          const value = Array.isArray(x.output) && x.output.length === 1 ? x.output[0] : x.output;
          shown.push(h("p", {}, h("strong", {}, `${what}: `), x.status === "succeeded" ? h("code", {}, JSON.stringify(value)) : x.error));
        } catch (err) {
          shown.push(h("p", {}, h("strong", {}, `${what}: `), problemText((err.errors || [{ message: String(err) }])[0])));
        }
      };
      if (cond.value.trim()) await run("Condition", `$boolean((${cond.value.trim()}))`);
      let m = null;
      try { m = mapper.value.trim() ? JSON.parse(mapper.value) : null; } catch { m = null; }
      if (m) await run("Mapped message", mapperExpression(m));
      if (!shown.length) shown.push(h("p", { class: "muted" }, "No condition or mapper to preview."));
      put(result, shown);
    };
    // The sample may come from a past execution: what the edge's source step emitted there.
    const past = select([["", "choose an execution"]], "");
    const pastBox = h("div", {});
    const loadPast = async () => {
      try {
        const res = await api("GET", `/executions${qs({ "filter[flowId]": flow.id, "page[size]": 10 })}`);
        if (!res.data.length) return;
        put(past, [["", "choose an execution"], ...res.data.map((e) => [e.id, `${fmtTime(e.createdAt)} · ${e.status} · ${e.id.slice(-8)}`])].map(([v, label]) => h("option", { value: v }, label)));
        put(pastBox, field(`Sample from a past execution (the output of ${edge.source})`, past));
      } catch {
        /* no executions readable: the sample is typed */
      }
    };
    past.addEventListener("change", async () => {
      if (!past.value) return;
      try {
        const e = (await api("GET", `/executions/${past.value}`)).data;
        const src = (e.steps || []).find((st) => st.nodeId === edge.source);
        const out = src && Array.isArray(src.output) && src.output.length ? src.output[0] : null;
        if (out === null) {
          setFieldError(past, [`${edge.source} emitted nothing in that execution.`]);
          return;
        }
        setFieldError(past, []);
        sample.value = fmtJson(out);
        sample.dispatchEvent(new Event("change"));
      } catch (err) {
        setFieldError(past, [problemText((err.errors || [{ message: String(err) }])[0])]);
      }
    });
    if (flow) {
      loadPast();
      // Live: the preview runs again whenever the condition, the mapper or the sample changes.
      for (const control of [cond, mapper, sample]) control.addEventListener("change", () => { if (cond.value.trim() || mapper.value.trim()) preview(); });
      parts.push(pastBox, field("Sample message (JSON)", sample, "Previewed in a runner as the engine would; nothing is stored."), h("div", { class: "actions" }, h("button", { type: "button", class: "secondary", onclick: preview }, "Preview")), result);
    } else parts.push(h("p", { class: "help" }, "Create the flow to preview conditions and mappers."));
    parts.push(h("div", { class: "actions" }, h("button", { type: "button", class: "danger", onclick: removeSelected }, "Delete edge")));
    return parts;
  };
  const renderInspector = () => {
    if (selected && selected.node) {
      const node = nodeById(graph, selected.node);
      if (node) return put(inspector, nodeForm(node));
    }
    if (selected && selected.edge !== undefined && graph.edges[selected.edge]) return put(inspector, edgeForm(graph.edges[selected.edge], selected.edge));
    put(inspector, h("p", { class: "muted" }, "Select a step or an edge to edit it. Keys: Enter selects, Delete removes, Ctrl+Z undoes, Ctrl+Shift+Z redoes, Escape clears the selection."));
  };
  const render = () => {
    drawCanvas();
    renderInspector();
    undoButton.disabled = !undo.length;
    redoButton.disabled = !redo.length;
  };
  const undoButton = h("button", { type: "button", class: "secondary", onclick: undoIt, "aria-keyshortcuts": "Control+Z" }, "Undo");
  const redoButton = h("button", { type: "button", class: "secondary", onclick: redoIt, "aria-keyshortcuts": "Control+Shift+Z" }, "Redo");
  const box = h(
    "section",
    { class: "card visual-editor", "aria-labelledby": "visual-title" },
    h("div", { class: "section-head" }, h("h2", { id: "visual-title" }, "Graph"), h("div", { class: "actions" }, undoButton, redoButton)),
    h("div", { class: "visual-grid" },
      h("div", { class: "palette", role: "region", "aria-label": "Components" }, field("Components", search), list),
      h("div", { class: "canvas-col" }, canvasBox, inspector),
    ),
    status,
  );
  // On the document while the editor is shown: a click that rebuilt the form leaves the focus on
  // the page's body, and the shortcuts still work there.
  const onKey = (ev) => {
    if (!box.isConnected || !(box.contains(ev.target) || ev.target === document.body)) return;
    const typing = ev.target.closest && ev.target.closest("input, textarea, select");
    const mod = ev.ctrlKey || ev.metaKey;
    if (mod && !typing && (ev.key === "z" || ev.key === "Z")) {
      ev.preventDefault();
      if (ev.shiftKey) redoIt();
      else undoIt();
    } else if (mod && !typing && ev.key === "y") {
      ev.preventDefault();
      redoIt();
    } else if (!typing && (ev.key === "Delete" || ev.key === "Backspace") && selected) {
      ev.preventDefault();
      removeSelected();
    } else if (!typing && ev.key === "Escape" && selected) {
      selected = null;
      render();
    }
  };
  document.addEventListener("keydown", onKey);
  onLeave(() => document.removeEventListener("keydown", onKey));
  render();
  return box;
}

// A code step's source is edited here, not as a string inside the graph's JSON, and any step
// but a trigger can be run alone on a sample message (POST /flows/{id}/test-step, in a runner).
let componentCache = null;
async function componentKinds() {
  if (!componentCache) {
    try {
      const res = await api("GET", "/components");
      componentCache = new Map(res.data.map((c) => [c.id, c]));
    } catch {
      componentCache = new Map();
    }
  }
  return componentCache;
}

const NOT_ALONE = new Set(["delay", "join", "flow"]);

// Components that take credentials (credentials_id names a stored secret).
const WITH_CREDENTIALS = new Set(["http", "sql", "amqp", "mqtt", "redis", "email"]);

async function credentialChoices() {
  if (!hasPermission("iam.secret.read")) return null;
  try {
    return (await api("GET", `/secrets${qs({ "page[size]": 100 })}`)).data;
  } catch {
    return null;
  }
}

function credentialPicker(node, credentials, onPick) {
  const current = node.credentials_id || "";
  const options = [["", "none"], ...credentials.map((c) => [c.id, `${c.name} (${c.id.slice(0, 8)}…)`])];
  if (current && !credentials.some((c) => c.id === current)) options.push([current, `${current} (not listed: another owner's, or deleted)`]);
  const picker = select(options, current);
  picker.addEventListener("change", () => onPick(picker.value || null));
  return field(`Credentials of step ${node.id}`, picker, "Stored under Administration → Credentials; the step gets them as its credentials.");
}

function stepEditors(flow, graphArea, components, credentials) {
  let graph;
  try {
    graph = JSON.parse(graphArea.value);
  } catch {
    return null;
  }
  const nodes = Array.isArray(graph && graph.nodes) ? graph.nodes.filter((n) => n && typeof n === "object") : [];
  const editable = nodes.filter((n) => {
    const c = components.get(n.componentId);
    return n.componentId === "code" || (c && !c.trigger && !NOT_ALONE.has(n.componentId));
  });
  const pickCredentials = (node, id) => {
    let current;
    try {
      current = JSON.parse(graphArea.value);
    } catch {
      return;
    }
    const target = (current.nodes || []).find((n) => n && n.id === node.id);
    if (!target) return;
    if (id) target.credentials_id = id;
    else delete target.credentials_id;
    graphArea.value = fmtJson(current);
  };
  if (!editable.length) return null;
  const writeBack = (node, source) => {
    let current;
    try {
      current = JSON.parse(graphArea.value);
    } catch {
      return;
    }
    const target = (current.nodes || []).find((n) => n && n.id === node.id);
    if (!target) return;
    target.fields = { ...(target.fields || {}), source };
    graphArea.value = fmtJson(current);
  };
  return h(
    "section",
    { class: "card", "aria-labelledby": "steps-title" },
    h("h2", { id: "steps-title" }, "Steps"),
    editable.map((node) => stepEditor(flow, node, writeBack, graphArea, credentials && WITH_CREDENTIALS.has(node.componentId) ? credentialPicker(node, credentials, (id) => pickCredentials(node, id)) : null)),
  );
}

function stepEditor(flow, node, writeBack, graphArea, picker) {
  const parts = [picker];
  if (node.componentId === "code") {
    const source = (node.fields && typeof node.fields.source === "string") ? node.fields.source : "function main(data, ctx) {\n  return data;\n}\n";
    parts.push(codeEditor(`Code of step ${node.id}`, source, (value) => writeBack(node, value)));
  }
  const sample = h("textarea", { rows: 3, class: "mono", spellcheck: "false" }, "{}");
  const result = h("div", { class: "trial-result", "aria-live": "polite" });
  const run = async () => {
    let data;
    try {
      data = JSON.parse(sample.value || "{}");
    } catch (e) {
      setFieldError(sample, [`Not valid JSON: ${e.message}`]);
      sample.focus();
      return;
    }
    setFieldError(sample, []);
    let current = node;
    try {
      current = (JSON.parse(graphArea.value).nodes || []).find((n) => n && n.id === node.id) || node;
    } catch {
      /* the graph does not parse: test what was drawn */
    }
    put(result, h("p", { class: "muted" }, "Running…"));
    try {
      const res = await api("POST", `/flows/${flow.id}/test-step`, { node: current, data });
      put(result, trialOutcome(res.data));
    } catch (err) {
      put(result, errorBox(err));
    }
  };
  if (flow) {
    parts.push(
      field(`Sample message for step ${node.id} (JSON)`, sample, "The data the step receives; run in a runner like an execution, nothing is stored."),
      h("div", { class: "actions" }, h("button", { type: "button", class: "secondary", onclick: run }, `Test step ${node.id}`)),
      result,
    );
  } else {
    parts.push(h("p", { class: "help" }, "Create the flow to test its steps."));
  }
  return h("details", { class: "step-editor", open: node.componentId === "code" || Boolean(picker) }, h("summary", {}, `${node.id} (${node.componentId || "no component"})`), parts);
}

function trialOutcome(x) {
  const ok = x.status === "succeeded";
  return h(
    "div",
    { class: ok ? "trial ok" : "trial failed" },
    h("p", {}, h("strong", {}, ok ? "Succeeded" : "Failed"), ` in ${Number(x.durationMs).toFixed(1)} ms, ${x.messagesOut} message(s) out`),
    x.error ? h("pre", { class: "error-text" }, x.error) : null,
    ok ? h("pre", { class: "mono" }, fmtJson(x.output)) : null,
    x.logs && x.logs.length ? h("ul", { class: "trial-logs" }, x.logs.map((e) => h("li", {}, `${e.level}: ${e.message}`))) : null,
  );
}

// A textarea over its own highlighted copy (highlight.js, shipped in vendor/): the textarea is
// the control (label, keyboard, screen readers), the copy underneath only colours it.
function codeEditor(label, value, onChange) {
  const area = h("textarea", { class: "code-input", spellcheck: "false", autocapitalize: "off", autocomplete: "off", wrap: "off", rows: 10 }, value);
  const code = h("code", { class: "language-javascript" });
  const pre = h("pre", { class: "code-view", "aria-hidden": "true" }, code);
  let escaped = false;
  const paint = () => {
    const text = area.value.endsWith("\n") ? `${area.value} ` : `${area.value}\n`;
    if (window.hljs) code.innerHTML = window.hljs.highlight(text, { language: "javascript", ignoreIllegals: true }).value;
    else code.textContent = text;
  };
  area.addEventListener("input", () => {
    paint();
    onChange(area.value);
  });
  area.addEventListener("scroll", () => {
    pre.scrollTop = area.scrollTop;
    pre.scrollLeft = area.scrollLeft;
  });
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") {
      escaped = true;
      return;
    }
    if (ev.key === "Tab" && !ev.shiftKey && !escaped) {
      ev.preventDefault();
      area.setRangeText("  ", area.selectionStart, area.selectionEnd, "end");
      area.dispatchEvent(new Event("input"));
    }
    escaped = false;
  });
  paint();
  const wrapper = field(label, area, "JavaScript: function main(data, ctx) returns the message (an array: one message each). Tab indents; Esc then Tab leaves the editor.");
  const box = h("div", { class: "code-editor" });
  wrapper.replaceChild(box, area);
  box.append(pre, area);
  return wrapper;
}

// ---------------------------------------------------------------- executions

async function viewExecutions(_m, query) {
  setTitle("Executions");
  const state = { flow: query.get("flow") || "", status: query.get("status") || "", page: Number(query.get("page") || 1) };
  const flows = await api("GET", `/flows${qs({ "page[size]": 200, sort: "name" })}`);
  const flowSel = select([["", "Every flow"], ...flows.data.map((f) => [f.id, f.name])], state.flow);
  if (state.flow && !flows.data.some((f) => f.id === state.flow)) flowSel.append(h("option", { value: state.flow, selected: true }, state.flow));
  const statusSel = select([["", "Any status"], ...EXEC_STATUSES.map((s) => [s, s])], state.status);
  const apply = (page) => navigate("/executions", { flow: flowSel.value, status: statusSel.value, page: page > 1 ? page : "" });
  flowSel.addEventListener("change", () => apply(1));
  statusSel.addEventListener("change", () => apply(1));
  const body = h("div", { "aria-live": "polite" });
  put(main, h("h1", {}, "Executions"), h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() }, field("Flow", flowSel), field("Status", statusSel)), body);
  const load = async () => {
    const res = await api("GET", `/executions${qs({ "filter[flowId]": state.flow, "filter[status]": state.status, "page[size]": 20, "page[number]": state.page })}`);
    if (!changed(body, res)) return;
    put(body, 
      res.data.length ? executionsTable(res.data, true, new Map(flows.data.map((f) => [f.id, f.name]))) : emptyState("No executions here yet. They appear when an active flow receives a webhook, a cron tick or a manual run."),
      res.data.length ? pager(res.meta, apply) : null,
    );
  };
  await load();
  poll(load);
}

// Flow names for tables and facts that hold flow ids: one list request, reused for a few seconds.
let flowNamesCache = null;
async function flowNames() {
  if (!flowNamesCache || Date.now() - flowNamesCache.at > 5000) {
    const res = await api("GET", `/flows${qs({ "page[size]": 200, sort: "name" })}`);
    flowNamesCache = { at: Date.now(), names: new Map(res.data.map((f) => [f.id, f.name])) };
  }
  return flowNamesCache.names;
}

function flowLink(id, names) {
  const name = names && names.get(id);
  return name
    ? h("a", { href: `#/flows/${id}`, title: id, class: "flow-name" }, name)
    : h("a", { href: `#/flows/${id}`, class: "mono", title: id }, id.slice(-8));
}

function logScope(tenant, user) {
  return tenant || user || (session.me && (session.me.tenant || session.me.id));
}

async function viewExecution(id) {
  setTitle("Execution");
  const box = h("div", {});
  put(main, h("p", { class: "crumbs" }, h("a", { href: "#/executions" }, "Executions"), " / "), h("h1", {}, "Execution ", h("span", { class: "mono" }, id)), box);
  let last = "";
  let ranGraph;  // the graph of the version the execution ran (null: not readable)
  const load = async () => {
    const x = (await api("GET", `/executions/${id}`)).data;
    const names = await flowNames();
    if (ranGraph === undefined) {
      try {
        const path = x.flowVersion ? `/flows/${x.flowId}/versions/${x.flowVersion}` : `/flows/${x.flowId}`;
        ranGraph = (await api("GET", path)).data.graph;
      } catch {
        ranGraph = null;
      }
    }
    let logs = [];
    try {
      const res = await api("GET", `/logs${qs({ "filter[tenant]": logScope(x.tenant, x.user), "filter[executionId]": id, "page[size]": 200 })}`);
      logs = res.data;
    } catch {
      logs = null;
    }
    const key = JSON.stringify([x, logs]);
    if (key === last) return x;
    last = key;
    const logsByStep = new Map();
    for (const entry of logs || []) {
      const k = entry.stepId || "";
      if (!logsByStep.has(k)) logsByStep.set(k, []);
      logsByStep.get(k).push(entry);
    }
    const rerun = h(
      "button",
      {
        type: "button",
        class: "secondary",
        onclick: async () => {
          try {
            const res = await api("POST", `/flows/${x.flowId}/executions`, x.input ?? {});
            navigate(`/executions/${res.data.executionId}`);
          } catch (err) {
            box.prepend(errorBox(err));
          }
        },
      },
      "Run again with this input",
    );
    // SPEC §11: retry from the failed step, re-run from the trigger data, cancel what is unfinished.
    const act = (label, action, title) =>
      h(
        "button",
        {
          type: "button",
          class: action === "cancel" ? "danger" : "secondary",
          title,
          onclick: async () => {
            if (action === "cancel" && !confirm(`Cancel execution ${x.id}? A running step is interrupted.`)) return;
            try {
              const res = await api("POST", `/executions/${x.id}/${action}`);
              if (action === "cancel") await load();
              else navigate(`/executions/${res.data.id}`);
            } catch (err) {
              box.prepend(errorBox(err));
            }
          },
        },
        label,
      );
    const unfinished = ["queued", "waiting", "running"].includes(x.status);
    const replays = [
      x.status === "failed" || x.status === "cancelled" ? act("Retry", "retry", "Go on at the failed step with its input; the steps before it are not run again") : null,
      unfinished ? null : act("Re-run", "rerun", "Run the trigger data again on the flow's current version"),
      unfinished ? act("Cancel execution", "cancel", "Cancel it; a running step is interrupted") : null,
    ];
    const origin = x.retryOf
      ? fact("Retry of", h("a", { href: `#/executions/${x.retryOf}`, class: "mono" }, x.retryOf))
      : x.rerunOf
        ? fact("Re-run of", h("a", { href: `#/executions/${x.rerunOf}`, class: "mono" }, x.rerunOf))
        : x.parentExecutionId
          ? fact("Started by", h("a", { href: `#/executions/${x.parentExecutionId}`, class: "mono" }, x.parentExecutionId))
          : [];
    put(box, 
      h("div", { class: "status-line", "aria-live": "polite" }, h("span", {}, "Status "), badge(x.status), x.error ? h("span", { class: "status-message" }, x.error) : null),
      h(
        "dl",
        { class: "facts" },
        ...fact("Flow", flowLink(x.flowId, names)),
        ...fact("Trigger", x.trigger),
        ...fact("Attempts", x.attempts),
        ...fact("Created", fmtTime(x.createdAt)),
        ...fact("Started", fmtTime(x.startedAt)),
        ...fact("Finished", fmtTime(x.finishedAt)),
        ...fact("Duration", duration(x.startedAt, x.finishedAt)),
        ...(x.status === "waiting" && x.resumeAt ? fact("Resumes", fmtTime(x.resumeAt)) : []),
        ...origin,
      ),
      hasPermission("tenant.flows.update") ? h("div", { class: "actions" }, rerun, ...replays) : null,
      h("div", { class: "two-col" }, h("section", {}, h("h2", {}, "Input"), h("pre", { tabindex: 0 }, fmtJson(x.input))), h("section", {}, h("h2", {}, "Result"), h("pre", { tabindex: 0 }, x.result === null || x.result === undefined ? "—" : fmtJson(x.result)))),
      ranGraph
        ? h("section", {}, h("h2", {}, "The run on the graph"), h("div", { class: "graph-box", tabindex: 0, role: "region", "aria-label": "The run on the graph (scrolls sideways)" }, drawGraph(ranGraph, new Map(x.steps.map((st) => [st.nodeId, st.status])))))
        : null,
      h("h2", {}, `Steps (${x.steps.length})`),
      x.steps.length
        ? h("ol", { class: "steps" }, x.steps.map((s) => stepCard(s, logsByStep.get(s.nodeId) || [], logs === null)))
        : emptyState(["queued", "running", "waiting"].includes(x.status) ? "No step has finished yet; this page updates by itself." : "No step ran."),
    );
    return x;
  };
  const first = await load();
  if (["queued", "running", "waiting"].includes(first.status)) poll(load);
}

function stepCard(step, logs, logsUnavailable) {
  return h(
    "li",
    { class: `step step-${step.status}` },
    h("div", { class: "step-head" }, h("h3", {}, step.nodeId), badge(step.status), h("span", { class: "muted" }, step.componentId ? `${step.componentId}${step.function ? `.${step.function}` : ""}` : "pass-through")),
    h("div", { class: "step-body" },
      h(
        "div",
        {},
        h("p", { class: "step-facts" }, `${step.runs} run${step.runs === 1 ? "" : "s"} · ${step.attempts || step.runs} attempt${(step.attempts || step.runs) === 1 ? "" : "s"} · ${step.messagesIn} in · ${step.messagesOut} out · ${Math.round(step.durationMs)} ms`),
        step.error ? h("div", { class: "step-error", role: "note" }, h("strong", {}, "Error: "), step.error) : null,
        step.attemptErrors && step.attemptErrors.length
          ? h(
              "details",
              { class: "attempts" },
              h("summary", {}, `Failed attempts (${step.attemptErrors.length})`),
              h("ol", {}, step.attemptErrors.map((a) => h("li", {}, h("span", { class: "muted" }, `#${a.attempt} · ${fmtTime(a.startedAt)} `), a.error))),
            )
          : null,
        step.inputs !== null && step.inputs !== undefined ? h("h4", {}, "Input") : null,
        step.inputs !== null && step.inputs !== undefined ? h("pre", { tabindex: 0 }, fmtJson(step.inputs)) : null,
        step.input !== null && step.input !== undefined ? h("h4", {}, "Input it failed on (where a retry starts)") : null,
        step.input !== null && step.input !== undefined ? h("pre", { tabindex: 0 }, fmtJson(step.input)) : null,
        h("h4", {}, "Output"),
        h("pre", { tabindex: 0 }, step.output === null || step.output === undefined ? "—" : fmtJson(step.output)),
      ),
      h(
        "div",
        { class: "step-logs" },
        h("h4", {}, "Log entries"),
        logsUnavailable
          ? h("p", { class: "muted" }, "Logs are not available to you.")
          : logs.length
            ? h("ul", { class: "log-list" }, logs.map((l) => h("li", { class: `log-${l.level}` }, h("span", { class: "badge" }, l.level), " ", l.message, h("div", { class: "muted" }, fmtTime(l.timestamp)))))
            : h("p", { class: "muted" }, "No entries."),
      ),
    ),
  );
}

// ---------------------------------------------------------------- logs

function localInput(iso) {
  if (!iso) return "";
  return iso.slice(0, 16);
}

async function viewLogs(_m, query) {
  setTitle("Logs");
  const me = session.me;
  const state = {
    scope: query.get("scope") || me.tenant || me.id,
    flow: query.get("flow") || "",
    step: query.get("step") || "",
    execution: query.get("execution") || "",
    errors: query.get("errors") === "1",
    from: query.get("from") || "",
    to: query.get("to") || "",
    page: Number(query.get("page") || 1),
  };
  const scope = h("input", { type: "text", value: state.scope, class: "mono" });
  const flow = h("input", { type: "text", value: state.flow, class: "mono", placeholder: "flow id" });
  const step = h("input", { type: "text", value: state.step, placeholder: "node id" });
  const execution = h("input", { type: "text", value: state.execution, class: "mono", placeholder: "execution id" });
  const level = select([["", "Every level"], ["1", "Errors only"]], state.errors ? "1" : "");
  const from = h("input", { type: "datetime-local", value: localInput(state.from) });
  const to = h("input", { type: "datetime-local", value: localInput(state.to) });
  const apply = (page) =>
    navigate("/logs", {
      scope: scope.value,
      flow: flow.value.trim(),
      step: step.value.trim(),
      execution: execution.value.trim(),
      errors: level.value,
      from: from.value,
      to: to.value,
      page: page > 1 ? page : "",
    });
  const body = h("div", {});
  put(main, 
    h("h1", {}, "Logs"),
    h(
      "form",
      { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); apply(1); } },
      field("Tenant (or user id)", scope),
      field("Flow", flow),
      field("Step", step),
      field("Execution", execution),
      field("Level", level),
      field("From (UTC)", from),
      field("To (UTC)", to),
      h("button", { type: "submit" }, "Apply"),
    ),
    body,
  );
  const load = async () => {
    const res = await api(
      "GET",
      `/logs${qs({
        "filter[tenant]": state.scope,
        "filter[flowId]": state.flow,
        "filter[stepId]": state.step,
        "filter[executionId]": state.execution,
        showErrors: state.errors ? "true" : "",
        from: state.from,
        to: state.to,
        "page[size]": 50,
        "page[number]": state.page,
      })}`,
    );
    if (!changed(body, res)) return;
    const names = res.data.length ? await flowNames() : null;
    put(body, 
      res.data.length
        ? table(
            "Log entries",
            ["Time", "Level", "Message", "Flow", "Step", "Execution"],
            res.data.map((l) =>
              h(
                "tr",
                {},
                h("td", { class: "nowrap" }, fmtTime(l.timestamp)),
                h("td", {}, h("span", { class: `badge badge-log-${l.level}` }, l.level)),
                h("td", {}, l.message),
                h("td", {}, l.flowId ? flowLink(l.flowId, names) : "—"),
                h("td", {}, l.stepId || "—"),
                h("td", {}, l.executionId ? h("a", { href: `#/executions/${l.executionId}`, class: "mono" }, l.executionId.slice(-8)) : "—"),
              ),
            ),
          )
        : emptyState("No log entries match. Widen the time range or clear a filter."),
      res.data.length ? pager(res.meta, apply) : null,
    );
  };
  try {
    await load();
  } catch (err) {
    put(body, errorBox(err));
    return;
  }
  if (state.page === 1) poll(load);
}

// ---------------------------------------------------------------- counts

function isoDay(d) {
  return d.toISOString().slice(0, 10);
}

async function viewCounts(_m, query) {
  setTitle("Counts");
  const today = new Date();
  const defaultStart = new Date(today.getTime() - 13 * 86400000);
  const state = { start: query.get("start") || isoDay(defaultStart), end: query.get("end") || isoDay(today) };
  const start = h("input", { type: "date", value: state.start });
  const end = h("input", { type: "date", value: state.end });
  const body = h("div", {});
  put(main, 
    h("h1", {}, "Execution counts"),
    h(
      "form",
      { class: "filters", onsubmit: (e) => { e.preventDefault(); navigate("/counts", { start: start.value, end: end.value }); } },
      field("From (UTC day)", start),
      field("To (UTC day)", end),
      h("button", { type: "submit" }, "Show"),
    ),
    body,
  );
  const days = [];
  for (let d = new Date(`${state.start}T00:00:00Z`); isoDay(d) <= state.end && days.length <= 92; d = new Date(d.getTime() + 86400000)) days.push(isoDay(d));
  if (days.length > 92 || !days.length) {
    put(body, errorBox({ message: "Choose a frame of 1 to 92 days, the first day before the last." }));
    return;
  }
  const frame = { start: state.start, end: state.end };
  let byFlow;
  let byUser;
  let byComponent;
  let perDay;
  try {
    [byFlow, byUser, byComponent, perDay] = await Promise.all([
      api("GET", `/icenter/executions${qs({ ...frame, groupby: "flow" })}`),
      api("GET", `/icenter/executions${qs({ ...frame, groupby: "user" })}`),
      api("GET", `/icenter/executions${qs({ ...frame, groupby: "component" })}`),
      Promise.all(days.map((d) => api("GET", `/icenter/executions${qs({ start: d, end: d, groupby: "flow" })}`))),
    ]);
  } catch (err) {
    put(body, errorBox(err));
    return;
  }
  const total = byFlow.metadata.totalExecutions;
  const charts = [];
  onLeave(() => charts.forEach((c) => c.destroy()));
  const chartBox = (title, labels, values, kind, tableHeaders, rows) => {
    const canvas = h("canvas", { role: "img", "aria-label": `${title}: ${labels.map((l, i) => `${l} ${values[i]}`).join(", ") || "no data"}` });
    const section = h(
      "section",
      { class: "card chart-card" },
      h("h2", {}, title),
      values.length ? h("div", { class: "chart" }, canvas) : emptyState("Nothing counted in this frame."),
      values.length ? h("details", {}, h("summary", {}, "As a table"), table(title, tableHeaders, rows)) : null,
    );
    if (values.length) {
      charts.push(
        new window.Chart(canvas, {
          type: "bar",
          data: { labels, datasets: [{ label: "executions", data: values, backgroundColor: "#2f6f9f", borderRadius: 3, maxBarThickness: 36 }] },
          options: {
            indexAxis: kind === "h" ? "y" : "x",
            responsive: true,
            maintainAspectRatio: false,
            animation: false,
            plugins: { legend: { display: false } },
            scales: { [kind === "h" ? "x" : "y"]: { beginAtZero: true, ticks: { precision: 0 } } },
          },
        }),
      );
    }
    return section;
  };
  const top = (records, label, n = 10) => records.slice(0, n).map((r) => [label(r), r.executions]);
  const flows = top(byFlow.data, (r) => r.flowName || r.flow || r._id);
  const users = top(byUser.data, (r) => r.username || r._id);
  const comps = top(byComponent.data, (r) => r.component || r._id || "(none)");
  const dayValues = perDay.map((r) => r.metadata.totalExecutions);
  put(body, 
    h("p", { class: "total", "aria-live": "polite" }, h("strong", { id: "counts-total" }, String(total)), ` executions from ${state.start} to ${state.end} (UTC days)`),
    h(
      "div",
      { class: "charts" },
      chartBox("Executions per day", days.map((d) => d.slice(5)), dayValues, "v", ["Day", "Executions"], days.map((d, i) => h("tr", {}, h("td", {}, d), h("td", {}, dayValues[i])))),
      chartBox("Top flows", flows.map((r) => r[0]), flows.map((r) => r[1]), "h", ["Flow", "Executions"], byFlow.data.map((r) => h("tr", {}, h("td", {}, h("a", { href: `#/flows/${r._id}` }, r.flowName || r._id)), h("td", {}, r.executions)))),
      chartBox("Per user", users.map((r) => r[0]), users.map((r) => r[1]), "h", ["User", "Executions"], byUser.data.map((r) => h("tr", {}, h("td", {}, r.username || r._id), h("td", {}, r.executions)))),
      chartBox("Steps per component", comps.map((r) => r[0]), comps.map((r) => r[1]), "h", ["Component", "Steps run"], byComponent.data.map((r) => h("tr", {}, h("td", {}, r.component || r._id), h("td", {}, r.executions)))),
    ),
  );
}

// ---------------------------------------------------------------- templates

async function viewTemplates(_m, query) {
  setTitle("Templates");
  const state = { search: query.get("search") || "", tags: query.get("tags") || "", page: Number(query.get("page") || 1) };
  const search = h("input", { type: "search", value: state.search, placeholder: "Name or description" });
  const tags = h("input", { type: "text", value: state.tags, placeholder: "comma,separated" });
  const apply = (page) => navigate("/templates", { search: search.value, tags: tags.value.trim(), page: page > 1 ? page : "" });
  const body = h("div", {});
  put(main, 
    h("h1", {}, "Templates"),
    h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); apply(1); } }, field("Search", search), field("Tags", tags, "Templates with any of these tags, and untagged ones."), h("button", { type: "submit" }, "Search")),
    body,
  );
  const res = await api("GET", `/templates${qs({ search: state.search, tags: state.tags, "page[size]": 24, "page[number]": state.page, sort: "name" })}`);
  if (!res.data.length) {
    put(body, emptyState(state.search || state.tags ? "No template matches. Clear the search." : "No templates yet. An administrator imports them with flowyard templates import FILE.json."));
    return;
  }
  const canCreate = hasPermission("tenant.flows.create");
  put(body, 
    h(
      "ul",
      { class: "gallery" },
      res.data.map((t) => {
        const out = h("div", { "aria-live": "polite" });
        return h(
          "li",
          { class: "card template" },
          h("h2", {}, t.name),
          h("p", { class: "muted" }, t.description || "No description."),
          h("p", { class: "tags" }, t.tags.map((tag) => h("span", { class: "tag" }, tag)), h("span", { class: "muted" }, ` ${t.graph.nodes.length} nodes · ${t.cron ? `cron ${t.cron}` : "webhook"}`)),
          out,
          canCreate
            ? h(
                "button",
                {
                  type: "button",
                  "aria-label": `Create a flow from ${t.name}`,
                  onclick: async () => {
                    try {
                      const created = await api("POST", `/templates/${t.id}/flows`, {});
                      toast("Flow created from the template.");
                      navigate(`/flows/${created.data.id}`);
                    } catch (err) {
                      put(out, errorBox(err));
                    }
                  },
                },
                "Create flow",
              )
            : null,
        );
      }),
    ),
    pager(res.meta, apply),
  );
}

// ---------------------------------------------------------------- administration

const ADMIN_TABS = [
  ["tokens", "API tokens"],
  ["credentials", "Credentials"],
  ["users", "Users"],
  ["tenants", "Tenants"],
  ["roles", "Roles"],
];

async function viewAdmin(tab) {
  setTitle("Administration");
  const tabs = h(
    "nav",
    { class: "tabs", "aria-label": "Administration" },
    ADMIN_TABS.map(([key, label]) => h("a", { href: `#/admin/${key}`, "aria-current": key === tab ? "page" : null }, label)),
  );
  const body = h("div", {});
  put(main, h("h1", {}, "Administration"), tabs, body);
  const views = { tokens: adminTokens, credentials: adminCredentials, users: adminUsers, tenants: adminTenants, roles: adminRoles };
  try {
    await views[tab](body);
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) put(body, errorBox({ message: "You lack the permission for this page; ask an administrator." }));
    else throw err;
  }
}

function createForm(title, controls, submitLabel, onSubmit) {
  const out = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    {
      class: "card",
      onsubmit: async (ev) => {
        ev.preventDefault();
        put(out, );
        try {
          await onSubmit(out);
          form.reset();
        } catch (err) {
          put(out, errorBox(err));
        }
      },
    },
    h("h2", {}, title),
    h("div", { class: "form-grid" }, controls),
    out,
    h("button", { type: "submit" }, submitLabel),
  );
  return form;
}

async function adminTokens(body) {
  const description = h("input", { type: "text", maxlength: 500 });
  const expires = h("input", { type: "datetime-local" });
  const shown = h("div", {});
  const list = h("div", {});
  const load = async () => {
    const res = await api("GET", `/tokens${qs({ "page[size]": 100 })}`);
    put(list, 
      table(
        "Your tokens",
        ["Description", "Kind", "Created", "Expires", "Last used", ""],
        res.data.map((t) =>
          h(
            "tr",
            {},
            h("td", {}, t.description || "—"),
            h("td", {}, t.kind),
            h("td", {}, fmtTime(t.createdAt)),
            h("td", {}, fmtTime(t.expiresAt)),
            h("td", {}, fmtTime(t.lastUsedAt)),
            h("td", {}, t.kind === "api" ? h("button", { type: "button", class: "danger small", "aria-label": `Revoke token ${t.description || t.id}`, onclick: async () => { if (!confirm("Revoke this token?")) return; await api("DELETE", `/tokens/${t.id}`); await load(); } }, "Revoke") : null),
          ),
        ),
      ),
    );
  };
  put(body, 
    createForm("Create an API token", [field("Description", description), field("Expires (UTC, optional)", expires)], "Create token", async () => {
      const res = await api("POST", "/tokens", { description: description.value || null, expiresAt: expires.value ? `${expires.value}:00Z` : null });
      const text = res.data.token;
      put(shown, 
        h(
          "div",
          { class: "card token-once", role: "alert" },
          h("h2", {}, "Your new token"),
          h("p", {}, "Copy it now: it is shown only this once and cannot be read again."),
          h("div", { class: "copy-row" }, h("code", { class: "copy-text", id: "new-token" }, text), copyButton(text, "Copy token")),
          h("button", { type: "button", class: "secondary small", onclick: () => put(shown, ) }, "I have copied it"),
        ),
      );
      await load();
    }),
    shown,
    h("h2", {}, "Your tokens"),
    list,
  );
  await load();
}

// Secrets that nodes name in credentials_id: created, listed (never their values), rotated (a
// new value under the same id) and deleted. The value is write-only: no page ever shows it.
const CREDENTIAL_SAMPLE = '{"token": "…"}';

function jsonObjectOf(area) {
  let value;
  try {
    value = JSON.parse(area.value);
  } catch (e) {
    throw new ApiError(400, [{ message: `value: not valid JSON: ${e.message}`, field: "value" }]);
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new ApiError(400, [{ message: "value: must be a JSON object", field: "value" }]);
  return value;
}

async function adminCredentials(body) {
  const canWrite = hasPermission("iam.secret.create");
  const list = h("div", {});
  const rotating = h("div", { "aria-live": "polite" });
  const rotateForm = (secret) => {
    const value = h("textarea", { rows: 4, class: "mono", spellcheck: "false", autocomplete: "off", placeholder: CREDENTIAL_SAMPLE });
    const out = h("div", { "aria-live": "polite" });
    const form = h(
      "form",
      {
        class: "card",
        onsubmit: async (ev) => {
          ev.preventDefault();
          try {
            await api("PUT", `/secrets/${secret.id}`, { value: jsonObjectOf(value) });
            put(rotating, );
            toast(`Credentials ${secret.name} rotated.`);
            await load();
          } catch (err) {
            put(out, errorBox(err));
          }
        },
      },
      h("h2", {}, `Rotate ${secret.name}`),
      field("New value (JSON object)", value, "Replaces the stored value; nodes naming these credentials use it from their next execution (within a minute). It is never shown again."),
      out,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Rotate"), h("button", { type: "button", class: "secondary", onclick: () => put(rotating, ) }, "Cancel")),
    );
    put(rotating, form);
    value.focus();
  };
  const load = async () => {
    const res = await api("GET", `/secrets${qs({ "page[size]": 100 })}`);
    put(
      list,
      res.data.length
        ? table(
            "Credentials",
            ["Name", "Id", "Tenant", "Created", "Updated", ""],
            res.data.map((x) =>
              h(
                "tr",
                {},
                h("td", {}, x.name),
                h("td", { class: "mono" }, x.id),
                h("td", { class: "mono" }, x.tenant || "—"),
                h("td", {}, fmtTime(x.createdAt)),
                h("td", {}, fmtTime(x.updatedAt)),
                h(
                  "td",
                  {},
                  canWrite
                    ? [
                        h("button", { type: "button", class: "secondary small", "aria-label": `Rotate credentials ${x.name}`, onclick: () => rotateForm(x) }, "Rotate"),
                        " ",
                        h("button", { type: "button", class: "danger small", "aria-label": `Delete credentials ${x.name}`, onclick: async () => { if (!confirm(`Delete the credentials ${x.name}? Nodes naming them will fail.`)) return; await api("DELETE", `/secrets/${x.id}`); toast(`Credentials ${x.name} deleted.`); await load(); } }, "Delete"),
                      ]
                    : null,
                ),
              ),
            ),
          )
        : emptyState("No credentials yet."),
    );
  };
  const name = h("input", { type: "text", maxlength: 200, autocomplete: "off" });
  const value = h("textarea", { rows: 4, class: "mono", spellcheck: "false", autocomplete: "off", placeholder: CREDENTIAL_SAMPLE });
  put(
    body,
    canWrite
      ? createForm(
          "Store credentials",
          [field("Name", name), field("Value (JSON object)", value, "e.g. {\"token\": …} (Bearer), {\"username\", \"password\"} (Basic), {\"url\": …} for the sql connectors. Write-only: never shown again.")],
          "Store credentials",
          async () => {
            const res = await api("POST", "/secrets", { name: name.value, value: jsonObjectOf(value) });
            toast(`Credentials ${res.data.name} stored; nodes name them with credentials_id ${res.data.id}.`);
            await load();
          },
        )
      : null,
    rotating,
    h("h2", {}, "Stored credentials"),
    list,
  );
  await load();
}

async function adminUsers(body) {
  const list = h("div", {});
  const load = async () => {
    const res = await api("GET", `/api/users${qs({ meta: "true", "page[size]": 100 })}`);
    put(list, 
      table(
        "Users",
        ["User", "Name", "Status", "Tenant", "Permissions", "Roles"],
        res.data.map((u) => h("tr", {}, h("td", {}, u.username), h("td", {}, `${u.firstname} ${u.lastname}`.trim() || "—"), h("td", {}, u.status), h("td", { class: "mono" }, u.tenant || "—"), h("td", {}, u.permissions.join(", ") || "—"), h("td", {}, u.roles.map((r) => r.name).join(", ") || "—"))),
      ),
    );
  };
  const username = h("input", { type: "email", required: true });
  const password = h("input", { type: "password", required: true, minlength: 8, autocomplete: "new-password" });
  const tenant = h("input", { type: "text", class: "mono", placeholder: "tenant id (optional)" });
  const permissions = h("input", { type: "text", placeholder: "tenant.flows.read, tenant.flows.create" });
  put(body, 
    hasPermission("iam.account.create")
      ? createForm("Create a user", [field("E-mail", username), field("Password (8+ characters)", password), field("Tenant", tenant), field("Permissions", permissions, "Comma-separated.")], "Create user", async () => {
          await api("POST", "/api/users", { username: username.value, password: password.value, tenant: tenant.value.trim() || null, permissions: permissions.value.split(",").map((p) => p.trim()).filter(Boolean) });
          toast("User created.");
          await load();
        })
      : null,
    h("h2", {}, "Users"),
    list,
  );
  await load();
}

async function adminTenants(body) {
  const list = h("div", {});
  const load = async () => {
    const res = await api("GET", `/tenants${qs({ "page[size]": 100 })}`);
    put(list, res.data.length ? table("Tenants", ["Name", "Id", "Created"], res.data.map((t) => h("tr", {}, h("td", {}, t.name), h("td", { class: "mono" }, t.id), h("td", {}, fmtTime(t.createdAt))))) : emptyState("No tenants yet."));
  };
  const name = h("input", { type: "text", required: true, maxlength: 200 });
  put(body, 
    hasPermission("iam.tenant.create")
      ? createForm("Create a tenant", [field("Name", name)], "Create tenant", async () => {
          await api("POST", "/tenants", { name: name.value });
          toast("Tenant created.");
          await load();
        })
      : null,
    h("h2", {}, "Tenants"),
    list,
  );
  await load();
}

async function adminRoles(body) {
  const list = h("div", {});
  const load = async () => {
    const res = await api("GET", `/roles${qs({ "page[size]": 100 })}`);
    put(list, res.data.length ? table("Roles", ["Name", "Permissions", "Scope", "Description"], res.data.map((r) => h("tr", {}, h("td", {}, r.name), h("td", {}, r.permissions.join(", ") || "—"), h("td", { class: "mono" }, r.scope || "global"), h("td", {}, r.description || "—")))) : emptyState("No roles yet."));
  };
  const name = h("input", { type: "text", required: true, maxlength: 200 });
  const permissions = h("input", { type: "text", placeholder: "tenant.flows.read, tenant.flows.update" });
  const scope = h("input", { type: "text", class: "mono", placeholder: "tenant id; empty: global" });
  put(body, 
    createForm("Create a role", [field("Name", name), field("Permissions", permissions, "Comma-separated."), field("Scope", scope)], "Create role", async () => {
      await api("POST", "/roles", { name: name.value, permissions: permissions.value.split(",").map((p) => p.trim()).filter(Boolean), scope: scope.value.trim() || null });
      toast("Role created.");
      await load();
    }),
    h("h2", {}, "Roles"),
    list,
  );
  await load();
}

// ---------------------------------------------------------------- start

window.addEventListener("hashchange", () => {
  route().then(() => main.focus({ preventScroll: true }));
});
route();
