// The console's bulk panel: a bulk action on the queue's current filter (app/web/bulk.py).
// "Dry run" shows the exact count and a sample; "Start" asks for confirmation with that count
// and starts a job carrying it (refused if the queue moved beyond the tolerance); then the
// job's progress is polled until it ends, with pause, resume and abort. Uses api() and $()
// of console.js; every value from the server goes on the page with textContent.
"use strict";

(() => {
  const FILTERS = ["status", "reason", "order_no", "older_than", "fingerprint", "since", "until"];
  const FINISHED = ["done", "aborted"];
  let seen = null;            // the dry run the person saw: {action, filter, count}
  let jobId = null;
  let polling = null;

  function message(text, isError) {
    $("bulk-message").textContent = text;
    $("bulk-message").className = isError ? "manual" : "";
  }

  function currentFilter() {
    const filter = {};
    for (const [name, value] of new FormData($("filters"))) {
      if (value && FILTERS.includes(name)) filter[name] = String(value);
    }
    return filter;
  }

  function post(path, body) {
    return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  }

  function sample(items) {
    const tbody = $("bulk-sample").tBodies[0];
    tbody.replaceChildren();
    for (const item of items) {
      const tr = document.createElement("tr");
      for (const column of ["id", "status", "reason", "order_no", "first_failure_at"]) {
        const td = document.createElement("td");
        td.textContent = item[column] === null || item[column] === undefined ? "" : String(item[column]);
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
  }

  async function dryRun() {
    $("bulk-confirm").hidden = true;
    $("bulk-start").disabled = true;
    seen = null;
    const action = $("bulk-action").value;
    const filter = currentFilter();
    try {
      const found = await post("/bulk/dry-run", { action, filter });
      sample(found.sample);
      if (found.capped) {
        $("bulk-count").textContent = `More than ${found.cap} dead letters match: narrow the filter.`;
        return;
      }
      $("bulk-count").textContent = `${found.count} dead letters would be acted on (${action}); the first ` +
        `${found.sample.length} are below. The start is refused if the count moves by more than ${found.tolerance}.`;
      seen = { action, filter, count: found.count };
      $("bulk-start").disabled = found.count === 0;
      message("", false);
    } catch (error) {
      message(error.message, true);
    }
  }

  function askToStart() {
    if (!seen) return;
    $("bulk-confirm-text").textContent = `${seen.action} ${seen.count} dead letters? This runs in the background ` +
      "and every row is audited under your name.";
    $("bulk-confirm").hidden = false;
  }

  async function start() {
    $("bulk-confirm").hidden = true;
    if (!seen) return;
    try {
      const job = await post("/bulk/", { action: seen.action, filter: seen.filter, expected_count: seen.count,
                                         note: $("bulk-note").value || null, actor: $("actor").value.trim() });
      seen = null;
      $("bulk-start").disabled = true;
      message(`Job ${job.id} started.`, false);
      show(job);
      poll();
    } catch (error) {
      message(`${error.message}`, true);
    }
  }

  function show(job) {
    jobId = job.id;
    $("bulk-job").hidden = false;
    $("bulk-job-id").textContent = String(job.id);
    $("bulk-status").textContent = job.status;
    $("bulk-status").className = `status badge ${job.status}`;
    const rate = job.rate_per_second === null ? "" : `, ${job.rate_per_second} rows/s`;
    const eta = job.eta_seconds === null ? "" : `, about ${Math.round(job.eta_seconds)} s left`;
    $("bulk-progress").textContent = `${job.done} of ${job.total} done: ${job.changed} changed, ` +
      `${job.unchanged} unchanged, ${job.failed} failed, ${job.remaining} remaining${rate}${eta}`;
    $("bulk-bar").max = Math.max(job.total, 1);
    $("bulk-bar").value = job.done;
    const finished = FINISHED.includes(job.status);
    $("bulk-pause").disabled = job.status !== "running";
    $("bulk-resume").disabled = job.status !== "paused";
    $("bulk-abort").disabled = finished;
    const failures = $("bulk-failures").tBodies[0];
    failures.replaceChildren();
    for (const failure of job.failures || []) {
      const tr = document.createElement("tr");
      for (const value of [failure.compensation_id, failure.detail]) {
        const td = document.createElement("td");
        td.textContent = value === null ? "" : String(value);
        tr.appendChild(td);
      }
      failures.appendChild(tr);
    }
  }

  async function poll() {
    clearTimeout(polling);
    if (jobId === null) return;
    try {
      const job = await api(`/bulk/${jobId}`);
      show(job);
      if (FINISHED.includes(job.status)) return;
    } catch (error) {
      message(error.message, true);
    }
    polling = setTimeout(poll, 1000);
  }

  async function command(name) {
    try {
      show(await post(`/bulk/${jobId}/${name}`, { actor: $("actor").value.trim() }));
      poll();
    } catch (error) {
      message(error.message, true);
    }
  }

  $("bulk-dry-run").addEventListener("click", dryRun);
  $("bulk-start").addEventListener("click", askToStart);
  $("bulk-confirm-yes").addEventListener("click", start);
  $("bulk-confirm-no").addEventListener("click", () => { $("bulk-confirm").hidden = true; });
  for (const name of ["pause", "resume", "abort"]) {
    $(`bulk-${name}`).addEventListener("click", () => command(name));
  }
})();
