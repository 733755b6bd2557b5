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

// Each pane keeps its own conversation (its answers differ), sent whole with every new message: multi-turn chat.
const conversations = { "": [], "-compare": [] };

function turn(role, text) {
  const node = document.createElement("p");
  node.className = `turn ${role}`;
  node.textContent = text;
  return node;
}

async function streamInto(pane, model, system, message, sampling, csrfToken, signal) {
  const answer = document.getElementById(`pg-answer${pane}`);
  const error = document.getElementById(`pg-error${pane}`);
  const figures = document.getElementById(`pg-figures${pane}`);
  const log = document.getElementById(`pg-log${pane}`);
  const history = conversations[pane];
  // The previous answer joins the transcript; the new message follows it.
  if (answer.textContent) log.append(turn("assistant", answer.textContent));
  log.append(turn("user", message));
  answer.textContent = ""; error.textContent = ""; figures.hidden = true;
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...history,
                    { role: "user", content: message }];
  let response;
  try {
    response = await fetch(form.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      signal,
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
      body: JSON.stringify({ model, messages, stream: true, ...sampling }),
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
  } catch (exc) {
    // Stop closes the connection, and the gateway stops the engine; what was written so far stays in the chat.
    if (exc.name !== "AbortError") throw exc;
    history.push({ role: "user", content: message }, { role: "assistant", content: answer.textContent });
    error.textContent = gettext("(stopped)");
    return;
  }
  history.push({ role: "user", content: message }, { role: "assistant", content: answer.textContent });
  const record = await readFigures(response.headers.get("X-Request-Id"));
  if (record) showFigures(figures, record);
}

function showTurns() {
  const turns = conversations[""].length / 2;
  document.getElementById("pg-turns").textContent = turns
    ? interpolate(ngettext("%s earlier turn sent with each message", "%s earlier turns sent with each message", turns),
                  [turns]) : "";
}

function newChat() {
  for (const pane of Object.keys(conversations)) {
    conversations[pane] = [];
    document.getElementById(`pg-log${pane}`).replaceChildren();
    document.getElementById(`pg-answer${pane}`).textContent = "";
    document.getElementById(`pg-error${pane}`).textContent = "";
    document.getElementById(`pg-figures${pane}`).hidden = true;
  }
  showTurns();
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
  const message = data.get("message").trim();
  if (!message) return;
  const sampling = { max_tokens: Number(data.get("max_tokens")), temperature: Number(data.get("temperature")),
                     top_p: Number(data.get("top_p")) };
  const token = data.get("csrfmiddlewaretoken");
  const send = form.querySelector("button[type=submit]");
  const stop = document.getElementById("pg-stop");
  const controller = new AbortController();
  const stopped = () => controller.abort();
  form.elements.message.value = "";
  send.disabled = true;
  stop.addEventListener("click", stopped);
  stop.hidden = false;
  try {
    const chats = [streamInto("", data.get("deployment"), data.get("system"), message, sampling, token,
                              controller.signal)];
    if (data.get("compare")) {
      chats.push(streamInto("-compare", data.get("compare"), data.get("system"), message, sampling, token,
                            controller.signal));
    }
    await Promise.all(chats);
  } finally {
    stop.removeEventListener("click", stopped);
    send.disabled = false; stop.hidden = true;
    showTurns();
  }
});

document.getElementById("pg-new-chat")?.addEventListener("click", newChat);
// Another model or comparison starts a new conversation: the transcript would not be theirs.
for (const name of ["deployment", "compare"]) form?.elements[name].addEventListener("change", newChat);
