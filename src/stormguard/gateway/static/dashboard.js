// stormguard gateway dashboard: polls /status twice a second and draws it, and
// /history (the last few minutes, kept by the gateway) twice a bucket for the charts
// (drawn by dashboard-charts.js). No framework, no build step. The cards' rates are
// differences between polls over the last few seconds.
// Contract (pinned): each upstream's breaker is an element with
// data-upstream="NAME" and data-breaker="closed|open|half_open" whose text names it.
"use strict";

const POLL_MS = 500;
const RATE_WINDOW_MS = 3000;
const HISTORY = 96;
const STATE_TEXT = { closed: "closed", open: "open", half_open: "half-open" };
const REASON_TEXT = {
  breaker_open: "breaker open",
  bulkhead_full: "bulkhead full",
  idempotency_conflict: "idempotency conflict",
  too_large: "too large",
  upstream_timeout: "upstream timeout",
  upstream_error: "upstream error (not a refusal)",
  not_found: "no route",
  client_gone: "client went away",
  concurrency_limit: "overloaded: concurrency limit",
  admission_control: "overloaded: admission control",
  "shed:critical": "shed (critical)",
  "shed:default": "shed (default)",
  "shed:sheddable": "shed (sheddable)",
};

// Outcomes that are not the gateway refusing anything: kept out of the refusal tables.
const NOT_REFUSALS = new Set(["allowed", "upstream_error", "client_gone", "not_found"]);

const samples = []; // {t, status}
const history = new Map(); // upstream -> [state, ...]
const cards = new Map(); // upstream -> {root, parts}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function reasonText(reason) {
  if (reason.startsWith("limited:")) return "over limit " + reason.slice(8);
  return REASON_TEXT[reason] || reason.replace(/_/g, " ");
}

function fmt(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return n.toLocaleString("en", { maximumFractionDigits: digits ?? 1 });
}

// Per second, from the oldest sample in the window to the newest.
function rate(pick) {
  if (samples.length < 2) return null;
  const last = samples[samples.length - 1];
  const first = samples.find((s) => last.t - s.t <= RATE_WINDOW_MS) || samples[0];
  const dt = (last.t - first.t) / 1000;
  if (dt <= 0) return null;
  return Math.max(0, (pick(last.status) - pick(first.status)) / dt);
}

function refusals(row) {
  let n = 0;
  for (const [k, v] of Object.entries(row || {})) if (!NOT_REFUSALS.has(k)) n += v;
  return n;
}

function replaceRows(tbody, rows, emptyText, columns) {
  tbody.replaceChildren();
  if (rows.length === 0) {
    tbody.append(el("tr", {}, el("td", { colspan: String(columns), class: "empty" }, emptyText)));
    return;
  }
  for (const row of rows) tbody.append(row);
}

function upstreamCard(name) {
  const badge = el("span", { class: "state closed", "data-upstream": name, "data-breaker": "closed",
    role: "status", "aria-label": "breaker of " + name }, "closed");
  const strip = el("div", { class: "history", role: "img" });
  const dd = {};
  const stats = el("dl", { class: "stats" });
  for (const [key, label] of [["rate", "Answers/s"], ["latency", "Latency p50 / p99"],
    ["bulkhead", "Bulkhead in flight"], ["overload", "Overload limit"], ["protocols", "Routes"]]) {
    dd[key] = el("dd", { "data-stat": key }, "–");
    stats.append(el("dt", {}, label), dd[key]);
  }
  const meter = el("meter", { min: "0", max: "1", value: "0", "aria-label": "bulkhead use of " + name });
  const used = el("span", {}, "–");
  dd.bulkhead.replaceChildren(meter, used);
  const tbody = el("tbody");
  const table = el("table", {},
    el("caption", { class: "visually-hidden" }, "Refusals by reason for " + name),
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Refused because"),
      el("th", { scope: "col", class: "num" }, "Total"), el("th", { scope: "col", class: "num" }, "Per second"))),
    tbody);
  const root = el("article", { class: "card", "aria-labelledby": "up-" + name },
    el("div", { class: "card-head" }, el("h3", { id: "up-" + name }, name), badge), strip, stats, table);
  return { root, badge, strip, dd, meter, used, tbody };
}

