// stormguard gateway dashboard: time-series charts drawn as plain SVG (no library).
// Each chart is drawn into an element carrying data-chart="NAME"; what it shows is
// readable without knowing the layout:
//   path[data-series="NAME"]  one line per series, data-values="v1,v2,..." (one per
//                             bucket, oldest first; "" where there is no value)
//   rect[data-state="STATE"]  a breaker band's runs, data-from / data-to in the
//                             gateway's Unix seconds
// Times run from the end of the history (right edge, "now") back over its span; a
// bucket's value is drawn as a step over the bucket, from the previous one's end.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PAD = { left: 46, right: 10, top: 10, bottom: 22 };
const BAND_COLOURS = { closed: "#116329", half_open: "#b36b00", open: "#a40e26" };

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const child of children) node.append(child);
  return node;
}

// A round upper bound for the y axis: 1, 2 or 5 times a power of ten.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function tickText(v) {
  if (v >= 1000) return (v / 1000).toLocaleString("en", { maximumFractionDigits: 1 }) + "k";
  return v.toLocaleString("en", { maximumFractionDigits: 2 });
}

function ago(seconds) {
  if (seconds <= 0) return "now";
  if (seconds % 60 === 0) return `−${seconds / 60} min`;
  return `−${seconds} s`;
}

// The x axis: time ticks at round intervals back from the right edge.
function xAxis(root, x, t1, span, height) {
  const room = Math.max(2, Math.floor((x(t1) - x(t1 - span)) / 56)); // labels that fit
  const step = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800].find((s) => span / s <= room) || 3600;
  for (let back = 0; back <= span + 1e-9; back += step) {
    const px = x(t1 - back);
    root.append(svg("line", { x1: px, x2: px, y1: PAD.top, y2: height - PAD.bottom,
      stroke: "#d8dee4", "stroke-width": 1 }));
    const anchor = back === 0 ? "end" : px - PAD.left < 20 ? "start" : "middle";
    root.append(svg("text", { x: px, y: height - 6, "text-anchor": anchor, class: "tick" },
      ago(Math.round(back))));
  }
}

// Each bucket's time range: [end of the previous bucket, its own end].
function ranges(t, bucket) {
  return t.map((end, i) => [i > 0 ? Math.max(t[i - 1], end - 2 * bucket) : end - bucket, end]);
}

// Runs of equal state, merged: [{state, from, to}].
function runs(states, t, bucket) {
  const spans = ranges(t, bucket);
  const out = [];
  states.forEach((state, i) => {
    const [from, to] = spans[i];
    const last = out[out.length - 1];
    if (last && last.state === state && Math.abs(last.to - from) < 1e-6) last.to = to;
    else out.push({ state, from, to });
  });
  return out;
}

/**
 * A line chart into `box` (an element with data-chart): `opts` has
 *   t: [unix seconds], span: seconds shown, bucket: seconds, unit: "/s" | " ms",
 *   series: [{name, label, colour, values: [number|null], dashed?}],
 *   band: [state per bucket] (optional: open and half-open runs shade the plot).
 */
function plotWidth(box) {
  box.querySelector("svg.plot")?.remove(); // measured without the old drawing
  return Math.max(200, Math.floor(box.querySelector(".plot-area").clientWidth || 600));
}

