// The compensation console: plain DOM over the JSON API. Every value from the server is
// put on the page with textContent, never as HTML: an order number with <script> in it
// shows as text.
"use strict";

const $ = (id) => document.getElementById(id);
let before = null;          // keyset cursor of the queue
let current = null;         // the row shown in detail

function say(id, message) { $("error").textContent = ""; $("notice").textContent = ""; $(id).textContent = message; }

// -- times, badges, cells ---------------------------------------------------------------

// The server's times are UTC (ISO 8601, without a zone when they come from the database).
function parseTime(value) {
  if (value === null || value === undefined || value === "") return null;
  const text = String(value);
  const date = new Date(/(Z|[+-]\d\d:?\d\d)$/i.test(text) ? text : `${text}Z`);
  return Number.isNaN(date.getTime()) ? null : date;
}

function exactTime(date) { return `${date.toISOString().replace("T", " ").slice(0, 23)} UTC`; }

function duration(seconds) {
  const s = Math.abs(seconds);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(s < 36000 ? 1 : 0)} h`;
  return `${Math.round(s / 86400)} d`;
}

function relativeTime(date, now = Date.now()) {
  const seconds = (date.getTime() - now) / 1000;
  if (Math.abs(seconds) < 5) return "just now";
  return seconds < 0 ? `${duration(seconds)} ago` : `in ${duration(seconds)}`;
}

// A time as people read it ("5 min ago"), the exact one in its datetime and on hover (title).
function timeElement(value) {
  const time = document.createElement("time");
  const date = parseTime(value);
  if (date === null) { time.textContent = value === null || value === undefined ? "" : String(value); return time; }
  time.dateTime = date.toISOString();
  time.title = exactTime(date);
  time.textContent = relativeTime(date);
  return time;
}

function badge(status, label) {
  const span = document.createElement("span");
  span.className = `badge status ${status}`;
  span.textContent = label === undefined ? status : label;
  return span;
}

const TIME_COLUMNS = new Set(["at", "first_failure_at", "next_retry_at", "first_seen", "last_seen", "created_at",
                              "finished_at", "modified_at", "gmt_create", "gmt_modified", "lease_until"]);

function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function timeCell(row, value, label) {
  const td = cell(row, "");
  td.appendChild(timeElement(value));
  if (label) td.dataset.label = label;
  return td;
}

function badgeCell(row, status, label) {
  const td = cell(row, "");
  if (status !== null && status !== undefined) td.appendChild(badge(status));
  if (label) td.dataset.label = label;
  return td;
}

function emptyRow(tbody, message, columns) {
  const tr = document.createElement("tr");
  const td = cell(tr, message, "empty");
  td.colSpan = columns;
  tbody.appendChild(tr);
}

function rows(tbody, items, columns) {
  tbody.replaceChildren();
  for (const item of items) {
    const tr = document.createElement("tr");
    for (const column of columns) {
      const td = column === "status" ? badgeCell(tr, item.status)
        : TIME_COLUMNS.has(column) ? timeCell(tr, item[column]) : cell(tr, item[column]);
      if (!tbody.parentElement.tHead) td.dataset.label = column;
    }
    tbody.appendChild(tr);
  }
}

// On a narrow screen a table shows each row as a card, each value under its column's name:
// every cell of a table with a header row is labelled with it, whichever script added the cell.
function labelCells(table) {
  if (!table.tHead || !table.tHead.rows.length) return;
  const heads = [...table.tHead.rows[0].cells].map((th) => th.textContent);
  for (const body of table.tBodies) {
    for (const tr of body.rows) {
      [...tr.cells].forEach((td, index) => {
        if (!td.dataset.label && heads[index] && td.colSpan === 1) td.dataset.label = heads[index];
      });
    }
  }
}

new MutationObserver((changes) => {
  const tables = new Set();
  for (const change of changes) {
    const table = change.target.closest ? change.target.closest("table") : null;
    if (table) tables.add(table);
  }
  tables.forEach(labelCells);
}).observe(document.body, { childList: true, subtree: true });

// -- pages ------------------------------------------------------------------------------

// The console's pages: #/overview (first), #/queue (with ?status=...&fingerprint=... to filter it),
// #/queue/<id> (a dead letter's detail), #/groups, #/bulk, #/orders (with /<order> to look one up),
// #/reconcile, #/controls. Each page is a section; only the current one shows.
const PAGES = ["overview", "queue", "groups", "bulk", "orders", "reconcile", "controls"];
const pageLoaders = {};     // page -> what to load when it is shown (the other scripts add theirs)

function parseRoute() {
  const [path, query] = (location.hash.replace(/^#\/?/, "") || "overview").split("?");
  const [page, ...rest] = path.split("/");
  return { page: PAGES.includes(page) ? page : "overview", arg: rest.join("/") ? decodeURIComponent(rest.join("/")) : "",
           query: new URLSearchParams(query || "") };
}

function showPage(page) {
  for (const section of document.querySelectorAll("[data-page]")) section.hidden = section.dataset.page !== page;
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  const { page, arg, query } = parseRoute();
  showPage(page);
  if (!me) return;
  if (page === "queue") {
    if ([...query.keys()].length) {
      $("filters").reset();
      for (const [name, value] of query) if ($("filters").elements[name]) $("filters").elements[name].value = value;
      load(false);
    }
    if (arg) open(arg);
    else $("detail").hidden = true;
  } else if (page === "orders" && arg) {
    $("lookup").elements.order_no.value = arg;
    lookup(arg);
  } else if (pageLoaders[page]) {
    pageLoaders[page]();
  }
}

// The token is asked for once and kept for this tab only (sessionStorage: gone when the tab
// closes, never shared with another tab, never in localStorage or a cookie); "Forget token"
// drops it at once.
const TOKEN_KEY = "token";
let me = null;              // GET /whoami: the role, and whether values come masked

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// Every call carries the token (the data views need one to read, actions to act) and the
// person's name (X-Actor: an operator's look at whole values is audited under it).
async function api(path, options = {}) {
  let response;
  try {
    response = await send(path, options);
  } catch (error) {
    throw new Error(unreachable(error));
  }
  const body = await response.json().catch(() => ({ error: `answer ${response.status} is not JSON` }));
  if (response.status === 401 || response.status === 403) {
    const error = new Error(`${body.error || `answer ${response.status}`}: enter the token above`);
    error.status = response.status;
    throw error;
  }
  if (!response.ok) {
    const error = new Error(explain(response.status, body.error));
    error.status = response.status;
    throw error;
  }
  return body;
}

// What an answer that is not 200 means, and what to do about it.
function explain(status, reason) {
  const said = reason || `the worker answered ${status}`;
  if (status >= 500) {
    return `${said}. The worker or its database may be down or still starting: check its /readyz and its logs, ` +
           "then reload this page.";
  }
  if (status === 404) return `${said}. Check the number, or look for it in the queue.`;
  return said;
}

// fetch itself failed: nothing answered.
function unreachable(error) {
  return error instanceof TypeError
    ? "The worker did not answer: check that it runs and that this address reaches it, then reload this page."
    : error.message;
}

function send(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const actor = $("actor").value.trim();
  if (actor) headers["X-Actor"] = actor;
  return fetch(path, { ...options, headers });
}

function operator() { return me !== null && me.role === "operator"; }

async function signIn() {
  const asking = !token();
  $("token").closest("label").hidden = !asking;
  $("forget").hidden = asking;
  $("whoami").textContent = asking ? "" : "checking the token...";
  if (asking) {
    me = null;
    showRole();
    say("notice", "Enter your token above: WEB_READ_TOKEN to look, WEB_TOKEN to act.");
    return;
  }
  try {
    me = await api("/whoami");
  } catch (error) {
    if (error.status === 401) sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    showRole();
    $("token").closest("label").hidden = false;
    say("error", error.message);
    return;
  }
  say("notice", "");
  showRole();
  load(false);
  document.dispatchEvent(new CustomEvent("console:signed-in"));
  route();
}

function showRole() {
  // A token of one's own (WEB_TOKENS_FILE) names the person: the audit writes that name, whatever is typed.
  const named = me !== null && Boolean(me.name);
  if (named) $("actor").value = me.name;
  $("actor").readOnly = named;
  $("whoami").textContent = me ? (operator() ? "operator: whole values, actions and downloads (audited)"
                                             : "viewer: phone numbers and addresses masked, no actions") : "";
  if (named) $("whoami").textContent = `${me.name}, ${$("whoami").textContent}`;
  $("whoami").dataset.role = me ? me.role : "";
  $("actions").hidden = !operator();
  $("downloads").hidden = !operator();
}

function forget() {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  current = null;
  $("token").value = "";
  $("detail").hidden = true;
  $("timeline").hidden = true;
  $("queue").tBodies[0].replaceChildren();
  $("counts").replaceChildren();
  go("#/overview");
  signIn();
}

// -- masked values ------------------------------------------------------------------------

const MASK_TITLE = "masked for a viewer: phone keeps its last 4 digits, address its first 3 characters";

// A value the server masked is marked so on the page (the whole value never reached it).
function marked(element, masked) {
  element.classList.toggle("masked", Boolean(masked));
  element.title = masked ? MASK_TITLE : "";
}

// Text put into ``element`` as text nodes; with ``masked``, each masked value in it (the masker
// writes *** in place of what it hides) is a <mark> that says so.
function appendText(element, text, masked) {
  if (!masked) { element.appendChild(document.createTextNode(text)); return; }
  // A quoted string that holds a mask is marked whole (an address keeps words before it), else the word.
  const pattern = /"([^"\n]*\*\*\*[^"\n]*)"|[^\s"',;=]*\*\*\*[^\s"',;]*/g;
  let at = 0;
  for (const found of text.matchAll(pattern)) {
    const quoted = found[1] !== undefined;
    element.appendChild(document.createTextNode(text.slice(at, found.index) + (quoted ? '"' : "")));
    const mark = document.createElement("mark");
    mark.className = "masked-value";
    mark.title = MASK_TITLE;
    mark.textContent = quoted ? found[1] : found[0];
    element.appendChild(mark);
    if (quoted) element.appendChild(document.createTextNode('"'));
    at = found.index + found[0].length;
  }
  element.appendChild(document.createTextNode(text.slice(at)));
}

// A JSON text indented; anything else as it is.
function pretty(text) {
  try {
    const doc = JSON.parse(text);
    return doc !== null && typeof doc === "object" ? JSON.stringify(doc, null, 2) : text;
  } catch {
    return text;
  }
}

function describe(bytes) {
  if (!bytes) return "(none)";
  if (bytes.withheld !== undefined) return `(withheld, ${bytes.bytes} bytes: ${bytes.withheld})`;
  return bytes.text !== undefined ? pretty(bytes.text) : `base64 ${bytes.base64}`;
}

function showPre(element, text, masked) {
  element.replaceChildren();
  appendText(element, text, masked);
  marked(element, masked);
}

async function download(part) {
  if (!current) return;
  const id = current.id;
  try {
    const response = await send(`/compensation/${id}/record?part=${part}`);
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(explain(response.status, body.error));
    }
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = part === "value" ? `dead-letter-${id}-value.bin` : `dead-letter-${id}-envelope.json`;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    say("notice", `#${id}: ${link.download} downloaded (audited)`);
  } catch (error) { say("error", `#${id} download: ${error.message}`); }
}

