// The one line-chart helper of the GUI: a value axis with its unit, a time axis (or a step/trial axis), a legend,
// an empty state, and a dot on every point so that a single point shows. SVG without a charting library, so the
// appliance works offline.
const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#3b5bdb", "#e67700", "#c92a2a", "#2b8a3e"];
const CHART = { width: 480, height: 160, left: 48, right: 14, top: 24, bottom: 22 };

function svgNode(parent, name, attributes, text) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  parent.appendChild(node);
  return node;
}

// Readable at any scale: a learning rate of 0.0002 reads "2.0e-4", not "0.0".
function chartNumber(value) {
  const size = Math.abs(value);
  if (size === 0) return "0";
  if (size < 0.01 || size >= 1e6) return value.toExponential(1);
  if (size < 10) return String(Number(value.toPrecision(2)));
  return Math.round(value).toLocaleString();
}

// The smallest 1, 2, 2.5 or 5 times a power of ten at or above `value`: round numbers on the value axis.
function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= value * (1 - 1e-9)) return step * magnitude;
  return 10 * magnitude;
}

// series: a list of points (objects); keys: the fields drawn, one line each. options: x (the field on the
// horizontal axis: "start" or "at" when present, else the point's position), xLabel (its name when not a time),
// unit (shown on the value axis and in the tooltips), labels ({key: legend name}), scale (a factor, 100 for shares
// shown in %).
function lineChart(svg, series, keys, options = {}) {
  const { width, height, left, right, top, bottom } = CHART;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const scale = options.scale ?? 1;
  const xKey = options.x ?? ["start", "at"].find((key) => series.length && key in series[0]);
  const isTime = xKey !== undefined && typeof series[0]?.[xKey] === "string";
  const xOf = (point, i) => (xKey === undefined ? i + 1 : isTime ? Date.parse(point[xKey]) : point[xKey]);
  const value = (point, key) => (point[key] === null || point[key] === undefined ? null : point[key] * scale);
  const values = series.flatMap((point) => keys.map((key) => value(point, key))).filter((v) => v !== null);
  if (!values.length) {
    svgNode(svg, "text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "chart-empty" },
      gettext("no data yet"));
    return;
  }
  const unit = options.unit ? ` ${options.unit}` : "";
  const xs = series.map(xOf);
  const [xMin, xMax] = [Math.min(...xs), Math.max(...xs)];
  const low = Math.min(0, ...values);
  const high = niceCeiling(Math.max(...values) - low) + low;
  const x = (v) => (xMax === xMin ? (left + width - right) / 2 : left + ((v - xMin) / (xMax - xMin)) * (width - left - right));
  const y = (v) => height - bottom - ((v - low) / (high - low)) * (height - top - bottom);

  // Value axis: three ticks with gridlines, the unit above them.
  for (const tick of [low, (low + high) / 2, high]) {
    svgNode(svg, "line", { x1: left, x2: width - right, y1: y(tick), y2: y(tick), class: "chart-grid" });
    svgNode(svg, "text", { x: left - 4, y: y(tick) + 4, "text-anchor": "end", class: "chart-axis" }, chartNumber(tick));
  }
  if (options.unit) svgNode(svg, "text", { x: 2, y: 12, class: "chart-axis chart-unit" }, options.unit);

  // Horizontal axis: times (hours and minutes, or dates beyond a day and a half), or steps.
  const span = xMax - xMin;
  const timeFormat = span > 36 * 3600 * 1000 ? { month: "numeric", day: "numeric" }
    : { hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
  const xText = (v) => (isTime ? new Date(v).toLocaleString(document.documentElement.lang || undefined, timeFormat)
    : chartNumber(v));
  const ticks = span ? [xMin, xMin + span / 2, xMax] : [xMin];
  ticks.forEach((tick, i) => {
    const anchor = ticks.length === 1 ? "middle" : ["start", "middle", "end"][i];
    svgNode(svg, "text", { x: x(tick), y: height - 6, "text-anchor": anchor, class: "chart-axis chart-x" }, xText(tick));
  });
  if (!isTime && options.xLabel) {
    svgNode(svg, "text", { x: 2, y: height - 6, class: "chart-axis" }, options.xLabel);
  }

  // Legend: one swatch and name per line, in the top row.
  let legendX = left + (options.unit ? Math.max(0, options.unit.length * 7 - left + 12) : 0);
  keys.forEach((key, k) => {
    const name = options.labels?.[key] ?? key;
    svgNode(svg, "rect", { x: legendX, y: 6, width: 12, height: 4, fill: COLOURS[k % COLOURS.length] });
    svgNode(svg, "text", { x: legendX + 16, y: 12, class: "chart-axis chart-legend" }, name);
    legendX += 28 + name.length * 7;
  });

  // Lines through consecutive points; a gap (no figure) breaks the line; a dot on every point, its figure as a tooltip.
  keys.forEach((key, k) => {
    const colour = COLOURS[k % COLOURS.length];
    let run = [];
    const flush = () => {
      if (run.length > 1) {
        svgNode(svg, "polyline", { points: run.join(" "), fill: "none", stroke: colour, "stroke-width": 2,
                                  class: "chart-line", "data-key": key });
      }
      run = [];
    };
    series.forEach((point, i) => {
      const v = value(point, key);
      if (v === null) { flush(); return; }
      const [px, py] = [x(xs[i]), y(v)];
      run.push(`${px},${py}`);
      const dot = svgNode(svg, "circle", { cx: px, cy: py, r: 2.5, fill: colour, class: "chart-point", "data-key": key });
      svgNode(dot, "title", {}, `${options.labels?.[key] ?? key} · ${xText(xs[i])}: ${chartNumber(v)}${unit}`);
    });
    flush();
  });
}

async function drawDeploymentCharts(container) {
  const response = await fetch(container.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const summary = await response.json();
  const percentiles = (name) => ({
    unit: "ms", labels: { [`${name}_p50_ms`]: "p50", [`${name}_p90_ms`]: "p90", [`${name}_p99_ms`]: "p99" } });
  lineChart(document.getElementById("chart-ttft"), summary.series, ["ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"],
    percentiles("ttft"));
  lineChart(document.getElementById("chart-tpot"), summary.series, ["tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"],
    percentiles("tpot"));
  lineChart(document.getElementById("chart-tps"), summary.series, ["tokens_per_s"],
    { unit: gettext("tokens/s"), labels: { tokens_per_s: gettext("per request") } });
  const o = summary.overall;
  const fmt = (v) => (v === null ? "—" : v.toFixed(0));
  document.getElementById("overall").textContent =
    `${o.requests} requests, ${o.errors} errors · TTFT p50 ${fmt(o.ttft_p50_ms)} ms, p90 ${fmt(o.ttft_p90_ms)} ms · ` +
    `TPOT p50 ${o.tpot_p50_ms === null ? "—" : o.tpot_p50_ms.toFixed(1)} ms`;
}

// A deployment's and its replicas' states as words in the page's language; the badge's class keeps the value.
const SERVING_STATE_LABELS = {
  pending: gettext("pending"), starting: gettext("starting"), ready: gettext("ready"), draining: gettext("draining"),
  stopped: gettext("stopped"), failed: gettext("failed"),
};
const servingStateLabel = (value) => SERVING_STATE_LABELS[value] || value;

function pollState(url) {
  const refresh = async () => {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) return;
    const live = await response.json();
    const badge = document.getElementById("deployment-state");
    badge.textContent = servingStateLabel(live.state); badge.className = `badge ${live.state}`;
    document.getElementById("deployment-start").hidden = live.stoppable;
    document.getElementById("deployment-stop").hidden = !live.stoppable;
    for (const replica of live.replicas) {
      const row = document.querySelector(`tr[data-replica="${replica.id}"]`);
      if (!row) continue;
      const state = row.querySelector('[data-field="state"]');
      state.textContent = servingStateLabel(replica.state); state.className = `badge ${replica.state}`;
      row.querySelector('[data-field="pid"]').textContent = replica.pid ?? "—";
      row.querySelector('[data-field="restarts"]').textContent = replica.restarts;
      row.querySelector('[data-field="last_error"]').textContent = replica.last_error.slice(0, 160);
      const engine = replica.engine && !replica.engine.error ? replica.engine : null;
      row.querySelector('[data-field="slots"]').textContent = engine ? `${engine.slots_busy} / ${engine.slots_total}` : "—";
      row.querySelector('[data-field="waiting"]').textContent = engine ? engine.requests_waiting : "—";
      row.querySelector('[data-field="kv_cache"]').textContent = engine && engine.kv_cache_use !== null
        ? `${(engine.kv_cache_use * 100).toFixed(1)}% of ${engine.kv_cache_capacity} tokens` : "—";
    }
  };
  setInterval(refresh, 2000);
}

async function drawAppCharts(container) {
  const response = await fetch(container.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const summary = await response.json();
  const chart = (id, keys, options) => lineChart(document.getElementById(id), summary.series, keys, options);
  chart("chart-requests", ["requests"], { labels: { requests: gettext("calls") } });
  chart("chart-errors", ["error_rate"], { unit: "%", scale: 100, labels: { error_rate: gettext("errors") } });
  chart("chart-latency", ["latency_p50", "latency_p95"], { unit: "ms", labels: { latency_p50: "p50", latency_p95: "p95" } });
  chart("chart-ttft", ["ttft_p50", "ttft_p95"], { unit: "ms", labels: { ttft_p50: "p50", ttft_p95: "p95" } });
  chart("chart-feedback", ["feedback_ratio"], { unit: "%", scale: 100, labels: { feedback_ratio: gettext("thumbs up") } });
  const evals = summary.eval_history.map((run) => ({
    at: run.at, "hit@k": run["hit@k"] ?? null, token_f1: run.token_f1 ?? null }));
  lineChart(document.getElementById("chart-eval"), evals, ["hit@k", "token_f1"], { labels: { token_f1: "token F1" } });
  const t = summary.totals;
  const votes = t.up + t.down;
  document.querySelector('[data-total="requests"]').textContent = t.requests;
  document.querySelector('[data-total="error_rate"]').textContent =
    t.requests ? `${((100 * t.errors) / t.requests).toFixed(1)}%` : "—";
  document.querySelector('[data-total="feedback"]').textContent = votes ? `${Math.round((100 * t.up) / votes)}%` : "—";
}

// A model group's page: the share of requests each member answered, and what each member cost, over time.
async function drawGroupShare(container, overall) {
  const response = await fetch(container.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const summary = await response.json();
  const members = (kind) => ({ [`big_${kind}`]: gettext("big"), [`small_${kind}`]: gettext("small") });
  lineChart(document.getElementById("chart-share"), summary.series, ["big_share", "small_share"],
    { unit: "%", scale: 100, labels: members("share") });
  lineChart(document.getElementById("chart-cost"), summary.series, ["big_cost", "small_cost"], { labels: members("cost") });
  const o = summary.overall;
  overall.textContent = overall.dataset.template.replace(/\{(\w+)\}/g, (_, key) => o[key]);
}

// The cost-quality curve of a calibration: x is the big model's share of tokens, y the quality relative to the big
// model alone (absolute quality where big-only scored 0); one line per policy. Clicking a point calls pick(policy,
// threshold).
function curveChart(svg, curves, pick) {
  const width = 480, height = 240, pad = 36;
  svg.replaceChildren();
  const policies = Object.keys(curves);
  const value = (p) => (p.relative_quality === null ? p.quality : p.relative_quality);
  const top = Math.max(1, ...policies.flatMap((policy) => curves[policy].map(value))) * 1.05;
  const x = (share) => pad + share * (width - 2 * pad);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  const text = (content, attributes) => {
    const node = document.createElementNS(SVG_NS, "text");
    for (const [name, v] of Object.entries(attributes)) node.setAttribute(name, v);
    node.setAttribute("class", "chart-axis");
    node.textContent = content;
    svg.appendChild(node);
  };
  text(svg.dataset.xLabel + " →", { x: width - pad, y: height - 6, "text-anchor": "end" });
  text("↑ " + svg.dataset.yLabel, { x: 2, y: 14 });
  text(top.toFixed(2), { x: 2, y: pad - 4 });
  const full = document.createElementNS(SVG_NS, "line");
  full.setAttribute("x1", x(0)); full.setAttribute("x2", x(1)); full.setAttribute("y1", y(1)); full.setAttribute("y2", y(1));
  full.setAttribute("stroke", "#adb5bd"); full.setAttribute("stroke-dasharray", "4 4");
  svg.appendChild(full);
  policies.forEach((policy, k) => {
    const points = [...curves[policy]].sort((a, b) => a.big_share_tokens - b.big_share_tokens);
    const line = document.createElementNS(SVG_NS, "polyline");
    line.setAttribute("points", points.map((p) => `${x(p.big_share_tokens)},${y(value(p))}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", COLOURS[k]); line.setAttribute("stroke-width", "2");
    svg.appendChild(line);
    for (const p of points) {
      const dot = document.createElementNS(SVG_NS, "circle");
      dot.setAttribute("cx", x(p.big_share_tokens)); dot.setAttribute("cy", y(value(p))); dot.setAttribute("r", 5);
      dot.setAttribute("fill", COLOURS[k]); dot.setAttribute("class", "curve-point");
      dot.dataset.policy = policy; dot.dataset.threshold = p.threshold;
      const title = document.createElementNS(SVG_NS, "title");
      title.textContent = `${policy} @ ${p.threshold}: big ${(100 * p.big_share_requests).toFixed(0)}% of requests, ` +
        `${(100 * p.big_share_tokens).toFixed(0)}% of tokens, quality ${p.quality}`;
      dot.appendChild(title);
      dot.addEventListener("click", () => pick(policy, p.threshold));
      svg.appendChild(dot);
    }
  });
}
