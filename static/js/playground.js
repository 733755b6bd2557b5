// Streams a chat from the gateway (as the signed-in user) and then shows that request's own TTFT/TPOT. With a
// deployment chosen under "Compare with", the same messages go to both at once, each answer in its own pane.
const form = document.getElementById("playground");

async function readFigures(requestId) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const response = await fetch(`${form.dataset.recordUrl}${requestId}/`, { credentials: "same-origin" });
    if (response.ok) return response.json();
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return null;
}

function showFigures(table, record) {
  const format = { ttft_ms: 0, tpot_ms: 1, e2e_ms: 0 };
  for (const cell of table.querySelectorAll("[data-figure]")) {
    const value = record[cell.dataset.figure];
    cell.textContent = value === null || value === undefined ? "—"
      : cell.dataset.figure in format ? Number(value).toFixed(format[cell.dataset.figure]) : value;
  }
  table.hidden = false;
}

async function streamInto(pane, model, messages, maxTokens, csrfToken) {
  const answer = document.getElementById(`pg-answer${pane}`);
  const error = document.getElementById(`pg-error${pane}`);
  const figures = document.getElementById(`pg-figures${pane}`);
  answer.textContent = ""; error.textContent = ""; figures.hidden = true;
  const response = await fetch(form.dataset.url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
    body: JSON.stringify({ model, messages, stream: true, max_tokens: maxTokens }),
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    error.textContent = body.error?.message || interpolate(gettext("The gateway answered %s."), [response.status]);
    return;
  }
  for await (const { data: chunk } of readEvents(response)) {
    if (chunk.error) error.textContent = chunk.error.message;
    answer.textContent += chunk.choices?.[0]?.delta?.content ?? "";
  }
  const record = await readFigures(response.headers.get("X-Request-Id"));
  if (record) showFigures(figures, record);
}

function labelPanes() {
  const data = new FormData(form);
  const compare = data.get("compare");
  document.getElementById("pg-pane-compare").hidden = !compare;
  document.querySelector("#pg-pane [data-pane-model]").textContent = compare ? `: ${data.get("deployment")}` : "";
  document.querySelector("#pg-pane-compare [data-pane-model]").textContent = compare ? `: ${compare}` : "";
}

form?.addEventListener("change", labelPanes);
if (form) labelPanes();

form?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const data = new FormData(form);
  const messages = [];
  if (data.get("system")) messages.push({ role: "system", content: data.get("system") });
  messages.push({ role: "user", content: data.get("message") });
  const maxTokens = Number(data.get("max_tokens"));
  const token = data.get("csrfmiddlewaretoken");
  const chats = [streamInto("", data.get("deployment"), messages, maxTokens, token)];
  if (data.get("compare")) chats.push(streamInto("-compare", data.get("compare"), messages, maxTokens, token));
  await Promise.all(chats);
});
