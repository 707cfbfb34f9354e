// Error groups on the console: the dead letters of one cause as one line, a chosen group's
// inflow drawn as SVG bars (built with DOM calls: the page allows no inline script and no
// library), and a click through to the queue filtered by the group. Uses `api` and `$` of
// console.js; every value goes on the page as text.
"use strict";

const GROUPS_SVG = "http://www.w3.org/2000/svg";

function groupsSay(message) { $("groups-error").textContent = message; }

function groupsAge(seconds) {
  if (seconds === null || seconds === undefined) return "none";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function groupsShare(share) { return share === null || share === undefined ? "" : `${Math.round(share * 100)} %`; }

function groupsCell(tr, value) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  tr.appendChild(td);
  return td;
}

function groupsQueueLine(queue) {
  return `queue depth ${queue.depth}, oldest open ${groupsAge(queue.oldest_open_age_seconds)}`;
}

function svgElement(name, attributes) {
  const element = document.createElementNS(GROUPS_SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  return element;
}

// One bar per bucket, scaled to the largest; each bar's title says its start and count.
function drawInflow(svg, series) {
  svg.replaceChildren();
  const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
  const left = 34, bottom = 16, top = 6;
  const most = Math.max(1, ...series.map((point) => point.letters));
  const step = (width - left) / Math.max(series.length, 1);
  svg.appendChild(svgElement("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  const peak = svgElement("text", { x: 0, y: top + 8 });
  peak.textContent = String(most);
  svg.appendChild(peak);
  series.forEach((point, index) => {
    const h = Math.round((point.letters / most) * (height - bottom - top));
    const bar = svgElement("rect", { class: "bar", x: left + index * step + 1, y: height - bottom - h,
                                     width: Math.max(step - 2, 1), height: h });
    bar.dataset.letters = point.letters;
    const title = svgElement("title", {});
    title.textContent = `${point.at} UTC: ${point.letters}`;
    bar.appendChild(title);
    svg.appendChild(bar);
  });
  for (const [index, anchor] of [[0, "start"], [series.length - 1, "end"]]) {
    if (!series[index]) continue;
    const label = svgElement("text", { x: index === 0 ? left : width, y: height - 3, "text-anchor": anchor });
    label.textContent = `${series[index].at.slice(5, 16).replace("T", " ")}`;
    svg.appendChild(label);
  }
}

async function showGroup(fingerprint) {
  try {
    const group = await api(`/groups/${encodeURIComponent(fingerprint)}`);
    $("group-detail").hidden = false;
    $("group-fingerprint").textContent = `${group.fingerprint} (${group.reason}, ${group.effect}, ${group.detail})`;
    const figures = $("group-figures");
    figures.replaceChildren();
    for (const [name, w] of Object.entries(group.windows)) {
      const line = document.createElement("div");
      line.textContent = `${name}: ${w.letters} letters, ${w.open} open (${groupsShare(w.open_share)}), ` +
        `${w.orders} orders, oldest open ${groupsAge(w.oldest_open_age_seconds)}`;
      figures.appendChild(line);
    }
    const queue = document.createElement("div");
    queue.textContent = `${groupsQueueLine(group.queue)}; sample: ${group.sample || ""}`;
    figures.appendChild(queue);
    $("group-queue").onclick = () => openGroupQueue(group.fingerprint);
    drawInflow($("chart-24h"), group.windows["24h"].series);
    drawInflow($("chart-7d"), group.windows["7d"].series);
  } catch (error) { groupsSay(error.message); }
}

// The queue page, filtered by the group.
function openGroupQueue(fingerprint) {
  go(`#/queue?fingerprint=${encodeURIComponent(fingerprint)}`);
}

async function loadGroups() {
  groupsSay("");
  const query = new URLSearchParams({ window: $("groups-window").value, status: $("groups-status").value });
  try {
    const data = await api(`/groups/?${query}`);
    $("groups-queue").textContent = groupsQueueLine(data.queue) +
      (data.more_groups ? `; ${data.more_groups} smaller groups not shown` : "");
    const tbody = $("groups-table").tBodies[0];
    tbody.replaceChildren();
    if (!data.groups.length) {
      emptyRow(tbody, $("groups-status").value === "unsettled"
        ? "No group has open letters: nothing waits for a person. Choose \"all\" to see the settled ones." :
        "No dead letter in this window. Choose the 7-day window to look further back.", 10);
    }
    for (const group of data.groups) {
      const tr = document.createElement("tr");
      tr.className = "row group";
      tr.dataset.fingerprint = group.fingerprint || "";
      for (const value of [group.fingerprint || "(none)", group.reason, group.effect, group.detail, group.letters])
        groupsCell(tr, value);
      timeCell(tr, group.first_seen);
      timeCell(tr, group.last_seen);
      for (const value of [group.orders, groupsShare(group.open_share), group.sample]) groupsCell(tr, value);
      if (group.fingerprint) {
        tr.addEventListener("click", () => showGroup(group.fingerprint));
      }
      tbody.appendChild(tr);
    }
  } catch (error) { groupsSay(error.message); }
}

// The types the upstreams publish that no step reads (UNHANDLED_EVENT_TYPES): how many were
// skipped, and where the latest one is, to look at it on the topic.
async function loadSkipped() {
  $("skipped-error").textContent = "";
  try {
    const data = await api("/skipped/");
    $("skipped-what").textContent = data.unhandled === "skip"
      ? `Records of these types were skipped (UNHANDLED_EVENT_TYPES=skip): acked and counted, never acted on. ` +
        `Handled: ${data.handled.join(", ")}. Counted by each worker every ${data.refresh_seconds} s. ` +
        "A type FOREIGN_EVENT_TYPES does not name is new for the alert NewEventTypeSkipped after its first record."
      : "Types not handled are dead-lettered (UNHANDLED_EVENT_TYPES=dead_letter, reason unknown_type); " +
        "these were skipped before.";
    const tbody = $("skipped-table").tBodies[0];
    tbody.replaceChildren();
    if (!data.types.length) {
      const tr = document.createElement("tr");
      groupsCell(tr, "None skipped: every type the upstreams published has a step that reads it.").colSpan = 5;
      tbody.appendChild(tr);
    }
    for (const type of data.types) {
      const tr = document.createElement("tr");
      tr.className = "row skipped-type";
      const at = type.topic === null ? "" : `${type.topic}[${type.partition}]@${type.offset}`;
      groupsCell(tr, type.declared ? `${type.event_type} (FOREIGN_EVENT_TYPES)` : type.event_type);
      groupsCell(tr, type.skipped);
      timeCell(tr, type.first_seen);
      timeCell(tr, type.last_seen);
      groupsCell(tr, at);
      tbody.appendChild(tr);
    }
  } catch (error) { $("skipped-error").textContent = error.message; }
}

$("groups-form").addEventListener("submit", (event) => { event.preventDefault(); loadGroups(); });
pageLoaders.groups = () => { loadGroups(); loadSkipped(); };      // each time the page is shown
