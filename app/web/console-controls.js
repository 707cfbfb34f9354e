// The console's Controls page and the overview's list of them (GET /controls/, app/web/controls.py):
// the effects people hold and the partitions they pause, group-wide, with who, why and until when;
// an operator holds, ends, pauses and resumes from here (each asks for a reason or a note, each
// audited under the person's name). Uses api(), $(), cell(), emptyRow(), timeCell() and operator()
// of console.js; every value from the server goes on the page as text.
"use strict";

(() => {
  // Every action says who acts (the console's name field; a person's own token names them whatever it says).
  function post(path, body) {
    const actor = $("actor").value.trim();
    const sent = actor ? { ...body, actor } : body;
    return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(sent) });
  }

  function message(text, isError) {
    $("controls-message").textContent = text;
    $("controls-message").className = isError ? "manual" : "";
  }

  function until(hold) {
    return hold.auto_release ? "ends by itself" : "until released";
  }

  function holdRows(tbody, holds, withActions) {
    tbody.replaceChildren();
    if (!holds.length) emptyRow(tbody, "No effect is held: every effect's records flow.", withActions ? 8 : 7);
    for (const hold of holds) {
      const tr = document.createElement("tr");
      tr.dataset.effect = hold.effect;
      cell(tr, hold.effect);
      cell(tr, hold.active ? (hold.overdue_seconds > 0 ? "held, past its planned end" : "held") : "to come");
      timeCell(tr, hold.starts_at);
      timeCell(tr, hold.ends_at);
      cell(tr, until(hold));
      cell(tr, hold.held_by);
      cell(tr, hold.reason);
      if (withActions) {
        const td = cell(tr, "");
        if (operator()) {
          const end = document.createElement("button");
          end.type = "button";
          end.textContent = "End";
          end.addEventListener("click", () => endHold(hold));
          td.appendChild(end);
        }
      }
      tbody.appendChild(tr);
    }
  }

  function pauseRows(tbody, pauses, withActions) {
    tbody.replaceChildren();
    if (!pauses.length) emptyRow(tbody, "No partition is paused.", withActions ? 5 : 4);
    for (const pause of pauses) {
      const tr = document.createElement("tr");
      tr.dataset.partition = String(pause.partition);
      cell(tr, `${pause.topic}[${pause.partition}]`);
      timeCell(tr, pause.paused_at);
      cell(tr, pause.paused_by);
      cell(tr, pause.reason);
      if (withActions) {
        const td = cell(tr, "");
        if (operator()) {
          const resume = document.createElement("button");
          resume.type = "button";
          resume.textContent = "Resume";
          resume.addEventListener("click", () => resumePartition(pause));
          td.appendChild(resume);
        }
      }
      tbody.appendChild(tr);
    }
  }

  async function endHold(hold) {
    const note = window.prompt(`End the hold of ${hold.effect}? Its held records go on. What changed?`);
    if (note === null) return;
    try {
      await post(`/controls/holds/${hold.id}/release`, { note });
      message(`The hold of ${hold.effect} ended: every worker lets its records go within seconds.`, false);
      loadControls();
    } catch (error) { message(error.message, true); }
  }

  async function resumePartition(pause) {
    const note = window.prompt(`Resume ${pause.topic}[${pause.partition}]? What was found?`);
    if (note === null) return;
    try {
      await post(`/controls/pauses/${pause.partition}/resume`, { note });
      message(`${pause.topic}[${pause.partition}] resumed.`, false);
      loadControls();
    } catch (error) { message(error.message, true); }
  }

  async function hold(event) {
    event.preventDefault();
    const form = $("hold-form");
    const body = { effect: form.elements.effect.value, reason: form.elements.reason.value,
                   until_released: form.elements.until_released.checked };
    const hours = form.elements.hours.value.trim();
    const end = form.elements.end.value.trim();
    if (end) body.end = end;
    else body.hours = Number(hours);
    if (form.elements.start.value.trim()) body.start = form.elements.start.value.trim();
    try {
      const made = await post("/controls/holds/", body);
      message(`${made.held.effect} is held (hold ${made.held.id}): every worker holds its records within seconds.`,
              false);
      form.reset();
      loadControls();
    } catch (error) { message(error.message, true); }
  }

  async function pause(event) {
    event.preventDefault();
    const form = $("pause-form");
    try {
      const made = await post("/controls/pauses/", { partition: Number(form.elements.partition.value),
                                                     reason: form.elements.reason.value });
      message(made.new ? `${made.paused.topic}[${made.paused.partition}] is paused.`
                       : `${made.paused.topic}[${made.paused.partition}] was paused already.`, false);
      form.reset();
      loadControls();
    } catch (error) { message(error.message, true); }
  }

  function audit(rows) {
    const tbody = $("controls-audit").tBodies[0];
    tbody.replaceChildren();
    if (!rows.length) emptyRow(tbody, "Nobody has held or paused anything yet.", 5);
    for (const row of rows) {
      const tr = document.createElement("tr");
      timeCell(tr, row.at);
      cell(tr, row.actor);
      cell(tr, row.action);
      cell(tr, row.target);
      cell(tr, row.note || "");
      tbody.appendChild(tr);
    }
  }

  async function loadControls() {
    $("controls-error").textContent = "";
    try {
      const data = await api("/controls/");
      holdRows($("controls-holds").tBodies[0], data.holds, true);
      pauseRows($("controls-pauses").tBodies[0], data.pauses, true);
      audit(data.audit);
      const select = $("hold-form").elements.effect;
      if (!select.options.length) {
        for (const effect of data.effects) {
          const option = document.createElement("option");
          option.value = option.textContent = effect;
          select.appendChild(option);
        }
      }
      $("pause-form").elements.partition.max = String(data.partitions - 1);
      $("controls-forms").hidden = !operator();
      $("controls-what").textContent = `Every worker reads these every ${data.refresh_seconds} s. A held effect's ` +
        "records wait before their claim (nothing is dead-lettered for it) and go on in their order when the hold " +
        `ends; a paused partition of ${data.topic} hands out no record until it is resumed.`;
    } catch (error) { $("controls-error").textContent = error.message; }
  }

  // On the overview: what is held or paused now, with who, why and until when.
  async function overviewControls() {
    try {
      const data = await api("/controls/");
      holdRows($("overview-holds").tBodies[0], data.holds.filter((h) => h.active), false);
      pauseRows($("overview-pauses").tBodies[0], data.pauses, false);
    } catch (error) {
      emptyRow($("overview-holds").tBodies[0], `The controls could not be read: ${error.message}`, 7);
    }
  }

  $("hold-form").addEventListener("submit", hold);
  $("pause-form").addEventListener("submit", pause);
  pageLoaders.controls = loadControls;
  const overview = pageLoaders.overview;
  pageLoaders.overview = async () => { await Promise.all([overview ? overview() : null, overviewControls()]); };
})();
