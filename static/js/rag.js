// RAG Studio pages: drag-and-drop upload with live progress, the streaming chat with citations, and the eval
// comparison chart. Plain DOM code and SVG, so the appliance works offline.
const csrf = () => document.querySelector("[name=csrfmiddlewaretoken]")?.value;

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text) node.textContent = text;
  return node;
}

// ---- documents: upload and progress ----
const uploadForm = document.getElementById("upload");
const documentsTable = document.getElementById("documents");

async function uploadFiles(files) {
  const outcomes = document.getElementById("upload-outcomes");
  const data = new FormData();
  for (const file of files) data.append("files", file);
  const response = await fetch(uploadForm.action, {
    method: "POST", body: data, credentials: "same-origin", headers: { "X-CSRFToken": csrf() },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    outcomes.replaceChildren(el("li", { class: "error-text" }, body.error?.message || interpolate(gettext("Upload failed (%s)"), [response.status])));
    return;
  }
  outcomes.replaceChildren(...body.outcomes.map((o) => el("li", { "data-outcome": o.status },
    o.status === "duplicate"
      ? interpolate(gettext("%(file)s: already in this knowledge base (as %(other)s)"),
                    { file: o.filename, other: o.duplicate_of }, true)
      : o.status === "failed" ? interpolate(gettext("%(file)s: failed: %(error)s"), { file: o.filename, error: o.error }, true)
        : `${o.filename}: ${stateLabel(o.status)}`)));
  refreshDocuments(true);
}

if (uploadForm) {
  const input = document.getElementById("upload-files");
  input.addEventListener("change", () => input.files.length && uploadFiles(input.files));
  for (const name of ["dragenter", "dragover"]) {
    uploadForm.addEventListener(name, (event) => { event.preventDefault(); uploadForm.classList.add("over"); });
  }
  for (const name of ["dragleave", "drop"]) {
    uploadForm.addEventListener(name, (event) => { event.preventDefault(); uploadForm.classList.remove("over"); });
  }
  uploadForm.addEventListener("drop", (event) => uploadFiles(event.dataTransfer.files));
}

// Document states and stages as words in the page's language; the badge's class keeps the value.
const STATE_LABELS = {
  uploaded: gettext("uploaded"), queued: gettext("queued"), processing: gettext("processing"),
  indexed: gettext("indexed"), failed: gettext("failed"), parse: gettext("parse"), ocr: gettext("OCR"),
  clean: gettext("clean"),
  screen: gettext("screen"), chunk: gettext("chunk"), embed: gettext("embed"), index: gettext("index"),
};
const stateLabel = (value) => STATE_LABELS[value] || value;

// A queued item's place in its line (cluster/queues.py), in the page's language.
function placeText(place) {
  if (!place) return "";
  const parts = [interpolate(gettext("#%(position)s in line · about %(seconds)s s"),
    { position: place.position, seconds: Math.round(place.estimated_start_s ?? 0) }, true)];
  if (place.ahead_in_your_workspace) {
    parts.push(interpolate(ngettext("%(count)s of yours ahead", "%(count)s of yours ahead",
      place.ahead_in_your_workspace), { count: place.ahead_in_your_workspace }, true));
  }
  parts.push(place.reason);
  return parts.join(" · ");
}

async function refreshDocuments(reloadOnNew = false) {
  const response = await fetch(documentsTable.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const live = await response.json();
  let unknown = false;
  for (const d of live.documents) {
    const row = documentsTable.querySelector(`tr[data-document="${d.id}"]`);
    if (!row) { unknown = true; continue; }
    const badge = row.querySelector('[data-field="status"]');
    badge.textContent = stateLabel(d.status); badge.className = `badge ${d.status}`;
    row.querySelector('[data-field="stage"]').textContent = stateLabel(d.stage);
    row.querySelector('[data-field="ocr"]').textContent = d.stage === "ocr" && d.ocr_pages_done < d.ocr_page_count
      ? interpolate(gettext("OCR page %(page)s of %(pages)s"), { page: d.ocr_pages_done + 1, pages: d.ocr_page_count },
                    true) : "";
    row.querySelector('[data-field="cancel"]').hidden = !["queued", "processing"].includes(d.status);
    row.querySelector('[data-field="error"]').textContent = d.error;
    row.querySelector('[data-field="queue"]').textContent = placeText(d.queue);
    row.querySelector('[data-field="progress"]').value = d.progress;
    row.querySelector('[data-field="percent"]').textContent = `${d.progress}%`;
    row.querySelector('[data-field="chunks"]').textContent = d.chunk_count;
    row.querySelector('[data-field="findings"]').textContent = d.finding_count;
  }
  // New rows carry server-rendered actions, so a new document reloads the page rather than building them here.
  if (unknown && reloadOnNew) window.location.reload();
}

if (documentsTable) setInterval(() => refreshDocuments(true), 1500);

// ---- the "create an app" wizard's indexing step ----
// Each document's state, place in line and progress are redrawn from the knowledge base's progress as they change;
// once none is queued or processing the page reloads, and the server offers Publish.
const wizardTable = document.getElementById("wizard-documents");

async function refreshWizard() {
  const response = await fetch(wizardTable.dataset.url, { credentials: "same-origin" });
  if (!response.ok) return;
  const { documents } = await response.json();
  for (const d of documents) {
    const row = wizardTable.querySelector(`tr[data-document="${d.id}"]`);
    if (!row) continue;
    const badge = row.querySelector('[data-field="status"]');
    badge.textContent = stateLabel(d.status); badge.className = `badge ${d.status}`;
    row.querySelector('[data-field="stage"]').textContent = d.status === "processing" ? stateLabel(d.stage) : "";
    row.querySelector('[data-field="queue"]').textContent = placeText(d.queue);
    row.querySelector('[data-field="progress"]').value = d.progress;
    row.querySelector('[data-field="percent"]').textContent = `${d.progress}%`;
  }
  const indexed = documents.filter((d) => d.status === "indexed").length;
  document.querySelector('#wizard-ready [data-field="indexed"]').textContent = interpolate(ngettext(
    "%(indexed)s of %(total)s document indexed", "%(indexed)s of %(total)s documents indexed", documents.length),
  { indexed, total: documents.length }, true);
  if (!documents.some((d) => ["queued", "processing"].includes(d.status))) window.location.reload();
}

if (wizardTable && document.querySelector("[data-busy]")) setInterval(refreshWizard, 1500);

// ---- chat ----
const chat = document.getElementById("chat");
const chatHistory = [];

function showSources(hits, cited) {
  const list = document.getElementById("chat-sources");
  list.replaceChildren(...hits.map((hit) => {
    const item = el("li", { "data-chunk": hit.chunk_id, value: hit.n });
    if (cited && cited.length && !cited.includes(hit.n)) item.classList.add("uncited");
    const where = hit.page ? `p. ${hit.page}` : `chars ${hit.start}–${hit.end}`;
    const score = hit.rerank ?? hit.fused;
    item.append(el("strong", {}, `[${hit.n}] ${hit.filename}`), ` ${where} · score ${Number(score).toFixed(3)}`,
      el("div", { class: "muted" }, hit.text.slice(0, 280)));
    return item;
  }));
}

// A sign of life at once: dots and what the pipeline is doing until the first token; Stop aborts the stream (the
// server stops generating when the connection closes) and keeps what was written so far.
function typingIndicator(text) {
  const indicator = el("span", { class: "typing", role: "status" });
  indicator.append(el("span", { class: "dots", "aria-hidden": "true" }, "•••"), el("span", { class: "typing-text" }, text));
  return indicator;
}

async function ask(question) {
  const log = document.getElementById("chat-log");
  const error = document.getElementById("chat-error");
  const send = document.querySelector("#chat-form button[type=submit]");
  const stop = document.getElementById("chat-stop");
  error.textContent = "";
  log.append(el("p", { class: "turn user" }, question));
  const answer = el("p", { class: "turn assistant answer pending" });
  const indicator = typingIndicator(gettext("Searching the documents…"));
  answer.append(indicator);
  log.append(answer);
  log.scrollTop = log.scrollHeight;
  const controller = new AbortController();
  const stopped = () => controller.abort();
  stop.addEventListener("click", stopped);
  send.disabled = true; stop.hidden = false;
  let written = "";
  const write = (text) => {
    if (!written) { indicator.remove(); answer.classList.remove("pending"); }
    written += text;
    answer.textContent = written;
    log.scrollTop = log.scrollHeight;
  };
  try {
    const response = await fetch(chat.dataset.url, {
      method: "POST", credentials: "same-origin", signal: controller.signal,
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify({ query: question, history: chatHistory }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      answer.remove();
      error.textContent = body.error?.message || interpolate(gettext("The chat failed (%s)."), [response.status]);
      return;
    }
    let hits = [];
    for await (const { event, data } of readEvents(response)) {
      if (event === "hits") {
        hits = data.hits; showSources(hits, null);
        indicator.querySelector(".typing-text").textContent = gettext("Writing the answer…");
      }
      if (event === "token") write(data.text);
      if (event === "error") { answer.remove(); error.textContent = data.message; }
      if (event === "done") {
        answer.dataset.done = "1";
        const cited = data.citations.filter((c) => c.cited).map((c) => c.n);
        showSources(hits, cited);
        chatHistory.push({ role: "user", content: question }, { role: "assistant", content: data.answer });
      }
    }
  } catch (exc) {
    if (exc.name !== "AbortError") throw exc;
    indicator.remove(); answer.classList.remove("pending");
    answer.dataset.stopped = "1";
    answer.append(el("span", { class: "muted small stopped-note" }, ` ${gettext("(stopped)")}`));
    if (written) chatHistory.push({ role: "user", content: question }, { role: "assistant", content: written });
  } finally {
    stop.removeEventListener("click", stopped);
    send.disabled = false; stop.hidden = true;
  }
}

document.getElementById("chat-form")?.addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("chat-input");
  const question = input.value.trim();
  if (question) { input.value = ""; ask(question); }
});

// ---- eval comparison ----
const SVG_NS = "http://www.w3.org/2000/svg";
const RUN_COLOURS = ["#3b5bdb", "#e67700", "#2b8a3e", "#c92a2a", "#7048e8", "#0c8599"];

function compareChart(svg, runs) {
  if (!runs.length) return;
  const names = Object.keys(runs[0].metrics).filter((n) => runs.some((r) => r.metrics[n] !== null));
  const width = 720, height = 190, pad = 24, group = (width - pad) / names.length;
  const bar = Math.min(18, (group - 10) / runs.length);
  names.forEach((name, i) => {
    runs.forEach((run, j) => {
      const value = run.metrics[name] ?? 0;
      const rect = document.createElementNS(SVG_NS, "rect");
      rect.setAttribute("x", pad + i * group + j * bar); rect.setAttribute("width", bar - 2);
      rect.setAttribute("y", height - value * (height - pad)); rect.setAttribute("height", value * (height - pad));
      rect.setAttribute("fill", RUN_COLOURS[j % RUN_COLOURS.length]);
      rect.append(Object.assign(document.createElementNS(SVG_NS, "title"), { textContent: `${run.label}: ${name} ${value.toFixed(3)}` }));
      svg.append(rect);
    });
    const label = document.createElementNS(SVG_NS, "text");
    label.setAttribute("x", pad + i * group); label.setAttribute("y", height + 16); label.setAttribute("class", "chart-axis");
    label.textContent = name;
    svg.append(label);
  });
  runs.forEach((run, j) => {
    const key = document.createElementNS(SVG_NS, "text");
    key.setAttribute("x", width - 220); key.setAttribute("y", 14 + j * 14); key.setAttribute("fill", RUN_COLOURS[j % RUN_COLOURS.length]);
    key.setAttribute("font-size", "12"); key.textContent = run.label;
    svg.append(key);
  });
}

const compareData = document.getElementById("compare-data");
if (compareData) compareChart(document.getElementById("compare-chart"), JSON.parse(compareData.textContent));
// Other pages with work under way (the eval sets being generated) reload until it ends.
if (document.querySelector("[data-busy]") && !wizardTable) setTimeout(() => window.location.reload(), 3000);
