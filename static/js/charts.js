// Small SVG line charts for the deployment page: no charting library, so the appliance works offline.
const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#3b5bdb", "#e67700", "#c92a2a"];

function lineChart(svg, series, keys) {
  const width = 480, height = 160, pad = 28;
  svg.replaceChildren();
  const values = series.flatMap((point) => keys.map((key) => point[key])).filter((v) => v !== null);
  if (!values.length) {
    const empty = document.createElementNS(SVG_NS, "text");
    empty.setAttribute("x", width / 2); empty.setAttribute("y", height / 2);
    empty.setAttribute("text-anchor", "middle"); empty.setAttribute("class", "chart-empty");
    empty.textContent = gettext("no data yet");
    svg.appendChild(empty);
    return;
  }
  const top = Math.max(...values) * 1.1 || 1;
  const x = (i) => pad + (i * (width - 2 * pad)) / Math.max(series.length - 1, 1);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  const axis = document.createElementNS(SVG_NS, "text");
  axis.setAttribute("x", 2); axis.setAttribute("y", pad - 8); axis.setAttribute("class", "chart-axis");
  axis.textContent = top.toFixed(top < 10 ? 1 : 0);
  svg.appendChild(axis);
  keys.forEach((key, k) => {
    const points = series.map((p, i) => (p[key] === null ? null : `${x(i)},${y(p[key])}`)).filter(Boolean);
    const line = document.createElementNS(SVG_NS, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", COLOURS[k]); line.setAttribute("stroke-width", "2");
    svg.appendChild(line);
  });
}

async function drawDeploymentCharts(container) {
  const response = await fetch(container.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const summary = await response.json();
  lineChart(document.getElementById("chart-ttft"), summary.series, ["ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"]);
  lineChart(document.getElementById("chart-tpot"), summary.series, ["tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"]);
  lineChart(document.getElementById("chart-tps"), summary.series, ["tokens_per_s"]);
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
  lineChart(document.getElementById("chart-requests"), summary.series, ["requests"]);
  lineChart(document.getElementById("chart-errors"), summary.series, ["error_rate"]);
  lineChart(document.getElementById("chart-latency"), summary.series, ["latency_p50", "latency_p95"]);
  lineChart(document.getElementById("chart-ttft"), summary.series, ["ttft_p50", "ttft_p95"]);
  lineChart(document.getElementById("chart-feedback"), summary.series, ["feedback_ratio"]);
  const evals = summary.eval_history.map((run) => ({ "hit@k": run["hit@k"] ?? null, token_f1: run.token_f1 ?? null }));
  lineChart(document.getElementById("chart-eval"), evals, ["hit@k", "token_f1"]);
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
  lineChart(document.getElementById("chart-share"), summary.series, ["big_share", "small_share"]);
  lineChart(document.getElementById("chart-cost"), summary.series, ["big_cost", "small_cost"]);
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
