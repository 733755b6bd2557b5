// The embeddable web chat: streams an app's answer with its sources, keeps the conversation, and sends
// thumbs up/down on each answer.
const form = document.getElementById("widget-form");
const log = document.getElementById("widget-log");
const errorLine = document.getElementById("widget-error");
const headers = { "Content-Type": "application/json", Authorization: `Bearer ${form.dataset.token}` };
let conversationId = null;

function turn(role, text) {
  const element = document.createElement("div");
  element.className = `turn ${role}`;
  element.textContent = text;
  log.append(element);
  log.scrollTop = log.scrollHeight;
  return element;
}

function showSources(answer, citations) {
  const list = document.createElement("ol");
  list.className = "sources";
  for (const c of citations) {
    const item = document.createElement("li");
    item.value = c.n;
    item.textContent = `${c.document}${c.page ? ` p.${c.page}` : ""}`;
    item.title = c.text;
    list.append(item);
  }
  answer.after(list);
  return list;
}

// Thumbs up and down as inline SVG (the paths of templates/_thumb.html): an emoji is an empty box where no emoji
// font is installed.
const THUMBS = {
  up: "M14 9V5a3 3 0 0 0-3-3l-4 9v11h11.28a2 2 0 0 0 2-1.7l1.38-9a2 2 0 0 0-2-2.3zM7 22H4a2 2 0 0 1-2-2v-7a2 2 0 0 1 2-2h3",
  down: "M10 15v4a3 3 0 0 0 3 3l4-9V2H5.72a2 2 0 0 0-2 1.7l-1.38 9a2 2 0 0 0 2 2.3zm7-13h2.67A2.31 2.31 0 0 1 22 4v7a2.31 2.31 0 0 1-2.33 2H17",
};

function thumb(rating) {
  const svgNs = "http://www.w3.org/2000/svg";
  const icon = document.createElementNS(svgNs, "svg");
  for (const [name, value] of Object.entries({ viewBox: "0 0 24 24", width: 16, height: 16, fill: "none",
    stroke: "currentColor", "stroke-width": 2, "stroke-linecap": "round", "stroke-linejoin": "round",
    "aria-hidden": "true", class: "icon thumb" })) icon.setAttribute(name, value);
  const path = document.createElementNS(svgNs, "path");
  path.setAttribute("d", THUMBS[rating]);
  icon.append(path);
  return icon;
}

function votes(after, messageId) {
  const box = document.createElement("div");
  box.className = "votes";
  for (const rating of ["up", "down"]) {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.rating = rating;
    button.append(thumb(rating));
    button.setAttribute("aria-label", rating === "up" ? gettext("Thumbs up") : gettext("Thumbs down"));
    button.setAttribute("aria-pressed", "false");
    button.addEventListener("click", async () => {
      const response = await fetch(form.dataset.feedbackUrl, {
        method: "POST", headers, body: JSON.stringify({ message_id: messageId, rating }),
      });
      if (!response.ok) return;
      box.querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
      box.parentElement.querySelector(".feedback-comment")?.remove();
      if (rating === "down") box.after(commentBox(messageId));
    });
    box.append(button);
  }
  after.after(box);
}

// After a thumbs down: an optional word on what was wrong, which the app's owners read in its logs.
function commentBox(messageId) {
  const box = document.createElement("form");
  box.className = "feedback-comment";
  const input = document.createElement("input");
  input.maxLength = 4000;
  input.placeholder = gettext("What was wrong? (optional)");
  input.setAttribute("aria-label", gettext("What was wrong? (optional)"));
  const send = document.createElement("button");
  send.type = "submit";
  send.textContent = gettext("Send feedback");
  box.append(input, send);
  box.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!input.value.trim()) { box.remove(); return; }
    const response = await fetch(form.dataset.feedbackUrl, {
      method: "POST", headers, body: JSON.stringify({ message_id: messageId, rating: "down", comment: input.value.trim() }),
    });
    if (response.ok) {
      const thanks = document.createElement("p");
      thanks.className = "muted small feedback-thanks";
      thanks.textContent = gettext("Thank you, the app's owners will see this.");
      box.replaceWith(thanks);
    }
  });
  return box;
}

// Stop aborts the fetch: the connection closes, and the server stops the engine writing the answer.
async function ask(query) {
  errorLine.textContent = "";
  turn("user", query);
  const answer = turn("assistant", "");
  const send = form.querySelector("button[type=submit]");
  const stop = document.getElementById("widget-stop");
  const controller = new AbortController();
  const stopped = () => controller.abort();
  stop.addEventListener("click", stopped);
  send.disabled = true; stop.hidden = false;
  try {
    const response = await fetch(form.dataset.chatUrl, {
      method: "POST", headers, signal: controller.signal,
      body: JSON.stringify({ query, stream: true, conversation_id: conversationId }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      errorLine.textContent = body.error?.message || interpolate(gettext("The chat failed (%s)."), [response.status]);
      answer.remove();
      return;
    }
    for await (const { event, data } of readEvents(response)) {
      if (event === "start") conversationId = data.conversation_id;
      else if (event === "token") { answer.textContent += data.text; log.scrollTop = log.scrollHeight; }
      else if (event === "done") {
        answer.textContent = data.answer;
        votes(showSources(answer, data.citations), data.message_id);
      } else if (event === "error") {
        // The page's language, not the API's English: the widget knows this failure by its code.
        errorLine.textContent = data.code === "answer_failed"
          ? interpolate(gettext("The app could not answer this question; its owners can see why in the app's logs (message %s)."), [data.message_id])
          : data.message;
      }
    }
  } catch (exc) {
    if (exc.name !== "AbortError") throw exc;
    answer.dataset.stopped = "1";
    answer.append(Object.assign(document.createElement("span"), { className: "muted small stopped-note",
                                                                   textContent: ` ${gettext("(stopped)")}` }));
  } finally {
    stop.removeEventListener("click", stopped);
    send.disabled = false; stop.hidden = true;
  }
}

// A suggested question is asked as typed; the suggestions go once the conversation has started.
for (const button of document.querySelectorAll("#widget-suggestions .suggestion")) {
  button.addEventListener("click", () => {
    document.getElementById("widget-suggestions").remove();
    ask(button.textContent);
  });
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("widget-input");
  const query = input.value.trim();
  if (!query) return;
  input.value = "";
  document.getElementById("widget-suggestions")?.remove();
  ask(query);
});
