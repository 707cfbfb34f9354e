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

// Every call carries the token (the data views need one to read, actions to act).
async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const token = $("token").value.trim();
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({ error: `answer ${response.status} is not JSON` }));
  if (response.status === 401 || response.status === 403) {
    throw new Error(`${body.error || `answer ${response.status}`}: enter the token above`);
  }
  if (!response.ok) throw new Error(body.error || `answer ${response.status}`);
  return body;
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
  } catch (error) { say("error", error.message); }
}

$("token").value = sessionStorage.getItem("token") || "";
$("token").addEventListener("change", () => { sessionStorage.setItem("token", $("token").value); load(false); });
$("filters").addEventListener("submit", (event) => { event.preventDefault(); load(false); });
$("more").addEventListener("click", () => load(true));
for (const action of ["retry", "resolve", "discard"]) $(action).addEventListener("click", () => act(action));
$("lookup").addEventListener("submit", (event) => {
  event.preventDefault();
  lookup(new FormData($("lookup")).get("order_no"));
});
load(false);