function drawUpstreams(status) {
  const container = document.getElementById("upstreams");
  for (const [name, up] of Object.entries(status.upstreams || {})) {
    let card = cards.get(name);
    if (!card) {
      card = upstreamCard(name);
      cards.set(name, card);
      container.append(card.root);
    }
    const state = STATE_TEXT[up.breaker] ? up.breaker : "closed";
    card.badge.className = "state " + state;
    card.badge.dataset.breaker = state;
    card.badge.textContent = STATE_TEXT[state];
    const past = history.get(name) || [];
    past.push(state);
    if (past.length > HISTORY) past.shift();
    history.set(name, past);
    card.strip.replaceChildren(...past.map((s) => el("span", { class: s, title: STATE_TEXT[s] })));
    const opened = past.filter((s) => s !== "closed").length;
    card.strip.setAttribute("aria-label",
      `breaker history of ${name}: ${opened} of the last ${past.length} updates not closed`);
    card.dd.rate.textContent = fmt(rate((s) => (s.upstreams?.[name]?.requests) || 0));
    const lat = up.latency_ms || {};
    card.dd.latency.textContent = `${fmt(lat.p50, 2)} ms / ${fmt(lat.p99, 2)} ms`;
    const limit = up.bulkhead_limit;
    card.used.textContent = limit ? ` ${up.in_flight} of ${limit}` : ` ${up.in_flight} (no bulkhead)`;
    card.meter.max = String(limit || 1);
    card.meter.value = String(Math.min(up.in_flight, limit || 1));
    const over = up.overload;
    card.dd.overload.textContent = !over ? "off"
      : `${over.limit ?? "–"}${over.adaptive ? " (adaptive)" : ""}, ${over.waiting} waiting`
        + (over.admission ? ", admission control" : "");
    const kinds = up.routes || {};
    card.dd.protocols.textContent = Object.entries(kinds).map(([r, k]) => `${r} (${k})`).join(", ") || "–";
    const totals = {};
    for (const route of Object.keys(kinds)) {
      for (const [reason, n] of Object.entries(status.routes?.[route] || {})) {
        if (!NOT_REFUSALS.has(reason)) totals[reason] = (totals[reason] || 0) + n;
      }
    }
    const rows = Object.entries(totals).sort((a, b) => b[1] - a[1]).map(([reason, n]) => {
      const r = rate((s) => Object.keys(kinds).reduce((acc, route) => acc + (s.routes?.[route]?.[reason] || 0), 0));
      return el("tr", { "data-upstream-reason": reason }, el("td", {}, reasonText(reason)),
        el("td", { class: "num" }, fmt(n, 0)), el("td", { class: "num" }, fmt(r)));
    });
    replaceRows(card.tbody, rows, "no refusals", 3);
  }
}

function drawTotals(status) {
  const totals = {};
  for (const row of Object.values(status.routes || {})) {
    for (const [reason, n] of Object.entries(row)) {
      if (!NOT_REFUSALS.has(reason)) totals[reason] = (totals[reason] || 0) + n;
    }
  }
  const rows = Object.entries(totals).sort((a, b) => b[1] - a[1]).map(([reason, n]) => {
    const r = rate((s) => Object.values(s.routes || {}).reduce((acc, row) => acc + (row[reason] || 0), 0));
    return el("tr", { "data-reason": reason }, el("th", { scope: "row" }, reasonText(reason)),
      el("td", { class: "num", "data-refusals": reason }, fmt(n, 0)), el("td", { class: "num" }, fmt(r)));
  });
  replaceRows(document.querySelector("#refusals tbody"), rows, "no refusals yet", 3);
}

