// The console's Reconcile section: the reconcile's latest runs (the timer's and people's), and a
// run's findings with their evidence. Values go on the page as text, never as HTML.
"use strict";

function reconcileCell(tr, value, cls) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

// A status cell (class "status <status>", for the selectors) holding its badge.
function reconcileBadge(tr, status) {
  const td = reconcileCell(tr, "", `status ${status}`);
  td.appendChild(badge(status));
  return td;
}

function reconcileEnds(ends) {
  return Object.entries(ends || {}).filter(([, n]) => n).map(([end, n]) => `${n} ${end}`).join(", ");
}

// The records skipped by type (a type not handled): the ones FOREIGN_EVENT_TYPES does not name say so.
function reconcileSkipped(types) {
  if (!types || !types.length) return "";
  return "; skipped by type: " + types.map((t) => t.type === null ? `${t.records} of other types`
    : `${t.records} ${JSON.stringify(t.type)}${t.declared ? "" : " (not in FOREIGN_EVENT_TYPES)"}`).join(", ");
}

async function loadReconcileRuns() {
  $("reconcile-error").textContent = "";
  try {
    const data = await api("/reconcile/runs/");
    const timer = data.timer;
    $("reconcile-what").textContent = timer.every_seconds
      ? `Every ${timer.every_seconds} s one worker reconciles the ${timer.window_seconds} s of order-event that ` +
        `ended ${timer.lag_seconds} s ago: each record must have reached an end (faust -A app reconcile runs one ` +
        "by hand). Click a run for its findings."
      : "The timer is off (RECONCILE_EVERY_SECONDS=0): these runs were started by hand (faust -A app reconcile).";
    const tbody = $("reconcile-runs").tBodies[0];
    tbody.replaceChildren();
    if (!data.runs.length) {
      const tr = document.createElement("tr");
      reconcileCell(tr, "No run yet: the timer runs one every few minutes (RECONCILE_EVERY_SECONDS), or run " +
                        "faust -A app reconcile --last 1h by hand.", "empty").colSpan = 7;
      tbody.appendChild(tr);
    }
    for (const run of data.runs) {
      const tr = document.createElement("tr");
      tr.className = "row reconcile-run";
      reconcileCell(tr, run.id);
      reconcileBadge(tr, run.status);
      timeCell(tr, run.range_from);
      timeCell(tr, run.range_to);
      for (const value of [run.records, run.findings, run.started_by]) reconcileCell(tr, value);
      tr.addEventListener("click", () => showReconcileRun(run.id));
      tbody.appendChild(tr);
    }
  } catch (error) { $("reconcile-error").textContent = error.message; }
}

async function showReconcileRun(id) {
  $("reconcile-error").textContent = "";
  try {
    const run = await api(`/reconcile/runs/${encodeURIComponent(id)}/`);
    const report = run.report || {};
    $("reconcile-run-title").textContent = `Run ${run.id}: ${run.status}, ${run.range_from} .. ${run.range_to}`;
    $("reconcile-run-figures").textContent = report.error
      ? `failed: ${report.error}`
      : `${report.records} records in ${report.seconds} s: ${reconcileEnds(report.ends)}` +
        reconcileSkipped(report.skipped_types);
    const tbody = $("reconcile-findings").tBodies[0];
    tbody.replaceChildren();
    for (const f of report.findings || []) {
      const tr = document.createElement("tr");
      tr.className = "row reconcile-finding";
      const steps = (f.steps || []).map((s) => s.row === null ? `${s.key}: no row`
        : `${s.key}: ${s.status} ${s.outcome || ""} (attempt ${s.attempt})`).join("; ");
      for (const value of [f.kind, `${f.topic}[${f.partition}]@${f.offset}`, f.order_no, f.type, f.why, steps]) {
        reconcileCell(tr, value);
      }
      tbody.appendChild(tr);
    }
    for (const f of (report.providers || {}).findings || []) {
      const tr = document.createElement("tr");
      tr.className = "row reconcile-finding provider";
      const foreign = (f.foreign || []).length ? `; not ours (never cancelled here): ${f.foreign.join(", ")}` : "";
      const held = f.kind === "duplicate" ? `keeps ${f.keeper}, extras ${(f.extras || []).join(", ") || "none"}${foreign}`
        : f.kind === "orphan" ? `${f.keeper} at the provider, no receipt here`
        : `the receipt's ${f.keeper} is not at the provider`;
      for (const value of [`provider ${f.kind}`, f.provider, f.order_no, f.effect, held, "a case below"]) {
        reconcileCell(tr, value);
      }
      tbody.appendChild(tr);
    }
    const input = Object.values(report.findings_by_kind || {}).reduce((a, b) => a + b, 0);
    if (input > (report.findings_shown || 0)) {
      $("reconcile-run-figures").textContent += `; the first ${report.findings_shown} of ${input} findings of the input`;
    }
    $("reconcile-run").hidden = false;
  } catch (error) { $("reconcile-error").textContent = error.message; }
}