function lineChart(box, opts) {
  const width = plotWidth(box);
  const height = opts.height || 170;
  const t1 = opts.t.length ? opts.t[opts.t.length - 1] : 0;
  const t0 = t1 - opts.span;
  const x = (t) => PAD.left + ((t - t0) / opts.span) * (width - PAD.left - PAD.right);
  let top = 0;
  for (const s of opts.series) for (const v of s.values) if (v !== null && v > top) top = v;
  const yMax = niceMax(top);
  const y = (v) => height - PAD.bottom - (v / yMax) * (height - PAD.top - PAD.bottom);
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
    "aria-hidden": "true", "data-t": opts.t.join(",") });
  if (opts.band) {
    for (const run of runs(opts.band, opts.t, opts.bucket)) {
      if (run.state === "closed" || run.to < t0) continue;
      const from = Math.max(run.from, t0);
      root.append(svg("rect", { x: x(from), y: PAD.top, width: Math.max(1, x(run.to) - x(from)),
        height: height - PAD.top - PAD.bottom, fill: BAND_COLOURS[run.state] || "#a40e26",
        "fill-opacity": 0.12, class: "shade" }));
    }
  }
  for (const v of [0, yMax / 2, yMax]) {
    root.append(svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y(v), y2: y(v),
      stroke: v === 0 ? "#8c959f" : "#d8dee4", "stroke-width": 1 }));
    root.append(svg("text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" },
      tickText(v)));
  }
  xAxis(root, x, t1, opts.span, height);
  // Steps: a bucket's value spans the bucket (as the band's runs do), so what
  // happened in one second lines up with the breaker's state over that second.
  const spans = ranges(opts.t, opts.bucket);
  for (const s of opts.series) {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined || spans[i][1] < t0) { pen = false; return; }
      const from = x(Math.max(spans[i][0], t0)).toFixed(1);
      const level = y(v).toFixed(1);
      d += `${pen ? "L" : "M"}${from},${level}L${x(spans[i][1]).toFixed(1)},${level}`;
      pen = true;
    });
    const attrs = { d: d || "M0,0", fill: "none", stroke: s.colour, "stroke-width": 2,
      "stroke-linejoin": "round", "data-series": s.name,
      "data-values": s.values.map((v) => (v === null || v === undefined ? "" : v)).join(",") };
    if (s.dashed) attrs["stroke-dasharray"] = "5 3";
    root.append(svg("path", attrs));
  }
  box.querySelector(".plot-area").append(root);
  legend(box, opts.series, opts.unit);
  const peaks = opts.series.map((s) => `${s.label} up to ${tickText(Math.max(0, ...s.values.filter((v) => v !== null)))}${opts.unit}`);
  box.setAttribute("aria-label", `${box.dataset.title}, last ${ago(opts.span).slice(1)}: ${peaks.join("; ") || "no data"}`);
}

function legend(box, series, unit) {
  const list = box.querySelector(".keys");
  list.replaceChildren();
  for (const s of series) {
    const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
    const swatch = svg("svg", { width: 14, height: 10, "aria-hidden": "true" },
      svg("line", { x1: 0, x2: 14, y1: 5, y2: 5, stroke: s.colour, "stroke-width": 3,
        ...(s.dashed ? { "stroke-dasharray": "4 2" } : {}) }));
    const item = document.createElement("li");
    item.append(swatch, ` ${s.label} `);
    const value = document.createElement("strong");
    value.textContent = last === undefined ? "–" : tickText(last) + unit;
    item.append(value);
    list.append(item);
  }
}

/** A breaker band into `box`: one coloured run per stretch of equal state. */
function bandChart(box, opts) {
  const width = plotWidth(box);
  const height = 44;
  const t1 = opts.t.length ? opts.t[opts.t.length - 1] : 0;
  const t0 = t1 - opts.span;
  const x = (t) => PAD.left + ((t - t0) / opts.span) * (width - PAD.left - PAD.right);
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
    "aria-hidden": "true" });
  root.append(svg("rect", { x: PAD.left, y: 4, width: width - PAD.left - PAD.right, height: 16,
    fill: "#eaeef2" }));
  const shown = runs(opts.states, opts.t, opts.bucket).filter((r) => r.to >= t0);
  for (const run of shown) {
    const from = Math.max(run.from, t0);
    root.append(svg("rect", { x: x(from).toFixed(1), y: 4, width: Math.max(1, x(run.to) - x(from)).toFixed(1),
      height: 16, fill: BAND_COLOURS[run.state] || "#4b535c", "data-state": run.state,
      "data-from": run.from.toFixed(3), "data-to": run.to.toFixed(3) }));
  }
  xAxis(root, x, t1, opts.span, height);
  box.querySelector(".plot-area").append(root);
  const opened = shown.filter((r) => r.state !== "closed")
    .reduce((acc, r) => acc + (r.to - Math.max(r.from, t0)), 0);
  box.setAttribute("aria-label", `${box.dataset.title}: not closed for ${Math.round(opened)} s of the last ${ago(opts.span).slice(1)}`);
}

/** The empty frame of a chart: a figure with data-chart, a caption, a plot area, keys. */
function chartBox(name, title, { keys = true, caption: shown = title } = {}) {
  const box = document.createElement("figure");
  box.className = "chart";
  box.dataset.chart = name;
  box.dataset.title = title;
  box.setAttribute("role", "img");
  const caption = document.createElement("figcaption");
  caption.textContent = shown;
  const area = document.createElement("div");
  area.className = "plot-area";
  box.append(caption, area);
  if (keys) {
    const list = document.createElement("ul");
    list.className = "keys";
    box.append(list);
  }
  return box;
}

window.stormguardCharts = { lineChart, bandChart, chartBox };