function drawRoutes(status) {
  const owner = {};
  for (const [name, up] of Object.entries(status.upstreams || {})) {
    for (const [route, kind] of Object.entries(up.routes || {})) owner[route] = [name, kind];
  }
  const all = { ...Object.fromEntries(Object.keys(owner).map((r) => [r, { allowed: 0 }])),
    ...(status.routes || {}) };
  const rows = Object.entries(all).sort().map(([route, row]) => {
    const [upstream, kind] = owner[route] || ["–", route.startsWith("/") ? "http" : "grpc"];
    const reasons = Object.entries(row).filter(([k, n]) => k !== "allowed" && n > 0)
      .map(([k, n]) => `${reasonText(k)}: ${fmt(n, 0)}`).join(", ");
    return el("tr", { "data-route": route }, el("th", { scope: "row" }, route), el("td", {}, kind),
      el("td", {}, upstream),
      el("td", { class: "num" }, fmt(rate((s) => s.routes?.[route]?.allowed || 0))),
      el("td", { class: "num" }, fmt(rate((s) => refusals(s.routes?.[route])))),
      el("td", { class: "num" }, fmt(row.allowed || 0, 0)), el("td", {}, reasons || "–"));
  });
  replaceRows(document.querySelector("#routes tbody"), rows, "no requests yet", 7);
}

function drawClients(status) {
  const rows = (status.top_limited_clients || []).filter((c) => !NOT_REFUSALS.has(c.reason)).map((c) =>
    el("tr", { "data-client": c.client }, el("td", {}, el("code", {}, c.client)),
      el("td", {}, reasonText(c.reason)), el("td", { class: "num" }, fmt(c.refusals, 0))));
  replaceRows(document.querySelector("#clients tbody"), rows, "nobody has been refused", 3);
}

function drawWebSockets(status) {
  const configured = Object.values(status.upstreams || {}).flatMap((up) =>
    Object.entries(up.routes || {}).filter(([, kind]) => kind === "websocket").map(([r]) => r));
  const names = new Set([...configured, ...Object.keys(status.websockets || {}),
    ...Object.keys(status.websocket_messages || {})]);
  const rows = [...names].sort().map((route) => el("tr", { "data-ws-route": route },
    el("th", { scope: "row" }, route),
    el("td", { class: "num" }, fmt(status.websockets?.[route] || 0, 0)),
    el("td", { class: "num" }, fmt(rate((s) => s.websocket_messages?.[route]?.in || 0))),
    el("td", { class: "num" }, fmt(rate((s) => s.websocket_messages?.[route]?.out || 0)))));
  replaceRows(document.querySelector("#websockets tbody"), rows, "no WebSocket routes in use", 4);
}

function draw(status) {
  document.getElementById("listener").textContent = status.listener?.url || "–";
  document.getElementById("store").textContent = status.store || "–";
  document.getElementById("rate").textContent = fmt(rate((s) => s.requests_total || 0));
  document.getElementById("refused-rate").textContent =
    fmt(rate((s) => Object.values(s.routes || {}).reduce((acc, row) => acc + refusals(row), 0)));
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  drawUpstreams(status);
  drawTotals(status);
  drawRoutes(status);
  drawClients(status);
  drawWebSockets(status);
}

function setLink(state) {
  const link = document.getElementById("link");
  link.dataset.link = state;
  link.textContent = state;
}

async function poll() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 3000);
  try {
    const response = await fetch("/status", { cache: "no-store", signal: controller.signal });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const status = await response.json();
    const now = performance.now();
    samples.push({ t: now, status });
    while (samples.length > 2 && now - samples[1].t > RATE_WINDOW_MS) samples.shift();
    draw(status);
    setLink("live");
  } catch (err) {
    setLink("lost");
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);
  }
}

// -- the charts, from /history -------------------------------------------------------

const HISTORY_POLL_MS = 500; // at least: twice per bucket (a new bucket shows within half of one)
const WINDOWS = [30, 60, 120, 300, 600, 900, 1800, 3600]; // seconds shown (fitted to the data)
const ANSWER_COLOURS = { "2xx": "#116329", "3xx": "#0349b4", "4xx": "#9a6700", "5xx": "#cf222e",
  timeout: "#6639ba", connect_error: "#24292f" };
const ANSWER_TEXT = { timeout: "timeout", connect_error: "connect error" };
const REASON_COLOURS = ["#cf222e", "#9a6700", "#6639ba", "#0349b4", "#1b7c83", "#953800", "#57606a"];
const chartGroups = new Map(); // upstream -> {answers, latency, breaker}
let lastHistory = null;

