// The console's overview (its first page) and its list of bulk jobs: GET /overview/ and GET /bulk/.
// Uses api(), $(), the cells and badges of console.js and drawInflow() of console-groups.js; every
// value from the server goes on the page as text.
"use strict";

function progressText(job) {
  return `${job.done} of ${job.total} done (${job.changed} changed, ${job.failed} failed)`;
}

function filterText(filter) {
  const parts = Object.entries(filter || {}).filter(([, value]) => value !== null && value !== "");
  return parts.length ? parts.map(([name, value]) => `${name}=${value}`).join(", ") : "the whole queue";
}

function overviewQueue(data) {
  statusCounts($("overview-statuses"), data.by_status, new Set(data.capped || []), true);
  const empty = !Object.keys(data.by_status).length;
  $("overview-empty").hidden = !empty;
  if (empty) {
    const item = document.createElement("li");
    item.className = "empty";
    item.textContent = "empty";
    $("overview-statuses").appendChild(item);
  }
  const oldest = $("overview-oldest");
  oldest.replaceChildren();
  if (data.queue.oldest_open_at === null) oldest.textContent = "none open";
  else oldest.appendChild(timeElement(data.queue.oldest_open_at));
  $("overview-depth").textContent = `${data.queue.depth} open, retrying or waiting for a person`;
}

function overviewInflow(inflow) {
  const box = $("overview-inflow");
  box.replaceChildren();
  for (const [name, label] of [["24h", "last 24 hours"], ["7d", "last 7 days"]]) {
    const line = document.createElement("div");
    const figure = document.createElement("span");
    figure.className = "figure";
    figure.textContent = String(inflow[name].letters);
    line.append(figure, ` dead letters, ${label}`);
    box.appendChild(line);
  }
  drawInflow($("overview-24h"), inflow["24h"].series);
  drawInflow($("overview-7d"), inflow["7d"].series);
}

function overviewGroups(groups, more) {
  const tbody = $("overview-groups").tBodies[0];
  tbody.replaceChildren();
  if (!groups.length) emptyRow(tbody, "No error group has open letters.", 6);
  for (const group of groups) {
    const tr = document.createElement("tr");
    const td = cell(tr, "");
    const link = document.createElement("a");
    link.href = group.fingerprint ? `#/queue?fingerprint=${encodeURIComponent(group.fingerprint)}` : "#/queue";
    link.textContent = group.fingerprint || "(none)";
    link.title = "its open letters in the queue";
    td.appendChild(link);
    cell(tr, group.reason);
    cell(tr, group.effect);
    cell(tr, group.open_total);
    timeCell(tr, group.oldest_open_at);
    timeCell(tr, group.last_seen);
    tbody.appendChild(tr);
  }
  if (more) emptyRow(tbody, `${more} more groups: see Error groups.`, 6);
}

function bulkRow(job, withFilter) {
  const tr = document.createElement("tr");
  cell(tr, job.id);
  cell(tr, job.action);
  badgeCell(tr, job.status);
  const td = cell(tr, "");
  const bar = document.createElement("progress");
  bar.max = Math.max(job.total, 1);
  bar.value = job.done;
  td.append(bar, ` ${progressText(job)}`);
  if (withFilter) cell(tr, filterText(job.filter));
  cell(tr, job.created_by);
  timeCell(tr, job.created_at);
  if (withFilter) timeCell(tr, job.finished_at);
  return tr;
}

function overviewBulk(jobs) {
  const tbody = $("overview-bulk").tBodies[0];
  tbody.replaceChildren();
  if (!jobs.length) emptyRow(tbody, "No bulk job is running or paused. To start one: Queue, filter, Dry run, Start.", 6);
  for (const job of jobs) tbody.appendChild(bulkRow(job, false));
}

const BREAKER = { closed: "closed", open: "provider-open", probing: "probing" };

function overviewProviders(providers) {
  const tbody = $("overview-providers").tBodies[0];
  tbody.replaceChildren();
  if (!providers.length) emptyRow(tbody, "This worker calls no provider.", 6);
  for (const p of providers) {
    const tr = document.createElement("tr");
    tr.dataset.effect = p.effect;
    cell(tr, p.effect);
    const td = cell(tr, "");
    const state = badge(BREAKER[p.state] || p.state, p.state === "closed" ? "up (closed)" : p.state);
    td.appendChild(state);
    cell(tr, `${p.recent_requests} in ${p.window_seconds} s`);
    cell(tr, p.recent_failed);
    cell(tr, p.open_seconds === null ? "" : `${duration(p.open_seconds)}, next probe in ${duration(p.next_probe_seconds)}`);
    cell(tr, p.last_failure || "");
    tbody.appendChild(tr);
  }
}

async function loadOverview() {
  $("overview-error").textContent = "";
  try {
    const data = await api("/overview/");
    $("overview-body").hidden = false;
    overviewQueue(data);
    overviewInflow(data.inflow);
    overviewGroups(data.top_groups, data.more_groups);
    overviewBulk(data.bulk_in_progress);
    overviewProviders(data.providers);
  } catch (error) {
    $("overview-body").hidden = true;           // figures of an earlier read would mislead
    $("overview-empty").hidden = true;
    $("overview-error").textContent = `The overview could not be read: ${error.message}`;
  }
}

async function loadBulkJobs() {
  $("bulk-jobs-error").textContent = "";
  try {
    const data = await api("/bulk/");
    const tbody = $("bulk-jobs").tBodies[0];
    tbody.replaceChildren();
    if (!data.items.length) emptyRow(tbody, "No bulk job yet.", 8);
    for (const job of data.items) tbody.appendChild(bulkRow(job, true));
  } catch (error) { $("bulk-jobs-error").textContent = error.message; }
}

pageLoaders.overview = loadOverview;
pageLoaders.bulk = loadBulkJobs;
