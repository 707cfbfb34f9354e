// The compensation console: plain DOM over the JSON API. Every value from the server is
// put on the page with textContent, never as HTML: an order number with <script> in it
// shows as text.
"use strict";

const $ = (id) => document.getElementById(id);
let before = null;          // keyset cursor of the queue
let current = null;         // the row shown in detail

function say(id, message) { $("error").textContent = ""; $("notice").textContent = ""; $(id).textContent = message; }

function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function rows(tbody, items, columns) {
  tbody.replaceChildren();
  for (const item of items) {
    const tr = document.createElement("tr");
    for (const column of columns) cell(tr, item[column], column === "status" ? `status ${item.status}` : "");
    tbody.appendChild(tr);
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
  const response = await send(path, options);
  const body = await response.json().catch(() => ({ error: `answer ${response.status} is not JSON` }));
  if (response.status === 401 || response.status === 403) {
    const error = new Error(`${body.error || `answer ${response.status}`}: enter the token above`);
    error.status = response.status;
    throw error;
  }
  if (!response.ok) throw new Error(body.error || `answer ${response.status}`);
  return body;
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
  if (asking) { me = null; showRole(); return; }
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
  showRole();
  load(false);
}

function showRole() {
  $("whoami").textContent = me ? (operator() ? "operator: whole values, actions and downloads (audited)"
                                             : "viewer: phone numbers and addresses masked, no actions") : "";
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
  signIn();
}

// A value the server masked is marked so on the page (the whole value never reached it).
function marked(element, masked) {
  element.classList.toggle("masked", Boolean(masked));
  element.title = masked ? "masked for a viewer: phone keeps its last 4 digits, address its first 3 characters" : "";
}

async function download(part) {
  if (!current) return;
  const id = current.id;
  try {
    const response = await send(`/compensation/${id}/record?part=${part}`);
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error || `answer ${response.status}`);
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

function filters() {
  const form = new FormData($("filters"));
  const query = new URLSearchParams();
  for (const [name, value] of form) if (value) query.set(name, value);
  return query;
}

async function load(more) {
  const query = filters();
  if (more && before) query.set("before", before);
  try {
    const data = await api(`/compensation/?${query}`);
    const tbody = $("queue").tBodies[0];
    if (!more) tbody.replaceChildren();
    for (const item of data.items) {
      const tr = document.createElement("tr");
      tr.className = "row";
      tr.dataset.id = item.id;
      cell(tr, item.id);
      cell(tr, item.status, `status ${item.status}`);
      cell(tr, item.reason);
      cell(tr, item.order_no);
      cell(tr, item.attempts);
      cell(tr, item.first_failure_at);
      cell(tr, item.next_retry_at);
      tr.addEventListener("click", () => open(item.id));
      tbody.appendChild(tr);
    }
    before = data.next_before;
    $("more").hidden = !before;
    const counts = $("counts");
    counts.replaceChildren();
    const capped = new Set(data.counts.capped || []);
    for (const [status, n] of Object.entries(data.counts.by_status)) {
      const span = document.createElement("span");
      span.textContent = `${status}: ${n}${capped.has(status) ? "+" : ""}`;
      counts.appendChild(span);
    }
  } catch (error) { say("error", error.message); }
}

function describe(bytes) {
  if (!bytes) return "(none)";
  if (bytes.withheld !== undefined) return `(withheld, ${bytes.bytes} bytes: ${bytes.withheld})`;
  return bytes.text !== undefined ? bytes.text : `base64 ${bytes.base64}`;
}

async function open(id) {
  try {
    const row = await api(`/compensation/${id}`);
    current = row;
    $("detail").hidden = false;
    $("detail-id").textContent = `#${row.id}`;
    $("detail-status").textContent = row.status;
    $("detail-status").className = `status ${row.status}`;
    const fields = $("detail-fields");
    fields.replaceChildren();
    for (const name of ["reason", "message", "retriable", "attempts", "redrives", "order_no", "event_id", "biz_key",
                        "src_topic", "src_partition", "src_offset", "may_be_superseded", "truncated",
                        "first_failure_at", "next_retry_at"]) {
      const p = document.createElement("div");
      p.textContent = `${name}: ${row[name] === null ? "" : row[name]}`;
      fields.appendChild(p);
    }
    const record = row.record;
    $("detail-record").textContent = [`key: ${describe(record.key)}`, `value: ${describe(record.value)}`,
      ...record.headers.map((h) => `header ${h.key}: ${describe(h.value)}`)].join("\n");
    rows($("history").tBodies[0], row.history, ["at", "actor", "action", "from_status", "to_status", "note", "detail"]);
    rows($("steps").tBodies[0], row.idem, ["biz_key", "status", "attempt", "outcome", "last_err"]);
    $("detail-order").textContent = row.order ? JSON.stringify(row.order, null, 2) : "(no order)";
    for (const id of ["detail-record", "detail-order", "steps", "history"]) marked($(id), row.masked);
  } catch (error) { say("error", error.message); }
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

async function lookup(orderNo) {
  try {
    const data = await api(`/orders/${encodeURIComponent(orderNo)}`);
    $("timeline").hidden = false;
    $("timeline-order").textContent = JSON.stringify(data.order, null, 2);
    rows($("timeline-steps").tBodies[0], data.steps, ["biz_key", "status", "attempt", "outcome"]);
    rows($("timeline-letters").tBodies[0], data.dead_letters, ["id", "status", "reason", "attempts"]);
    const more = data.dead_letters_total > data.dead_letters.length;
    $("timeline-more").hidden = !more;
    if (more) {
      $("timeline-shown").textContent = data.dead_letters.length;
      $("timeline-total").textContent = `${data.dead_letters_total}${data.dead_letters_capped ? "+" : ""}`;
      $("timeline-all").onclick = () => {
        $("filters").elements.order_no.value = orderNo;
        load(false);
      };
    }
    for (const id of ["timeline-order", "timeline-steps"]) marked($(id), data.masked);
  } catch (error) { say("error", error.message); }
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
$("lookup").addEventListener("submit", (event) => {
  event.preventDefault();
  lookup(new FormData($("lookup")).get("order_no"));
});
signIn();