function spanText(seconds) {
  return seconds % 60 === 0 ? `${seconds / 60} minute${seconds === 60 ? "" : "s"}` : `${seconds} seconds`;
}

function upstreamCharts(name) {
  const { chartBox } = window.stormguardCharts;
  const group = {
    answers: chartBox("answers:" + name, `${name}: answers/s by status`,
      { caption: "Answers/s by status class" }),
    latency: chartBox("latency:" + name, `${name}: latency p50 / p99`,
      { caption: "Latency p50 / p99 (time to the answer's head)" }),
    breaker: chartBox("breaker:" + name, `${name}: breaker`, { keys: false, caption: "Breaker" }),
  };
  const root = el("article", { class: "chart-group", "data-history-upstream": name },
    el("h3", {}, "Upstream " + name), group.answers, group.latency, group.breaker);
  document.getElementById("upstream-charts").append(root);
  return group;
}

function drawHistory(doc) {
  const { lineChart, bandChart } = window.stormguardCharts;
  // The time axis fits what the gateway has kept so far (a young gateway's first
  // seconds are not squeezed into the corner of five minutes), up to all it keeps.
  const kept = doc.t.length ? doc.t[doc.t.length - 1] - doc.t[0] + doc.bucket_seconds : 0;
  const span = Math.min(doc.span_seconds, WINDOWS.find((w) => w >= kept) || doc.span_seconds);
  const base = { t: doc.t, span, bucket: doc.bucket_seconds };
  document.getElementById("history-span").textContent = spanText(span);
  document.getElementById("history-kept").textContent = spanText(doc.span_seconds);
  document.getElementById("history-bucket").textContent = fmt(doc.bucket_seconds, 2);
  const outcomes = doc.outcomes || {};
  const zero = doc.t.map(() => 0);
  lineChart(document.querySelector('[data-chart="requests"]'), { ...base, unit: "/s", series: [
    { name: "requests", label: "all requests", colour: "#0349b4", values: doc.requests },
    { name: "allowed", label: "allowed", colour: "#116329", values: outcomes.allowed || zero, dashed: true },
  ] });
  const reasons = Object.keys(outcomes).filter((o) => !NOT_REFUSALS.has(o)).sort();
  lineChart(document.querySelector('[data-chart="refusals"]'), { ...base, unit: "/s",
    series: reasons.map((reason, i) => ({ name: reason, label: reasonText(reason),
      colour: REASON_COLOURS[i % REASON_COLOURS.length], values: outcomes[reason] })) });
  for (const [name, up] of Object.entries(doc.upstreams || {})) {
    let group = chartGroups.get(name);
    if (!group) {
      group = upstreamCharts(name);
      chartGroups.set(name, group);
    }
    lineChart(group.answers, { ...base, unit: "/s", band: up.breaker,
      series: Object.entries(up.answers).map(([cls, values]) => ({ name: cls,
        label: ANSWER_TEXT[cls] || cls, colour: ANSWER_COLOURS[cls] || "#57606a", values })) });
    lineChart(group.latency, { ...base, unit: " ms", height: 140, band: up.breaker, series: [
      { name: "p50", label: "p50", colour: "#0349b4", values: up.latency_ms.p50 },
      { name: "p99", label: "p99", colour: "#cf222e", values: up.latency_ms.p99, dashed: true },
    ] });
    bandChart(group.breaker, { ...base, states: up.breaker });
  }
}

async function pollHistory() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 3000);
  let wait = HISTORY_POLL_MS;
  try {
    const response = await fetch("/history", { cache: "no-store", signal: controller.signal });
    if (!response.ok) throw new Error("HTTP " + response.status);
    lastHistory = await response.json();
    wait = Math.max(HISTORY_POLL_MS, lastHistory.bucket_seconds * 500);
    drawHistory(lastHistory);
  } catch (err) {
    // the link state is /status's to show
  } finally {
    clearTimeout(timer);
    setTimeout(pollHistory, wait);
  }
}

let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => lastHistory && drawHistory(lastHistory), 100);
});

document.addEventListener("DOMContentLoaded", () => {
  poll();
  pollHistory();
});