// -- the queue --------------------------------------------------------------------------

function filters() {
  const form = new FormData($("filters"));
  const query = new URLSearchParams();
  for (const [name, value] of form) if (value) query.set(name, value);
  return query;
}

function statusCounts(list, byStatus, capped, link) {
  list.replaceChildren();
  for (const [status, n] of Object.entries(byStatus)) {
    const item = document.createElement("li");
    const span = badge(status, `${status}: ${n}${capped.has(status) ? "+" : ""}`);
    if (link) {
      const a = document.createElement("a");
      a.href = `#/queue?status=${encodeURIComponent(status)}`;
      a.appendChild(span);
      item.appendChild(a);
    } else {
      item.appendChild(span);
    }
    list.appendChild(item);
  }
}

function queueRow(item) {
  const tr = document.createElement("tr");
  tr.className = "row";
  tr.dataset.id = item.id;
  tr.tabIndex = 0;
  cell(tr, item.id);
  badgeCell(tr, item.status).classList.add("status", item.status);
  cell(tr, item.reason);
  cell(tr, item.order_no);
  cell(tr, item.attempts);
  timeCell(tr, item.first_failure_at);
  timeCell(tr, item.next_retry_at);
  tr.addEventListener("click", () => go(`#/queue/${item.id}`));
  tr.addEventListener("keydown", (event) => { if (event.key === "Enter") go(`#/queue/${item.id}`); });
  return tr;
}

