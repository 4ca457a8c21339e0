// gpugate dashboard: one EventSource for live state and events, one history fetch a minute.
"use strict";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const CLASSES = ["production", "interactive", "background", "benchmark", "maintenance"];
const PALETTE = ["#3b6ea8", "#5a9e6f", "#a8663b", "#7b5ea8", "#a83b6e", "#3b9ea8", "#8e9e3b", "#a89a3b"];
const KEEP_EVENTS = 60;
const KEEP_REFUSALS = 20;
const events = [];
const refusals = [];
const charts = {};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const sign = n < 0 ? "-" : "";
  n = Math.abs(n);
  return sign + (n >= GiB ? (n / GiB).toFixed(2) + " GiB" : Math.round(n / MiB) + " MiB");
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(0) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function colour(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

// The card's bytes, left to right: what nobody can use, what others hold, what the gate's
// consumers hold (each with its leased, still-loading part), the reserve, and what is free.
function segments(gpu) {
  const parts = [{ kind: "driver", name: "driver reserved", bytes: gpu.driver_reserved, colour: "#9e9e9e" }];
  for (const [name, n] of Object.entries(gpu.external)) {
    parts.push({ kind: "external", name, bytes: n, colour: "#c7a16b" });
  }
  for (const [name, row] of Object.entries(gpu.consumers)) {
    const leased = Math.min(row.pending, row.committed);
    parts.push({ kind: "consumer", name, bytes: row.committed - leased, colour: colour(name), committed: row.committed });
    if (leased > 0) parts.push({ kind: "leased", name, bytes: leased, colour: colour(name) });
  }
  parts.push({ kind: "reserve", name: "reserve", bytes: gpu.reserve, colour: "#d9c5c5" });
  parts.push({ kind: "free", name: "schedulable", bytes: gpu.schedulable, colour: "#e3efe3" });
  return parts;
}

function gpuCard(gpu) {
  let card = document.getElementById("gpu-" + gpu.index);
  if (!card) {
    card = el("div", { class: "gpu", id: "gpu-" + gpu.index, "data-gpu": gpu.index });
    card.append(el("h3"), el("div", { class: "meta" }), el("div", { class: "bar" }), el("div", { class: "legend" }),
      el("div", { class: "meta reserve-why" }));
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("viewBox", "0 0 1000 120");
    svg.setAttribute("preserveAspectRatio", "none");
    card.append(el("div", { class: "meta" }, "last 24 hours: used (external + committed) and the least schedulable per 5 minutes"), svg);
    document.getElementById("gpus").append(card);
    loadHistory(gpu.index);
  }
  return card;
}

function renderGpu(gpu, pressure, drains) {
  const card = gpuCard(gpu);
  const title = card.querySelector("h3");
  title.textContent = `GPU ${gpu.index} · ${gpu.name} · ${bytes(gpu.total)}`;
  if (pressure) title.append(" ", el("span", { class: "pressure", "data-pressure": "1" }, "PRESSURE"));
  if (gpu.paused) title.append(" ", pausedBadge(gpu));
  card.querySelector(".meta").textContent =
    `sample ${gpu.sample_age_seconds === null ? "-" : gpu.sample_age_seconds.toFixed(1) + "s"} old · ` +
    `schedulable ${bytes(gpu.schedulable)} · NVML used ${bytes(gpu.used)}, free ${bytes(gpu.free)}`;
  const bar = card.querySelector(".bar");
  const legend = card.querySelector(".legend");
  const parts = segments(gpu);
  // Segments are reused by key so the widths move (CSS transition) rather than jump.
  const seen = new Set();
  for (const part of parts) {
    const key = part.kind + ":" + part.name;
    seen.add(key);
    let seg = bar.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (!seg) {
      seg = el("div", { class: "seg" + (part.kind === "leased" ? " leased" : ""), "data-key": key });
      // The colour only: the `background` shorthand would reset the leased hatch's image.
      seg.style.backgroundColor = part.colour;
    }
    bar.append(seg);
    seg.style.flexBasis = (100 * Math.max(0, part.bytes) / gpu.total).toFixed(3) + "%";
    seg.title = `${part.name} (${part.kind}): ${bytes(part.bytes)}`;
    seg.setAttribute("data-bytes", part.bytes);
  }
  for (const seg of [...bar.children]) if (!seen.has(seg.getAttribute("data-key"))) seg.remove();
  // Why the reserve is what it is: its base, how far external use may rebound, the ceiling.
  const why = card.querySelector(".reserve-why");
  why.textContent = gpu.reserve_reason ? `reserve ${bytes(gpu.reserve)}: ${gpu.reserve_reason}` : "";
  why.hidden = !gpu.reserve_reason;
  legend.replaceChildren(...parts.map((part) =>
    el("span", { class: "item", "data-kind": part.kind, "data-name": part.name, "data-bytes": part.bytes },
      el("span", { class: "sw" + (part.kind === "leased" ? " leased" : "") , style: "" }),
      part.kind === "leased" ? part.name + " (leased)" : part.name, " ",
      el("span", { class: "bytes" }, bytes(part.bytes)),
      part.kind === "consumer" ? drainBadge(drains[part.name]) : null)));
  legend.querySelectorAll(".sw").forEach((sw, i) => { sw.style.backgroundColor = parts[i].colour; });
}

// When and by whom an operator action was taken, and the command that undoes it.
function since(held, by, undo) {
  const parts = [];
  if (held !== null && held !== undefined) parts.push("for " + seconds(held));
  if (by) parts.push("by " + by);
  return parts.join(" ") + (undo ? " · undo: " + undo : "");
}

function pausedBadge(gpu) {
  return el("span", { class: "badge warn operator", "data-paused": "1", title: since(gpu.paused_seconds, gpu.paused_by, gpu.undo) },
    "PAUSED" + (gpu.paused_seconds === null || gpu.paused_seconds === undefined ? "" : " " + seconds(gpu.paused_seconds)));
}

function drainBadge(consumer) {
  if (!consumer || !consumer.draining) return null;
  const state = consumer.drained ? "drained" : "draining";
  return el("span", { class: "badge warn operator", "data-draining": state, title: since(consumer.draining_seconds, consumer.draining_by, consumer.undo) },
    state.toUpperCase());
}

// The header's summary of what operators did that still holds: paused GPUs, draining consumers.
function renderOperator(doc) {
  const badge = document.getElementById("operator");
  const held = doc.gpus.filter((g) => g.paused).map((g) => `GPU ${g.index} paused`)
    .concat((doc.consumers || []).filter((c) => c.draining).map((c) => `${c.consumer} ${c.drained ? "drained" : "draining"}`));
  badge.textContent = held.join(" · ");
  badge.hidden = held.length === 0;
  badge.setAttribute("data-count", held.length);
}

function rows(tbody, items, render, empty) {
  tbody.replaceChildren(...(items.length ? items.map(render) : [el("tr", { class: "empty" }, el("td", { colSpan: 10 }, empty))]));
}

function render(doc) {
  document.getElementById("updated").textContent = "updated " + new Date(doc.time * 1000).toLocaleTimeString();
  const health = document.getElementById("health");
  health.textContent = doc.health.ok ? "healthy" : "unhealthy: " + doc.health.failed.join(", ");
  health.className = "badge" + (doc.health.ok ? "" : " bad");
  const drains = Object.fromEntries((doc.consumers || []).map((c) => [c.consumer, c]));
  renderOperator(doc);
  for (const gpu of doc.gpus) renderGpu(gpu, doc.pressure[String(gpu.index)], drains);
  const counts = Object.fromEntries(CLASSES.map((c) => [c, 0]));
  for (const t of doc.queue) counts[t.class] = (counts[t.class] || 0) + 1;
  document.getElementById("queue-classes").replaceChildren(...Object.entries(counts).map(([c, n]) =>
    el("span", { class: "badge" + (n ? " warn" : ""), "data-class": c, "data-count": n }, `${c} ${n}`)));
  // Each waiting demand with what it waits for, in one line (the reason's name on hover).
  rows(document.querySelector("#queue tbody"), doc.queue, (t) => el("tr", { "data-ticket": t.ticket, "data-reason": t.reason || "" },
    el("td", {}, t.consumer), el("td", {}, t.model), el("td", {}, t.class), el("td", {}, t.gpu),
    el("td", { class: "num" }, t.position), el("td", { class: "num" }, bytes(t.bytes)),
    el("td", { class: "num" }, seconds(t.waiting_seconds)), el("td", { class: "num" }, seconds(Math.max(0, t.deadline_in_seconds))),
    el("td", { class: "why", title: t.reason || "" }, t.line || "")), "nothing waits");
  rows(document.querySelector("#leases tbody"), doc.leases, (l) => el("tr", { "data-lease": l.id },
    el("td", {}, l.id), el("td", {}, l.consumer), el("td", {}, l.model), el("td", {}, l.class), el("td", {}, l.gpu),
    el("td", { class: "num" }, l.pending ? bytes(l.pending) : "-"), el("td", { class: "num" }, seconds(l.waited_seconds))), "no lease in flight");
  rows(document.querySelector("#residents tbody"), doc.residents, (r) => el("tr", { "data-model": r.model, "data-consumer": r.consumer },
    el("td", {}, r.consumer), el("td", {}, r.model + (r.out_of_band ? " (out of band)" : "")),
    el("td", { "data-spans": r.spans ? r.spans.join(",") : "" }, r.spans ? `${r.gpu} (split: ${r.spans.join(" + ")})` : r.gpu),
    el("td", { class: "num", "data-bytes": r.bytes }, bytes(r.bytes)), el("td", {}, r.state), el("td", {}, r.policy),
    el("td", {}, r.class), el("td", { class: "num" }, r.in_flight), el("td", { class: "num" }, r.in_flight ? "busy" : seconds(r.idle_seconds)),
    el("td", { class: "num" }, seconds(r.expires_in_seconds))), "no model resident");
}

// The last refusals, each with its reason in one line (the full message on hover).
function addRefusal(x) {
  refusals.unshift(x);
  refusals.length = Math.min(refusals.length, KEEP_REFUSALS);
  rows(document.querySelector("#refusals tbody"), refusals, (r) => el("tr", { class: "failure", "data-failure": r.failure },
    el("td", {}, new Date(r.time * 1000).toLocaleTimeString()), el("td", {}, r.consumer || ""), el("td", {}, r.model || ""),
    el("td", { class: "why", title: r.message || "" }, r.line || r.message || "")), "nothing refused");
}

function addEvent(e) {
  if (e.event === "failure") addRefusal(e);
  events.unshift(e);
  events.length = Math.min(events.length, KEEP_EVENTS);
  rows(document.querySelector("#events tbody"), events, (x) => {
    const failed = x.event === "failure";
    const detail = failed ? x.line || x.message || "" : x.reason || x.detail || (x.bytes !== undefined ? bytes(x.bytes) : "");
    return el("tr", { class: failed ? "failure" : "", "data-event": x.event },
      el("td", {}, new Date(x.time * 1000).toLocaleTimeString()),
      el("td", {}, failed ? el("span", { class: "class" }, x.failure) : x.event),
      el("td", {}, x.consumer || ""), el("td", {}, x.model || ""), el("td", { title: failed ? x.message || "" : "" }, detail));
  }, "no event yet");
}

async function loadHistory(gpu) {
  let doc;
  try {
    const resp = await fetch(`/gate/v1/history?gpu=${gpu}&since=24h&step=5m`);
    doc = await resp.json();
  } catch (err) {
    return;
  }
  const svg = document.querySelector(`#gpu-${gpu} svg.chart`);
  if (!svg) return;
  const now = Date.now() / 1000;
  const start = now - 86400;
  const points = doc.points;
  const top = Math.max(1, ...points.map((p) => p.total));
  const x = (t) => ((t - start) / 86400 * 1000).toFixed(1);
  const y = (b) => (110 - Math.max(0, b) / top * 100).toFixed(1);
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  for (let h = 0; h <= 24; h += 6) {
    const line = document.createElementNS(ns, "line");
    const at = start + h * 3600;
    line.setAttribute("x1", x(at)); line.setAttribute("x2", x(at));
    line.setAttribute("y1", 10); line.setAttribute("y2", 110); line.setAttribute("stroke", "#eee");
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", Math.min(985, Number(x(at)) + 2)); label.setAttribute("y", 119);
    label.textContent = h === 24 ? "now" : `-${24 - h}h`;
    parts.push(line, label);
  }
  if (points.length) {
    const used = document.createElementNS(ns, "polygon");
    const coords = points.map((p) => `${x(p.time)},${y(p.external + p.committed + p.driver_reserved)}`);
    used.setAttribute("points", `${x(points[0].time)},110 ${coords.join(" ")} ${x(points[points.length - 1].time)},110`);
    used.setAttribute("fill", "rgba(59,110,168,.35)");
    const sched = document.createElementNS(ns, "polyline");
    sched.setAttribute("points", points.map((p) => `${x(p.time)},${y(p.schedulable_min)}`).join(" "));
    sched.setAttribute("fill", "none"); sched.setAttribute("stroke", "#2e7d32"); sched.setAttribute("stroke-width", "1.5");
    parts.push(used, sched);
  }
  svg.setAttribute("data-points", points.length);
  svg.replaceChildren(...parts);
}

function connect() {
  const badge = document.getElementById("connection");
  const source = new EventSource("/gate/v1/stream");
  source.addEventListener("open", () => { badge.textContent = "live"; badge.className = "badge"; });
  source.addEventListener("error", () => { badge.textContent = "reconnecting"; badge.className = "badge off"; });
  source.addEventListener("snapshot", (m) => render(JSON.parse(m.data)));
  source.addEventListener("event", (m) => addEvent(JSON.parse(m.data)));
}

rows(document.querySelector("#events tbody"), [], null, "no event yet");
rows(document.querySelector("#refusals tbody"), [], null, "nothing refused");
connect();
setInterval(() => { for (const card of document.querySelectorAll(".gpu")) loadHistory(card.getAttribute("data-gpu")); }, 60000);
