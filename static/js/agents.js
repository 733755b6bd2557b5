// The agent debug chat: sends a turn through the REST API, follows the run's server-sent events (each step as it
// happens, the plan to approve, the answer), edits and approves plans, cancels runs and edits memory variables.
(() => {
  const root = document.querySelector(".agent-chat");
  if (!root) return;
  const agentId = root.dataset.agent;
  const csrf = root.querySelector("input[name=csrfmiddlewaretoken]").value;
  const log = root.querySelector(".messages-log");
  const trace = root.querySelector(".trace");
  const form = root.querySelector(".chat-form");
  const cancelButton = root.querySelector(".cancel-run");
  const editor = root.querySelector(".plan-editor");
  const steps = root.querySelector(".plan-steps");
  const variablesPanel = root.querySelector(".variables-panel");
  let threadId = null, runId = null, lastEventId = "0";

  const api = async (method, url, body) => {
    const response = await fetch(url, {method, headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
                                       body: body === undefined ? undefined : JSON.stringify(body)});
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data?.error?.message || `HTTP ${response.status}`);
    return data;
  };
  const say = (who, text, extra = "") => {
    const item = document.createElement("div");
    item.className = `msg ${who}`;
    item.dataset.role = who;
    item.textContent = text;
    if (extra) { const small = document.createElement("div"); small.className = "small muted"; small.textContent = extra; item.append(small); }
    log.append(item);
    return item;
  };
  const describe = (step) => {
    const d = step.detail || {};
    if (step.kind === "model") return d.tool_calls ? `→ ${d.tool_calls.map((c) => `${c.name}(${JSON.stringify(c.arguments)})`).join(", ")}` : (d.error || d.content || "");
    if (step.kind === "tool") return `${JSON.stringify(d.arguments)} → ${d.error || d.result}` + (d.injection_flags ? ` ⚠ ${d.injection_flags.join("; ")}` : "");
    if (step.kind === "plan") return (d.steps || []).map((s, i) => `${i + 1}. ${s}`).join("  ");
    if (step.kind === "memory") return JSON.stringify(d);
    return d.message || d.text || "";
  };
  const addStep = (step) => {
    const item = document.createElement("li");
    item.className = `step ${step.kind}${step.ok ? "" : " failed"}`;
    item.dataset.kind = step.kind;
    const timing = step.latency_ms ? ` · ${Math.round(step.latency_ms)} ms` : "";
    const tokens = step.output_tokens ? ` · ${step.input_tokens}+${step.output_tokens} tok` : "";
    item.innerHTML = `<strong></strong> <span class="muted"></span><div class="detail"></div>`;
    item.querySelector("strong").textContent = `${step.kind}: ${step.name}`;
    item.querySelector(".muted").textContent = timing + tokens;
    item.querySelector(".detail").textContent = describe(step);
    trace.append(item);
  };
  const stepRow = (text) => {
    const item = document.createElement("li");
    item.innerHTML = `<input class="plan-step" size="60"> <button type="button" class="small up" aria-label="${gettext("Move up")}">↑</button>` +
      `<button type="button" class="small down" aria-label="${gettext("Move down")}">↓</button><button type="button" class="small danger remove" aria-label="${gettext("Delete step")}">✕</button>`;
    item.querySelector("input").value = text;
    item.querySelector(".up").onclick = () => item.previousElementSibling && steps.insertBefore(item, item.previousElementSibling);
    item.querySelector(".down").onclick = () => item.nextElementSibling && steps.insertBefore(item.nextElementSibling, item);
    item.querySelector(".remove").onclick = () => item.remove();
    steps.append(item);
  };
  const showPlan = (plan) => { steps.innerHTML = ""; plan.forEach(stepRow); editor.hidden = false; };
  const busy = (on) => { form.querySelector("button[type=submit]").disabled = on; cancelButton.hidden = !on; };

  const loadVariables = async () => {
    if (!threadId) return;
    const data = await api("GET", `/api/agents/threads/${threadId}/variables/`);
    variablesPanel.innerHTML = "";
    variablesPanel.classList.remove("muted");
    if (!data.variables.length) { variablesPanel.textContent = "—"; return; }
    for (const variable of data.variables) {
      const row = document.createElement("div");
      row.className = "fields-row variable";
      row.dataset.variable = variable.name;
      row.innerHTML = `<label><span></span><input class="value"></label><button type="button" class="small">Save</button>`;
      row.querySelector("span").textContent = `${variable.name} (${variable.type}, ${variable.scope})`;
      row.querySelector("input").value = variable.value === null ? "" : (variable.type === "string" ? variable.value : JSON.stringify(variable.value));
      row.querySelector("button").onclick = async () => {
        const text = row.querySelector("input").value;
        const value = variable.type === "string" ? text : JSON.parse(text || "null");
        try { await api("PUT", `/api/agents/threads/${threadId}/variables/`, {name: variable.name, value}); }
        catch (error) { say("error", error.message); }
      };
      variablesPanel.append(row);
    }
  };

  const follow = async () => {
    busy(true);
    // The answer as it is written (data-role "writing"); the run's outcome takes its place.
    let writing = null;
    const write = (text) => {
      if (!writing) { writing = say("assistant", ""); writing.dataset.role = "writing"; }
      writing.textContent += text;
    };
    const outcome = (...args) => { writing?.remove(); writing = null; say(...args); };
    try {
      const response = await fetch(`/api/agents/runs/${runId}/events/?after=${lastEventId}`);
      for await (const {event, data, id} of readEvents(response)) {
        if (id) lastEventId = id;
        if (event === "step") addStep(data);
        else if (event === "token") write(data.text);
        else if (event === "plan") { showPlan(data.plan); break; }
        else if (event === "done") {
          const sources = (data.citations || []).map((c) => `[${c.n}] ${c.document}`).join("  ");
          outcome("assistant", data.answer, sources);
          break;
        } else if (event === "error") { outcome("error", data.error); break; }
        else if (event === "cancelled") { outcome("error", data.error || gettext("Cancelled.")); break; }
      }
    } finally { writing?.remove(); busy(false); await loadVariables(); }
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = form.querySelector("textarea");
    const text = input.value.trim();
    if (!text) return;
    say("user", text);
    input.value = "";
    editor.hidden = true;
    try {
      const run = await api("POST", `/api/agents/${agentId}/runs/`, {input: text, thread_id: threadId || ""});
      threadId = run.thread_id; runId = run.run_id; lastEventId = "0";
      await follow();
    } catch (error) { say("error", error.message); busy(false); }
  });
  root.querySelector(".add-step").onclick = () => stepRow("");
  root.querySelector(".approve-plan").onclick = async () => {
    const plan = [...steps.querySelectorAll("input.plan-step")].map((input) => input.value.trim()).filter(Boolean);
    try { await api("POST", `/api/agents/runs/${runId}/approve/`, {plan}); editor.hidden = true; await follow(); }
    catch (error) { say("error", error.message); }
  };
  cancelButton.onclick = async () => { try { await api("POST", `/api/agents/runs/${runId}/cancel/`); } catch (error) { say("error", error.message); } };
  root.querySelector(".new-thread").onclick = () => { threadId = null; log.innerHTML = ""; trace.innerHTML = ""; editor.hidden = true; };
})();