async function load(more) {
  const query = filters();
  if (more && before) query.set("before", before);
  $("queue-error").textContent = "";
  try {
    const data = await api(`/compensation/?${query}`);
    const tbody = $("queue").tBodies[0];
    if (!more) tbody.replaceChildren();
    for (const item of data.items) tbody.appendChild(queueRow(item));
    $("queue-empty").hidden = tbody.rows.length > 0;
    before = data.next_before;
    $("more").hidden = !before;
    statusCounts($("counts"), data.counts.by_status, new Set(data.counts.capped || []), false);
  } catch (error) { $("queue-error").textContent = error.message; }
}

// -- a dead letter ----------------------------------------------------------------------

const DETAIL_FIELDS = ["reason", "message", "retriable", "attempts", "redrives", "order_no", "event_id", "biz_key",
                       "src_topic", "src_partition", "src_offset", "may_be_superseded", "truncated",
                       "first_failure_at", "next_retry_at"];

function detailFields(row) {
  const fields = $("detail-fields");
  fields.replaceChildren();
  for (const name of DETAIL_FIELDS) {
    const dt = document.createElement("dt");
    dt.textContent = name.replaceAll("_", " ");
    const dd = document.createElement("dd");
    dd.dataset.field = name;
    const value = row[name];
    if (value === null || value === undefined || value === "") dd.textContent = "none";
    else if (TIME_COLUMNS.has(name)) dd.appendChild(timeElement(value));
    else appendText(dd, value === null || value === undefined ? "" : String(value), row.masked);
    fields.append(dt, dd);
  }
}

