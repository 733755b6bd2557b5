// Streams a chat from the gateway (as the signed-in user) and then shows that request's own TTFT/TPOT.
const form = document.getElementById("playground");

async function readFigures(requestId) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const response = await fetch(`${form.dataset.recordUrl}${requestId}/`, { credentials: "same-origin" });
    if (response.ok) return response.json();
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return null;
}

function showFigures(record) {
  const table = document.getElementById("pg-figures");
  const format = { ttft_ms: 0, tpot_ms: 1, e2e_ms: 0 };
  for (const cell of table.querySelectorAll("[data-figure]")) {
    const value = record[cell.dataset.figure];
    cell.textContent = value === null || value === undefined ? "—"
      : cell.dataset.figure in format ? Number(value).toFixed(format[cell.dataset.figure]) : value;
  }
  table.hidden = false;
}

form?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const answer = document.getElementById("pg-answer");
  const error = document.getElementById("pg-error");
  answer.textContent = ""; error.textContent = "";
  document.getElementById("pg-figures").hidden = true;
  const data = new FormData(form);
  const messages = [];
  if (data.get("system")) messages.push({ role: "system", content: data.get("system") });
  messages.push({ role: "user", content: data.get("message") });
  const response = await fetch(form.dataset.url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": data.get("csrfmiddlewaretoken") },
    body: JSON.stringify({ model: data.get("deployment"), messages, stream: true,
                           max_tokens: Number(data.get("max_tokens")) }),
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    error.textContent = body.error?.message || `The gateway answered ${response.status}.`;
    return;
  }
  for await (const { data: chunk } of readEvents(response)) {
    if (chunk.error) error.textContent = chunk.error.message;
    answer.textContent += chunk.choices?.[0]?.delta?.content ?? "";
  }
  const record = await readFigures(response.headers.get("X-Request-Id"));
  if (record) showFigures(record);
});