// The cases the providers' side filed (a duplicate, an orphan, a missing waybill): an operator acts on
// one after typing its waybill, as the API asks (the confirmation names what the person saw).
const CASE_ACTIONS = { duplicate: ["compensate", "Cancel the extra waybill at the provider"],
                       orphan: ["adopt", "Adopt the waybill as the order's receipt"] };
let pendingCase = null;

async function loadCases() {
  try {
    const data = await api("/reconcile/cases/");
    const open = Object.entries(data.open || {}).filter(([, n]) => n).map(([kind, n]) => `${n} ${kind}`).join(", ");
    $("cases-what").textContent = open ? `Open: ${open}.` : "No open case.";
    const tbody = $("reconcile-cases").tBodies[0];
    tbody.replaceChildren();
    if (!data.items.length) {
      const tr = document.createElement("tr");
      reconcileCell(tr, "No case: the providers' listings agree with our receipts.", "empty").colSpan = 9;
      tbody.appendChild(tr);
    }
    for (const c of data.items) {
      const tr = document.createElement("tr");
      tr.className = "row reconcile-case";
      for (const value of [c.id, c.kind, c.effect, c.order_no, c.reference]) reconcileCell(tr, value);
      reconcileBadge(tr, c.status);
      timeCell(tr, c.found_at);
      timeCell(tr, c.last_seen_at);
      const td = reconcileCell(tr, "");
      // A waybill not issued under our tokens (or no longer cancellable) is never offered to cancel: why, instead.
      const refused = (c.evidence || {}).compensable === false ? (c.evidence.why_not || "not ours to cancel") : null;
      if (refused) td.textContent = refused;
      if (c.status === "open" && operator()) {
        const own = refused ? [null] : CASE_ACTIONS[c.kind];
        for (const [action, what] of [own || [null], ["dismiss", "Dismiss: nothing is done"]]) {
          if (!action) continue;
          const button = document.createElement("button");
          button.type = "button";
          button.textContent = action;
          button.addEventListener("click", () => askCase(c, action, what));
          td.appendChild(button);
        }
      }
      tbody.appendChild(tr);
    }
  } catch (error) { $("reconcile-error").textContent = error.message; }
}

function askCase(c, action, what) {
  pendingCase = { id: c.id, action };
  $("case-confirm-text").textContent = `${what}: case ${c.id}, ${c.kind} ${c.reference} of order ${c.order_no}.`;
  $("case-confirm-reference").value = "";
  $("case-confirm-note").value = "";
  $("case-confirm").hidden = false;
}

async function actOnCase() {
  if (!pendingCase) return;
  const { id, action } = pendingCase;
  try {
    await api(`/reconcile/cases/${encodeURIComponent(id)}/${action}`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ confirm: $("case-confirm-reference").value.trim(), note: $("case-confirm-note").value,
                             actor: $("actor").value.trim() }) });
    $("case-confirm").hidden = true;
    pendingCase = null;
  } catch (error) { $("reconcile-error").textContent = error.message; }
  loadCases();
}

$("case-confirm-yes").addEventListener("click", actOnCase);
$("case-confirm-no").addEventListener("click", () => { $("case-confirm").hidden = true; pendingCase = null; });
pageLoaders.reconcile = () => { loadReconcileRuns(); loadCases(); };      // each time the page is shown