function recordText(record) {
  const lines = [`key: ${describe(record.key)}`];
  for (const h of record.headers) lines.push(`header ${h.key}: ${describe(h.value)}`);
  lines.push(`value: ${describe(record.value)}`);
  return lines.join("\n");
}

async function open(id) {
  try {
    const row = await api(`/compensation/${encodeURIComponent(id)}`);
    current = row;
    $("detail").hidden = false;
    $("detail-id").textContent = `#${row.id}`;
    $("detail-status").textContent = row.status;
    $("detail-status").className = `status badge ${row.status}`;
    $("detail-masked").hidden = !row.masked;
    detailFields(row);
    showPre($("detail-record"), recordText(row.record), row.masked);
    rows($("history").tBodies[0], row.history, ["at", "actor", "action", "from_status", "to_status", "note", "detail"]);
    rows($("steps").tBodies[0], row.idem, ["biz_key", "status", "attempt", "outcome", "last_err"]);
    if (!row.history.length) emptyRow($("history").tBodies[0], "Nothing done to it yet by a person or the compensator.", 7);
    if (!row.idem.length) emptyRow($("steps").tBodies[0], "No step of this record was recorded.", 5);
    showPre($("detail-order"), row.order ? JSON.stringify(row.order, null, 2) : "(no order)", row.masked);
    for (const id of ["steps", "history"]) marked($(id), row.masked);
    $("detail").scrollIntoView({ block: "start" });
  } catch (error) { $("queue-error").textContent = error.message; }
}

async function act(action) {
  if (!current) return;
  const id = current.id;
  try {
    const result = await api(`/compensation/${id}/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ note: $("note").value || null, actor: $("actor").value || "console" }),
    });
    say("notice", `#${id} ${action}: ${result.status}${result.changed ? "" : " (no change)"}`);
    await open(id);
    await load(false);
  } catch (error) { say("error", `#${id} ${action}: ${error.message}`); }
}

// -- an order -----------------------------------------------------------------------------

async function lookup(orderNo) {
  $("lookup-error").textContent = "";
  if (!orderNo) { $("lookup-error").textContent = "Type an order number (ORD-YYYYMMDD-...) and look it up."; return; }
  try {
    const data = await api(`/orders/${encodeURIComponent(orderNo)}`);
    $("timeline").hidden = false;
    showPre($("timeline-order"), JSON.stringify(data.order, null, 2), data.masked);
    rows($("timeline-steps").tBodies[0], data.steps, ["biz_key", "status", "attempt", "outcome"]);
    rows($("timeline-letters").tBodies[0], data.dead_letters, ["id", "status", "reason", "attempts"]);
    if (!data.dead_letters.length) emptyRow($("timeline-letters").tBodies[0], "No dead letter for this order.", 4);
    for (const tr of $("timeline-letters").tBodies[0].rows) {
      const id = tr.cells[0].textContent;
      if (!id || tr.cells.length < 2) continue;
      tr.className = "row";
      tr.addEventListener("click", () => go(`#/queue/${id}`));
    }
    const more = data.dead_letters_total > data.dead_letters.length;
    $("timeline-more").hidden = !more;
    if (more) {
      $("timeline-shown").textContent = data.dead_letters.length;
      $("timeline-total").textContent = `${data.dead_letters_total}${data.dead_letters_capped ? "+" : ""}`;
      $("timeline-all").onclick = () => go(`#/queue?order_no=${encodeURIComponent(orderNo)}`);
    }
    marked($("timeline-steps"), data.masked);
  } catch (error) {
    $("timeline").hidden = true;
    $("lookup-error").textContent = error.message;
  }
}

$("token").addEventListener("change", () => {
  const given = $("token").value.trim();
  $("token").value = "";
  if (!given) return;
  sessionStorage.setItem(TOKEN_KEY, given);
  signIn();
});
$("forget").addEventListener("click", forget);
$("filters").addEventListener("submit", (event) => { event.preventDefault(); load(false); });
$("more").addEventListener("click", () => load(true));
for (const action of ["retry", "resolve", "discard"]) $(action).addEventListener("click", () => act(action));
$("download").addEventListener("click", () => download("value"));
$("download-envelope").addEventListener("click", () => download("envelope"));
$("detail-close").addEventListener("click", () => { $("detail").hidden = true; current = null; go("#/queue"); });
$("lookup").addEventListener("submit", (event) => {
  event.preventDefault();
  const orderNo = new FormData($("lookup")).get("order_no").trim();
  if (orderNo) go(`#/orders/${encodeURIComponent(orderNo)}`);
  else lookup("");
});
window.addEventListener("hashchange", route);
showPage(parseRoute().page);
signIn();
