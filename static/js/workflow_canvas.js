// The workflow canvas (templates/workflows/canvas.html) on the vendored Drawflow library: nodes dragged from the
// palette, wired output to input (a condition's or classifier's branches are separate outputs), edited in the side
// panel with pickers and a variable picker; saved, validated, run and followed live (server-sent events) through
// the REST API under /api/workflows/; version history with a diff and rollback. The graph format is
// agent_studio/workflows/graph.py's; it has no positions: the workflow's layout (saved apart from the graph, so
// moving a node makes no version) keeps them, and nodes it does not place are laid out by depth (see layOut). Editing
// as in other flow editors: Delete or Backspace removes the selected wire or node, Ctrl+Z / Ctrl+Shift+Z (Ctrl+Y)
// undo and redo, Ctrl+C / Ctrl+V copy a node under a fresh id.
(() => {
  const root = document.querySelector(".workflow-canvas");
  if (!root) return;
  const data = JSON.parse(document.getElementById("workflow-data").textContent);
  const catalogue = data.catalogue;
  const canEdit = root.dataset.canEdit === "true";
  const csrf = root.querySelector("input[name=csrfmiddlewaretoken]").value;
  const API = "/api/workflows/";
  const NODE_ID = /^[A-Za-z][A-Za-z0-9_]{0,63}$/;
  const RESERVED = new Set(["item", "outputs", "settled"]);
  // The least zoom, for Fit and the zoom buttons alike: the nodes' text is still legible there.
  const MIN_ZOOM = 0.45;
  const FIT_MARGIN = 16;
  const HISTORY_LIMIT = 100;
  const STATUS_LABELS = {queued: gettext("Queued"), running: gettext("Running"), done: gettext("Done"),
                         failed: gettext("Failed"), skipped: gettext("Skipped"), cancelled: gettext("Cancelled")};
  // Each kind's label, outputs and flags come from its record on the server (agent_studio/workflows/kinds.py).
  const kindLabel = (kind) => catalogue.kinds[kind]?.label || kind;
  const OP_LABELS = {eq: "=", ne: "≠", gt: ">", ge: "≥", lt: "<", le: "≤", contains: gettext("contains"),
                     not_contains: gettext("does not contain"), starts_with: gettext("starts with"),
                     ends_with: gettext("ends with"), empty: gettext("is empty"), not_empty: gettext("is not empty"),
                     in: gettext("is one of (a JSON list)")};
  const TYPE_LABELS = {string: gettext("text"), number: gettext("number"), boolean: gettext("true/false"),
                       object: gettext("object (JSON)"), array: gettext("list (JSON)")};

  const $ = (selector, scope = root) => scope.querySelector(selector);
  const present = (value) => value !== null && value !== undefined;
  const make = (tag, props = {}, ...children) => {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "dataset") Object.assign(element.dataset, value);
      else if (key.startsWith("aria") || key === "role") element.setAttribute(key.replace(/^aria/, "aria-").toLowerCase(), value);
      else element[key] = value;
    }
    element.append(...children.filter(present));
    return element;
  };
  const clone = (value) => JSON.parse(JSON.stringify(value));
  const asText = (value) => (typeof value === "string" ? value : JSON.stringify(value));
  const clip = (text, size) => (text.length > size ? `${text.slice(0, size)}…` : text);

  const api = async (method, url, body) => {
    const response = await fetch(url, {method, headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
                                       body: body === undefined ? undefined : JSON.stringify(body)});
    const payload = response.status === 204 ? {} : await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error(payload?.error?.message || `HTTP ${response.status}`);
      error.fields = payload?.error?.fields || {};
      throw error;
    }
    return payload;
  };
  const message = (text, kind = "") => {
    const box = $(".wf-message");
    box.textContent = text;
    box.className = `wf-message ${kind}`;
    box.hidden = !text;
  };

  // --- The editor and the workflow's state: Drawflow holds positions and wires; `nodes` holds what graph.py reads.
  const editor = new Drawflow(document.getElementById("wf-drawflow"));
  editor.reroute = false;
  editor.force_first_input = true;  // a wire dropped anywhere on a node goes to its input
  editor.editor_mode = canEdit ? "edit" : "fixed";
  editor.zoom_min = MIN_ZOOM;
  editor.start();
  let nodes = {};  // Drawflow id -> {id, kind, settings, on_error}
  let inputs = [];
  let version = data.version;
  let loading = false, dirty = false, selected = null, lastFocused = null, runId = null;
  let lastRun = {};  // node id -> its record in the latest run shown

  const markDirty = () => {
    if (loading) return;
    dirty = true;
    $(".wf-dirty").hidden = false;
  };
  window.addEventListener("beforeunload", (event) => { if (dirty && canEdit) event.preventDefault(); });
  const dfIdOf = (nodeId) => Object.keys(nodes).find((dfId) => nodes[dfId].id === nodeId);
  const elementOf = (dfId) => document.getElementById(`node-${dfId}`);
  const firstInput = () => (inputs[0] ? `{{start.${inputs[0].name}}}` : "");

  const branchesOf = (node) => {
    if (node.kind === "condition") return [...(node.settings.cases || []).map((item) => item.branch), catalogue.else];
    if (node.kind === "classifier") return [...(node.settings.classes || [])];
    return [];
  };
  const defaults = (kind) => {
    const question = firstInput();
    const variable = inputs[0] ? `start.${inputs[0].name}` : "";
    const tool = catalogue.tools[0];
    return {
      start: {}, answer: {answer: question}, template: {template: question},
      llm: {model: catalogue.models[0] || "", system: "", prompt: question},
      classifier: {model: catalogue.models[0] || "", query: question, classes: ["first", "second"], instructions: ""},
      knowledge: {knowledge_base: catalogue.knowledge_bases[0]?.id ?? null, query: question},
      tool: {tool: tool?.id ?? null, arguments: Object.fromEntries((tool?.parameters || []).map((name) => [name, ""]))},
      code: {code: "def run(args):\n    return args\n", arguments: {}, timeout_s: 10},
      condition: {cases: [{branch: "yes", match: "all", rules: [{variable, op: "not_empty"}]}]},
      http: {method: "GET", url: "https://", headers: {}, body: ""},
      iteration: {items: "", do: {kind: "template", settings: {template: "{{item.value}}"}}},
      aggregator: {variables: []},
      agent: {agent: catalogue.agents[0]?.id ?? null, input: question},
    }[kind] || {};
  };
  const freshId = (kind) => {
    const taken = new Set(Object.values(nodes).map((node) => node.id));
    if (kind === "start" && !taken.has("start")) return "start";
    for (let n = 1; ; n++) if (!taken.has(`${kind}_${n}`)) return `${kind}_${n}`;
  };

  const summary = (node) => {
    const s = node.settings;
    const named = (list, id) => list.find((item) => item.id === id)?.name || (id ?? "—");
    switch (node.kind) {
      case "start": return inputs.map((item) => item.name).join(", ");
      case "llm": case "classifier": return s.model || "—";
      case "knowledge": return named(catalogue.knowledge_bases, s.knowledge_base);
      case "tool": return named(catalogue.tools, s.tool);
      case "agent": return named(catalogue.agents, s.agent);
      case "code": return (s.code || "").split("\n")[0];
      case "condition": return branchesOf(node).join(" / ");
      case "http": return `${s.method || "GET"} ${s.url || ""}`;
      case "iteration": return `${s.items || "—"} → ${kindLabel(s.do?.kind)}`;
      case "aggregator": return (s.variables || []).join(", ");
      case "template": return s.template || "";
      case "answer": return s.answer || "";
      default: return "";
    }
  };
  const refreshNode = (dfId) => {
    const node = nodes[dfId], element = elementOf(dfId);
    element.dataset.node = node.id;
    $(".wf-kind", element).textContent = kindLabel(node.kind);
    $(".wf-id", element).textContent = node.id;
    // Clipped to the node's width; the whole of it on hover.
    const summaryBox = $(".wf-summary", element);
    summaryBox.textContent = summaryBox.title = summary(node);
    const labels = branchesOf(node);
    element.querySelectorAll(".outputs .output").forEach((output, index) => {
      if (labels.length) output.dataset.branch = labels[index] ?? "";
      else delete output.dataset.branch;
      output.title = labels[index] ?? "";
    });
  };
  // A node's id and its settings' summary are code (names, references, templates), shown as such.
  const NODE_HTML = '<div class="wf-node"><div class="wf-title"><code class="wf-id"></code><span class="wf-kind"></span></div>' +
    '<code class="wf-summary"></code><div class="wf-result"></div></div>';

  const addNode = (node, x, y) => {
    const outputs = Math.max(branchesOf(node).length, 1);
    const dfId = editor.addNode(node.kind, node.kind === "start" ? 0 : 1, outputs, x, y, `wf-k-${node.kind}`, {},
                                NODE_HTML);
    nodes[dfId] = {id: node.id, kind: node.kind, settings: clone(node.settings || {}),
                   on_error: clone(node.on_error || {policy: "fail"})};
    refreshNode(dfId);
    refreshPalette();
    return dfId;
  };

  // The outputs follow the branches: one more or one fewer, the "else" branch kept last with its wires.
  const syncOutputs = (dfId, removedIndex = null) => {
    const node = nodes[dfId];
    const want = Math.max(branchesOf(node).length, 1);
    const module = () => editor.drawflow.drawflow.Home.data[dfId];
    let have = Object.keys(module().outputs).length;
    if (removedIndex !== null && have > want) {
      editor.removeNodeOutput(dfId, `output_${removedIndex + 1}`);
      have -= 1;
    }
    while (have > want) editor.removeNodeOutput(dfId, `output_${have--}`);
    while (have < want) {
      editor.addNodeOutput(dfId);
      have += 1;
      if (node.kind === "condition") {  // the new case goes before "else": move else's wires to the last output
        for (const wire of [...module().outputs[`output_${have - 1}`].connections]) {
          editor.removeSingleConnection(dfId, wire.node, `output_${have - 1}`, wire.output);
          editor.addConnection(dfId, wire.node, `output_${have}`, wire.output);
        }
      }
    }
    refreshNode(dfId);
  };

  let edgeOrder = [];
  const edgeKey = (edge) => `${edge.from}>${edge.to}>${edge.branch ?? ""}`;
  const graph = () => {
    const module = editor.drawflow.drawflow.Home.data;
    const graphNodes = [], edges = [];
    for (const [dfId, drawn] of Object.entries(module)) {
      const node = nodes[dfId];
      graphNodes.push({id: node.id, kind: node.kind, settings: node.settings, on_error: node.on_error});
      const labels = branchesOf(node);
      for (const [name, output] of Object.entries(drawn.outputs)) {
        const index = Number(name.split("_")[1]) - 1;
        for (const wire of output.connections) {
          edges.push({from: node.id, to: nodes[wire.node].id, ...(labels.length ? {branch: labels[index]} : {})});
        }
      }
    }
    // In the order the server last had them, so that an unchanged graph is not saved as a new version.
    const rank = (edge) => { const at = edgeOrder.indexOf(edgeKey(edge)); return at < 0 ? edgeOrder.length : at; };
    edges.sort((a, b) => rank(a) - rank(b));
    return {inputs, nodes: graphNodes, edges};
  };

  const upstreamOf = (nodeId) => {
    const parents = {};
    for (const edge of graph().edges) (parents[edge.to] ||= []).push(edge.from);
    const found = new Set(), stack = [...(parents[nodeId] || [])];
    while (stack.length) {
      const current = stack.pop();
      if (found.has(current)) continue;
      found.add(current);
      stack.push(...(parents[current] || []));
    }
    return found;
  };
  const outputsOf = (node) => {
    if (node.kind === "start") return inputs.map((item) => item.name);
    return catalogue.kinds[node.kind]?.outputs || [];
  };

  // --- Layout: where the nodes were last left (the workflow's layout, on the server); the nodes it does not place are
  // laid out by depth, below those it does. A move is saved a moment after the last one, without making a version.
  let layout = data.layout || {};
  // Where a node is drawn: its element's place, since Drawflow's own pos_x/pos_y after a drag are off by the drag's
  // last mouse step.
  const placeOf = (dfId) => {
    const drawn = editor.drawflow.drawflow.Home.data[dfId], style = elementOf(dfId)?.style;
    const x = parseFloat(style?.left), y = parseFloat(style?.top);
    return [Number.isFinite(x) ? x : drawn.pos_x, Number.isFinite(y) ? y : drawn.pos_y];
  };
  const currentLayout = () => {
    const places = {};
    for (const dfId of Object.keys(editor.drawflow.drawflow.Home.data)) {
      if (!nodes[dfId]) continue;
      const [x, y] = placeOf(dfId);
      places[nodes[dfId].id] = {x, y};
    }
    return places;
  };
  let layoutTimer = null;
  const saveLayout = () => {
    if (!canEdit) return;
    clearTimeout(layoutTimer);
    layoutTimer = setTimeout(async () => {
      try {
        layout = (await api("PUT", `${API}${data.id}/`, {layout: currentLayout()})).layout;
      } catch (error) {
        message(interpolate(gettext("The nodes' places were not saved: %s"), [error.message]), "error");
      }
    }, 500);
  };
  const placeNode = (dfId, x, y) => {
    const drawn = editor.drawflow.drawflow.Home.data[dfId], element = elementOf(dfId);
    drawn.pos_x = x;
    drawn.pos_y = y;
    element.style.left = `${x}px`;
    element.style.top = `${y}px`;
    editor.updateConnectionNodes(`node-${dfId}`);
  };
  const dfIdsById = () => Object.fromEntries(Object.entries(nodes).map(([dfId, node]) => [node.id, dfId]));
  // A node's size on the canvas at 100%, and whether it labels its branches.
  const sizeOf = (dfId) => {
    const element = elementOf(dfId);
    return {width: element.offsetWidth, height: element.offsetHeight,
            branches: Boolean(element.querySelector(".output[data-branch]"))};
  };

  // Each node's level (its longest path from a node nothing leads into), each level ordered so that wires cross
  // little: by the places of the node's parents and the branch of theirs it hangs from.
  const levelsOf = (g) => {
    const depth = {}, waiting = {}, outgoing = {};
    for (const node of g.nodes) { depth[node.id] = 0; waiting[node.id] = 0; outgoing[node.id] = []; }
    const edges = g.edges.filter((edge) => edge.from in outgoing && edge.to in waiting);
    for (const edge of edges) { outgoing[edge.from].push(edge); waiting[edge.to] += 1; }
    const queue = g.nodes.map((node) => node.id).filter((id) => !waiting[id]);
    while (queue.length) {
      const id = queue.shift();
      for (const edge of outgoing[id]) {
        depth[edge.to] = Math.max(depth[edge.to], depth[id] + 1);
        if (--waiting[edge.to] === 0) queue.push(edge.to);
      }
    }
    const byId = Object.fromEntries(g.nodes.map((node) => [node.id, node]));
    const levels = [], rank = {};
    for (const node of g.nodes) (levels[depth[node.id]] ||= []).push(node.id);
    for (const ids of levels.filter(Boolean)) {
      const key = Object.fromEntries(ids.map((id) => {
        const parents = edges.filter((edge) => edge.to === id && edge.from in rank);
        if (!parents.length) return [id, Number.MAX_SAFE_INTEGER];
        const branch = (edge) => Math.max(branchesOf({settings: {}, ...byId[edge.from]}).indexOf(edge.branch), 0);
        return [id, parents.reduce((sum, edge) => sum + rank[edge.from] + branch(edge) / 100, 0) / parents.length];
      }));
      ids.sort((a, b) => key[a] - key[b]);
      ids.forEach((id, at) => { rank[id] = at; });
    }
    return levels.filter(Boolean);
  };

  // Left to right, the levels are columns; top to bottom, rows. A branch's label stands beside its wire: right of a
  // node whose wires leave to the right, below one whose wires leave downwards.
  const GAPS = {LR: {along: 100, across: 28}, TB: {along: 48, across: 28}};
  const BAND_GAP = 64, LABEL_ROOM = {LR: 76, TB: 24};
  // The levels (of node ids) laid out `direction`, `perBand` levels to a band and the bands stacked (rows of
  // columns, or columns of rows): each node's place and the area they take. Across the flow, a node stands in line
  // with its parents (their mean), its level kept in order and apart, so that wires run short and straight.
  const arrange = (levels, size, parents, direction, perBand) => {
    const [along, across] = direction === "LR" ? ["width", "height"] : ["height", "width"];
    const gaps = GAPS[direction];
    const places = {};
    let bandAt = 0, alongSize = 0;
    for (let first = 0; first < levels.length; first += perBand) {
      const centre = {}, inBand = {};
      let alongAt = 0, low = Infinity, high = -Infinity;
      for (const ids of levels.slice(first, first + perBand)) {
        const wanted = ids.map((id) => {
          const placed = (parents[id] || []).filter((parent) => parent in centre);
          return placed.length ? placed.reduce((sum, parent) => sum + centre[parent], 0) / placed.length : null;
        });
        const levelAcross = ids.reduce((sum, id) => sum + size(id)[across], gaps.across * (ids.length - 1));
        let next = -levelAcross / 2, end = -Infinity;
        const starts = ids.map((id, at) => {
          const start = Math.max(end + gaps.across, wanted[at] === null ? next : wanted[at] - size(id)[across] / 2);
          end = start + size(id)[across];
          next = end + gaps.across;
          return start;
        });
        // Pushed apart, the level drifts one way: it is moved back by the mean of how far its nodes are off.
        const offsets = ids.map((id, at) => (wanted[at] === null ? null : wanted[at] - starts[at] - size(id)[across] / 2))
          .filter((offset) => offset !== null);
        const shift = offsets.length ? offsets.reduce((sum, offset) => sum + offset, 0) / offsets.length : 0;
        ids.forEach((id, at) => {
          const start = starts[at] + shift;
          centre[id] = start + size(id)[across] / 2;
          inBand[id] = [alongAt, start];
          low = Math.min(low, start);
          high = Math.max(high, start + size(id)[across]);
        });
        alongAt += Math.max(...ids.map((id) => size(id)[along])) + gaps.along;
      }
      for (const [id, [alongPlace, acrossPlace]] of Object.entries(inBand)) {
        const acrossAt = bandAt + acrossPlace - low;
        places[id] = direction === "LR" ? [alongPlace, acrossAt] : [acrossAt, alongPlace];
      }
      alongSize = Math.max(alongSize, alongAt - gaps.along);
      bandAt += high - low + BAND_GAP;
    }
    const acrossSize = bandAt - BAND_GAP;
    return {places, ...(direction === "LR" ? {width: alongSize, height: acrossSize} : {width: acrossSize, height: alongSize})};
  };
  // The room the canvas leaves for nodes at 100%: its size less a margin, and the zoom buttons' height below.
  const viewRoom = () => ({width: editor.precanvas.clientWidth - 2 * FIT_MARGIN,
                           height: editor.precanvas.clientHeight - 2 * FIT_MARGIN - $(".wf-zoom").offsetHeight});
  const zoomToShow = (width, height) => {
    const room = viewRoom();
    return Math.min(1, room.width / Math.max(width, 1), room.height / Math.max(height, 1));
  };
  // Places for the nodes named in `only` (all by default): left to right when the canvas shows that at
  // COMFORTABLE_ZOOM or more, else top to bottom if that shows them larger; wrapped into bands (whose wires run back
  // across the canvas) only when neither shows them at MIN_ZOOM. The nodes left where they are stay above.
  const COMFORTABLE_ZOOM = 0.8;
  const layOut = (g, only = null) => {
    const dfIds = dfIdsById(), size = (id) => sizeOf(dfIds[id]);
    const chosen = only ? new Set(only) : new Set(g.nodes.map((node) => node.id));
    const levels = levelsOf(g).map((ids) => ids.filter((id) => chosen.has(id))).filter((ids) => ids.length);
    const parents = {};
    for (const edge of g.edges) (parents[edge.to] ||= []).push(edge.from);
    const options = [];
    for (let perBand = levels.length; perBand >= 1; perBand -= 1) {
      for (const direction of ["LR", "TB"]) {
        const option = arrange(levels, size, parents, direction, perBand);
        options.push({...option, zoom: zoomToShow(option.width, option.height)});
      }
    }
    const larger = (most, option) => (option.zoom > most.zoom + 0.02 ? option : most);
    const [leftToRight, topToBottom] = options;
    const unwrapped = leftToRight.zoom >= COMFORTABLE_ZOOM ? leftToRight : larger(leftToRight, topToBottom);
    const best = unwrapped.zoom >= MIN_ZOOM ? unwrapped : options.reduce(larger);
    const kept = g.nodes.map((node) => node.id).filter((id) => !chosen.has(id)).map((id) => dfIds[id]);
    const [left, top] = kept.length ? [Math.min(...kept.map((dfId) => placeOf(dfId)[0])),
                                       Math.max(...kept.map((dfId) => placeOf(dfId)[1] + sizeOf(dfId).height)) + BAND_GAP]
                                    : [0, 0];
    for (const [id, [x, y]] of Object.entries(best.places)) placeNode(dfIds[id], left + x, top + y);
  };

  // Wires leave a node where the flow goes: on its right when it runs left to right, at its bottom (and come in at
  // the top) when it runs top to bottom, which is when more wires lead to a node wholly below than wholly right.
  let downward = false;
  const leftToRight = editor.createCurvature.bind(editor);
  editor.createCurvature = (startX, startY, endX, endY, curvature, type) => {
    if (!downward) return leftToRight(startX, startY, endX, endY, curvature, type);
    const bend = Math.max(Math.abs(endY - startY) * curvature, 40);
    return ` M ${startX} ${startY} C ${startX} ${startY + bend} ${endX} ${endY - bend} ${endX} ${endY}`;
  };
  const orient = (edges) => {
    const dfIds = dfIdsById();
    let below = 0, right = 0;
    for (const edge of edges) {
      const from = dfIds[edge.from], to = dfIds[edge.to];
      if (!from || !to) continue;
      const [fromX, fromY] = placeOf(from), [toX, toY] = placeOf(to), size = sizeOf(from);
      if (toY >= fromY + size.height) below += 1;
      if (toX >= fromX + size.width) right += 1;
    }
    downward = below > right;
    editor.container.classList.toggle("wf-downward", downward);
    for (const dfId of Object.keys(nodes)) editor.updateConnectionNodes(`node-${dfId}`);
  };

  // The area the nodes take, their branch labels included.
  const nodesArea = () => {
    let area = null;
    for (const dfId of Object.keys(nodes)) {
      const [x, y] = placeOf(dfId), size = sizeOf(dfId);
      const labels = size.branches ? LABEL_ROOM[downward ? "TB" : "LR"] : 0;
      const right = x + size.width + (downward ? 0 : labels), bottom = y + size.height + (downward ? labels : 0);
      area = area ? {left: Math.min(area.left, x), top: Math.min(area.top, y), right: Math.max(area.right, right),
                     bottom: Math.max(area.bottom, bottom)}
                  : {left: x, top: y, right, bottom};
    }
    return area;
  };
  const setView = (zoom, x, y) => {
    editor.zoom = editor.zoom_last_value = zoom;
    editor.canvas_x = x;
    editor.canvas_y = y;
    editor.precanvas.style.transform = `translate(${x}px, ${y}px) scale(${zoom})`;
  };
  // Zoomed out as far as it takes to show every node, centred; when even the least zoom is not enough, the nodes
  // are laid out anew first (and that layout kept when the user asked for it).
  const fit = ({keep = false} = {}) => {
    let area = nodesArea();
    if (!area) return;
    if (zoomToShow(area.right - area.left, area.bottom - area.top) < MIN_ZOOM) {
      const g = graph();
      layOut(g);
      orient(g.edges);
      area = nodesArea();
      if (keep) { saveLayout(); recordStep(); }
    }
    const width = area.right - area.left, height = area.bottom - area.top;
    const zoom = Math.max(MIN_ZOOM, zoomToShow(width, height)), room = viewRoom();
    const left = FIT_MARGIN + Math.max(0, (room.width - width * zoom) / 2);
    const top = FIT_MARGIN + Math.max(0, (room.height - height * zoom) / 2);
    // Drawflow scales about the canvas's centre.
    const centreX = editor.precanvas.clientWidth / 2, centreY = editor.precanvas.clientHeight / 2;
    setView(zoom, left - centreX - (area.left - centreX) * zoom, top - centreY - (area.top - centreY) * zoom);
  };
  // The canvas grows and shrinks with the window, banners and the side panel: what is in view stays where it was.
  let canvasSize = null;
  new ResizeObserver(() => {
    const width = editor.precanvas.clientWidth, height = editor.precanvas.clientHeight;
    if (canvasSize && width && height) {
      setView(editor.zoom, editor.canvas_x + ((canvasSize.width - width) / 2) * (1 - editor.zoom),
              editor.canvas_y + ((canvasSize.height - height) / 2) * (1 - editor.zoom));
    }
    canvasSize = {width, height};
  }).observe(editor.container);

  // `places` by node id; an undo or redo keeps the view and the server's order of the edges.
  const load = (g, {places = layout, restoring = false} = {}) => {
    loading = true;
    editor.clear();
    editor.node_selected = editor.connection_selected = null;
    nodes = {};
    selected = null;
    inputs = clone(g.inputs || []);
    if (!restoring) edgeOrder = (g.edges || []).map(edgeKey);
    const ids = {};
    for (const node of g.nodes) ids[node.id] = addNode(node, places[node.id]?.x ?? 0, places[node.id]?.y ?? 0);
    const unplaced = g.nodes.filter((node) => !places[node.id]).map((node) => node.id);
    if (unplaced.length) layOut(g, unplaced);
    orient(g.edges);
    for (const edge of g.edges) {
      const labels = branchesOf(nodes[ids[edge.from]]);
      const output = labels.length ? Math.max(labels.indexOf(edge.branch), 0) + 1 : 1;
      editor.addConnection(ids[edge.from], ids[edge.to], `output_${output}`, "input_1");
    }
    loading = false;
    if (!restoring) {
      dirty = false;
      $(".wf-dirty").hidden = true;
      fit();
      startHistory();
    }
    renderInputs();
    renderRunForm();
    showNode(null);
  };

  // --- Undo and redo: the workflow after each change (its graph and places), up to HISTORY_LIMIT of them. Edits of
  // one node's settings or of the inputs, one keystroke after another, are one step.
  let history = [], historyAt = -1, historyGroup = null, recordQueued = false, savedGraph = "";
  const snapshot = () => JSON.stringify({graph: graph(), layout: currentLayout()});
  const refreshHistoryButtons = () => {
    const undoButton = $(".wf-undo"), redoButton = $(".wf-redo");
    if (undoButton) undoButton.disabled = historyAt <= 0;
    if (redoButton) redoButton.disabled = historyAt >= history.length - 1;
  };
  const startHistory = () => {
    history = [snapshot()];
    historyAt = 0;
    historyGroup = null;
    savedGraph = JSON.stringify(graph());
    refreshHistoryButtons();
  };
  const recordStep = (group = null) => {
    if (loading || !canEdit) return;
    const state = snapshot();
    if (state === history[historyAt]) return;
    if (group && group === historyGroup && historyAt === history.length - 1) {
      history[historyAt] = state;
    } else {
      history.splice(historyAt + 1, history.length, state);
      if (history.length > HISTORY_LIMIT) history.shift();
      historyAt = history.length - 1;
    }
    historyGroup = group;
    refreshHistoryButtons();
  };
  // Drawflow reports one removal as several events (each wire, then the node): they make one step.
  const recordStepSoon = () => {
    if (loading || recordQueued) return;
    recordQueued = true;
    queueMicrotask(() => { recordQueued = false; recordStep(); });
  };
  const restore = (at) => {
    if (at < 0 || at >= history.length) return;
    const keepSelected = selected && nodes[selected]?.id;
    historyAt = at;
    historyGroup = null;
    const state = JSON.parse(history[at]);
    load(state.graph, {places: state.layout, restoring: true});
    dirty = JSON.stringify(graph()) !== savedGraph;
    $(".wf-dirty").hidden = !dirty;
    saveLayout();
    const reselected = keepSelected && dfIdOf(keepSelected);
    if (reselected) selectNode(reselected);
    refreshHistoryButtons();
  };
  const undo = () => restore(historyAt - 1);
  const redo = () => restore(historyAt + 1);

  // --- The palette: drag a kind onto the canvas (or click it to add it beside the others).
  const palette = $(".wf-kinds");
  const refreshPalette = () => {
    if (!palette) return;
    const hasStart = Object.values(nodes).some((node) => node.kind === "start");
    palette.querySelectorAll("li").forEach((item) => {
      const off = item.dataset.kind === "start" && hasStart;
      item.setAttribute("aria-disabled", off ? "true" : "false");
      item.draggable = !off;
    });
  };
  const dropAt = (kind, clientX, clientY) => {
    if (kind === "start" && Object.values(nodes).some((node) => node.kind === "start")) return;
    const rect = editor.precanvas.getBoundingClientRect();
    const dfId = addNode({id: freshId(kind), kind, settings: defaults(kind)},
                         (clientX - rect.x) / editor.zoom, (clientY - rect.y) / editor.zoom);
    markDirty();
    selectNode(dfId);
  };
  if (palette) {
    for (const kind of Object.keys(catalogue.kinds)) {
      const item = make("li", {className: `wf-k-${kind}`, draggable: true, textContent: kindLabel(kind),
                               dataset: {kind}, title: gettext("Drag onto the canvas")});
      item.addEventListener("dragstart", (event) => event.dataTransfer.setData("text/x-workflow-kind", kind));
      // A double click or Enter adds the node near the canvas's top left corner, for those who do not drag.
      const addHere = () => {
        const rect = editor.container.getBoundingClientRect();
        dropAt(kind, rect.x + 60 + Math.random() * 200, rect.y + 60 + Math.random() * 200);
      };
      item.tabIndex = 0;
      item.addEventListener("dblclick", addHere);
      item.addEventListener("keydown", (event) => { if (event.key === "Enter") addHere(); });
      palette.append(item);
    }
    const stage = editor.container;
    stage.addEventListener("dragover", (event) => event.preventDefault());
    stage.addEventListener("drop", (event) => {
      event.preventDefault();
      const kind = event.dataTransfer.getData("text/x-workflow-kind");
      if (kind) dropAt(kind, event.clientX, event.clientY);
    });
  }

  // --- Canvas events.
  editor.on("nodeSelected", (dfId) => selectNode(dfId));
  editor.on("nodeCreated", recordStepSoon);
  editor.on("nodeMoved", () => { saveLayout(); recordStepSoon(); });
  editor.on("nodeRemoved", (dfId) => {
    delete nodes[dfId];
    if (!editor.node_selected?.isConnected) editor.node_selected = null;  // removed from the side panel
    if (selected === dfId) showNode(null);
    refreshPalette();
    markDirty();
    recordStepSoon();
  });
  // The start node has no input, so Drawflow makes no wire into it.
  const rewired = () => { markDirty(); recordStepSoon(); if (selected && !loading) showNode(selected); };
  editor.on("connectionCreated", rewired);
  editor.on("connectionRemoved", rewired);
  if (!canEdit) {  // Drawflow selects nothing in its fixed mode: a click still shows the node's settings, read-only
    editor.container.addEventListener("click", (event) => {
      const element = event.target.closest(".drawflow-node");
      if (element) selectNode(element.id.slice(5));
    });
  }
  // Drawflow's right-click button is a bare "x": it says what it deletes.
  editor.container.addEventListener("contextmenu", () => {
    const button = editor.precanvas.querySelector(".drawflow-delete");
    if (!button) return;
    const label = editor.connection_selected ? gettext("Delete connection") : gettext("Delete the node");
    button.textContent = "✕";
    button.title = label;
    button.setAttribute("aria-label", label);
    button.setAttribute("role", "button");
  });
  $(".wf-zoom-in").onclick = () => editor.zoom_in();
  $(".wf-zoom-out").onclick = () => editor.zoom_out();
  $(".wf-zoom-fit").onclick = () => fit({keep: true});

  // --- The keyboard, as in other flow editors; keys typed into a field are the field's.
  // Selects a node or a wire on the canvas as a click does, so that Delete acts on it.
  const selectOnCanvas = (element) => {
    editor.node_selected?.classList.remove("selected");
    editor.connection_selected?.classList.remove("selected");
    const isNode = element.classList.contains("drawflow-node");
    editor.node_selected = isNode ? element : null;
    editor.connection_selected = isNode ? null : element;
    element.classList.add("selected");
  };
  const deleteSelected = () => {
    editor.contextmenuDel();
    if (editor.connection_selected) {
      editor.removeConnection();
      return true;
    }
    if (editor.node_selected) {
      editor.removeNodeId(editor.node_selected.id);
      return true;
    }
    return false;
  };
  let clipboard = null, pastes = 0;
  const copyNode = () => {
    const dfId = editor.node_selected?.id.slice(5), node = nodes[dfId];
    // Selected text is copied as text; there is one start node.
    if (!node || node.kind === "start" || String(window.getSelection())) return false;
    const [x, y] = placeOf(dfId);
    clipboard = {kind: node.kind, settings: clone(node.settings), on_error: clone(node.on_error), x, y};
    pastes = 0;
    return true;
  };
  const pasteNode = () => {
    if (!clipboard) return false;
    pastes += 1;
    const {kind, settings, on_error, x, y} = clipboard;
    const dfId = addNode({id: freshId(kind), kind, settings: clone(settings), on_error: clone(on_error)},
                         x + 40 * pastes, y + 40 * pastes);
    markDirty();
    selectOnCanvas(elementOf(dfId));
    selectNode(dfId);
    return true;
  };
  const typing = (target) => Boolean(target.closest?.("input, textarea, select, [contenteditable]"));
  if (canEdit) {
    document.addEventListener("keydown", (event) => {
      if (typing(event.target) || event.altKey) return;
      const command = event.ctrlKey || event.metaKey, key = event.key.toLowerCase();
      let handled = false;
      if (!command && (event.key === "Delete" || event.key === "Backspace")) handled = deleteSelected();
      else if (command && key === "z") { (event.shiftKey ? redo : undo)(); handled = true; }
      else if (command && key === "y") { redo(); handled = true; }
      else if (command && key === "c") handled = copyNode();
      else if (command && key === "v") handled = pasteNode();
      if (handled) event.preventDefault();
    });
    $(".wf-undo").onclick = undo;
    $(".wf-redo").onclick = redo;
  }

  // --- The side panel folds away, leaving its width to the canvas; the choice is kept in this browser.
  const sideToggle = $(".wf-side-toggle");
  const showSide = (shown) => {
    $(".wf-body").classList.toggle("wf-side-hidden", !shown);
    sideToggle.setAttribute("aria-expanded", String(shown));
    localStorage.setItem("workflow-side-panel", shown ? "shown" : "hidden");
  };
  sideToggle.onclick = () => showSide(sideToggle.getAttribute("aria-expanded") !== "true");
  showSide(localStorage.getItem("workflow-side-panel") !== "hidden");

  // --- Tabs.
  const showTab = (name) => {
    root.querySelectorAll(".wf-tabs button").forEach((tab) => tab.setAttribute("aria-selected", String(tab.dataset.tab === name)));
    root.querySelectorAll(".wf-tab").forEach((panel) => { panel.hidden = panel.dataset.panel !== name; });
    if (name === "versions") loadVersions();
    if (name === "run") renderRunForm();
  };
  root.querySelectorAll(".wf-tabs button").forEach((tab) => { tab.onclick = () => showTab(tab.dataset.tab); });

  // --- The side panel: the selected node's settings.
  const form = $(".wf-node-form");
  const selectNode = (dfId) => {
    dfId = String(dfId);
    selected = dfId;
    showTab("node");
    showNode(dfId);
  };
  const changed = (dfId) => { refreshNode(dfId); markDirty(); recordStep(`settings:${dfId}`); };
  const field = (label, control, hint = "") => make("label", {}, label, control,
                                                     hint ? make("span", {className: "muted small", textContent: hint}) : null);
  const textControl = (node, dfId, key, {multiline = false, refs = "braces", code = false} = {}) => {
    const control = make(multiline ? "textarea" : "input", {value: node.settings[key] ?? "", disabled: !canEdit,
                                                            dataset: {refs, key}});
    if (code) control.spellcheck = false;
    control.addEventListener("input", () => { node.settings[key] = control.value; changed(dfId); });
    return control;
  };
  const numberControl = (node, dfId, key, step = "any") => {
    const control = make("input", {type: "number", step, value: node.settings[key] ?? "", disabled: !canEdit});
    control.addEventListener("input", () => {
      if (control.value === "") delete node.settings[key];
      else node.settings[key] = Number(control.value);
      changed(dfId);
    });
    return control;
  };
  const pickControl = (node, dfId, key, options, {numeric = false, onPick = null} = {}) => {
    const control = make("select", {disabled: !canEdit},
                         make("option", {value: "", textContent: "—"}),
                         ...options.map(([value, label]) => make("option", {value: String(value), textContent: label})));
    control.value = node.settings[key] === null || node.settings[key] === undefined ? "" : String(node.settings[key]);
    control.addEventListener("change", () => {
      node.settings[key] = control.value === "" ? null : (numeric ? Number(control.value) : control.value);
      if (onPick) onPick(control.value);
      changed(dfId);
    });
    return control;
  };
  const jsonControl = (value, onValue, {allowEmpty = true} = {}) => {
    const control = make("textarea", {value: value === null || value === undefined ? "" : JSON.stringify(value, null, 2),
                                      disabled: !canEdit, spellcheck: false});
    control.addEventListener("input", () => {
      const text = control.value.trim();
      try {
        onValue(text === "" && allowEmpty ? null : JSON.parse(text));
        control.classList.remove("invalid");
      } catch {
        control.classList.add("invalid");
      }
    });
    return control;
  };
  // name: value rows (a tool's or code node's arguments, an HTTP request's headers); values may hold references.
  const mapControl = (node, dfId, key) => {
    const box = make("div", {className: "wf-map"});
    const render = () => {
      box.replaceChildren();
      const entries = Object.entries(node.settings[key] || {});
      const write = () => {
        node.settings[key] = Object.fromEntries(
          [...box.querySelectorAll(".wf-row")].map((row) => [row.children[0].value.trim(), row.children[1].value])
            .filter(([name]) => name));
        changed(dfId);
      };
      for (const [name, value] of [...entries, ...(canEdit ? [["", ""]] : [])]) {
        const row = make("div", {className: "wf-row"},
                         make("input", {value: name, placeholder: gettext("name"), disabled: !canEdit, ariaLabel: gettext("Name")}),
                         make("input", {value: asText(value), placeholder: gettext("value or {{node.field}}"),
                                        disabled: !canEdit, dataset: {refs: "braces"}, ariaLabel: gettext("Value")}));
        row.addEventListener("input", write);
        row.children[0].addEventListener("change", render);
        box.append(row);
      }
    };
    render();
    return box;
  };
  const listControl = (node, dfId, key, {separator = ",", refs = null, onChange = null} = {}) => {
    const multiline = separator === "\n";
    const control = make(multiline ? "textarea" : "input", {value: (node.settings[key] || []).join(multiline ? "\n" : ", "),
                                                            disabled: !canEdit, dataset: refs ? {refs} : {}});
    control.addEventListener("input", () => {
      node.settings[key] = control.value.split(separator).map((item) => item.trim()).filter(Boolean);
      if (onChange) onChange();
      changed(dfId);
    });
    return control;
  };
  const casesControl = (node, dfId) => {
    const box = make("div", {className: "wf-cases"});
    const render = () => {
      box.replaceChildren();
      (node.settings.cases || []).forEach((item, caseIndex) => {
        const set = make("fieldset", {}, make("legend", {textContent: `${gettext("Case")} ${caseIndex + 1}`}));
        const branch = make("input", {value: item.branch, disabled: !canEdit, ariaLabel: gettext("Branch name")});
        branch.addEventListener("input", () => { item.branch = branch.value.trim(); changed(dfId); });
        const match = make("select", {disabled: !canEdit},
                           make("option", {value: "all", textContent: gettext("all rules hold")}),
                           make("option", {value: "any", textContent: gettext("any rule holds")}));
        match.value = item.match || "all";
        match.addEventListener("change", () => { item.match = match.value; changed(dfId); });
        set.append(field(gettext("Branch name"), branch), field(gettext("Match"), match));
        item.rules.forEach((rule, ruleIndex) => {
          const variable = make("input", {value: rule.variable || "", placeholder: "start.question", disabled: !canEdit,
                                          dataset: {refs: "bare"}, ariaLabel: gettext("Variable")});
          const op = make("select", {disabled: !canEdit, ariaLabel: gettext("Operator")},
                          ...catalogue.rule_ops.map((name) => make("option", {value: name, textContent: OP_LABELS[name] || name})));
          op.value = rule.op;
          const value = make("input", {value: rule.value === undefined ? "" : asText(rule.value), disabled: !canEdit,
                                       placeholder: gettext("value"), ariaLabel: gettext("Value")});
          variable.addEventListener("input", () => { rule.variable = variable.value.trim(); changed(dfId); });
          op.addEventListener("change", () => { rule.op = op.value; changed(dfId); });
          value.addEventListener("input", () => {
            // A number, a list or true/false is compared as such; anything else as text.
            try { rule.value = JSON.parse(value.value); } catch { rule.value = value.value; }
            if (value.value === "") delete rule.value;
            changed(dfId);
          });
          const remove = make("button", {type: "button", className: "small danger", textContent: "✕",
                                         ariaLabel: gettext("Remove the rule"), hidden: !canEdit});
          remove.onclick = () => { item.rules.splice(ruleIndex, 1); changed(dfId); render(); };
          set.append(make("div", {className: "wf-row"}, variable, op, value, remove));
        });
        if (canEdit) {
          const addRule = make("button", {type: "button", className: "small", textContent: gettext("Add a rule")});
          addRule.onclick = () => { item.rules.push({variable: "", op: "eq", value: ""}); changed(dfId); render(); };
          const removeCase = make("button", {type: "button", className: "small danger", textContent: gettext("Remove the case")});
          removeCase.onclick = () => {
            node.settings.cases.splice(caseIndex, 1);
            syncOutputs(dfId, caseIndex);
            changed(dfId);
            render();
          };
          set.append(make("div", {className: "fields-row"}, addRule, removeCase));
        }
        box.append(set);
      });
      if (canEdit) {
        const addCase = make("button", {type: "button", className: "small", textContent: gettext("Add a case")});
        addCase.onclick = () => {
          const taken = new Set(branchesOf(node));
          let n = node.settings.cases.length + 1;
          while (taken.has(`case_${n}`)) n += 1;
          node.settings.cases.push({branch: `case_${n}`, match: "all", rules: [{variable: "", op: "eq", value: ""}]});
          syncOutputs(dfId);
          changed(dfId);
          render();
        };
        box.append(addCase, make("p", {className: "muted small",
                                       textContent: gettext("When no case holds, the run takes the else branch.")}));
      }
    };
    render();
    return box;
  };

  const settingsFields = (node, dfId) => {
    const models = catalogue.models.map((name) => [name, name]);
    const named = (list) => list.map((item) => [item.id, item.name]);
    const s = node.settings;
    switch (node.kind) {
      case "start":
        return [make("p", {className: "muted small", textContent: gettext("The start node hands the run's inputs to the nodes after it; edit them on the Inputs tab.")})];
      case "llm":
        return [field(gettext("Model"), pickControl(node, dfId, "model", models)),
                field(gettext("System prompt"), textControl(node, dfId, "system", {multiline: true})),
                field(gettext("Prompt"), textControl(node, dfId, "prompt", {multiline: true})),
                field(gettext("Temperature"), numberControl(node, dfId, "temperature", "0.1")),
                field(gettext("Max tokens"), numberControl(node, dfId, "max_tokens", "1")),
                field(gettext("JSON schema of the output (optional)"),
                      jsonControl(s.json_schema, (value) => { s.json_schema = value; changed(dfId); }),
                      gettext("An object schema makes the output JSON, so later nodes can read its fields."))];
      case "classifier":
        return [field(gettext("Model"), pickControl(node, dfId, "model", models)),
                field(gettext("Question"), textControl(node, dfId, "query", {multiline: true})),
                field(gettext("Classes (comma-separated; each is a branch)"),
                      listControl(node, dfId, "classes", {onChange: () => syncOutputs(dfId)})),
                field(gettext("Instructions"), textControl(node, dfId, "instructions", {multiline: true}))];
      case "knowledge":
        return [field(gettext("Knowledge base"), pickControl(node, dfId, "knowledge_base", named(catalogue.knowledge_bases), {numeric: true})),
                field(gettext("Query"), textControl(node, dfId, "query", {multiline: true}))];
      case "tool": {
        const argumentsBox = make("div");
        const renderArguments = () => argumentsBox.replaceChildren(mapControl(node, dfId, "arguments"));
        const onPick = (value) => {
          const tool = catalogue.tools.find((item) => String(item.id) === value);
          s.arguments = Object.fromEntries((tool?.parameters || []).map((name) => [name, s.arguments?.[name] ?? ""]));
          renderArguments();
        };
        renderArguments();
        return [field(gettext("Work Bridge tool"), pickControl(node, dfId, "tool", named(catalogue.tools), {numeric: true, onPick})),
                field(gettext("Arguments"), argumentsBox)];
      }
      case "code":
        return [field(gettext("Python code"), textControl(node, dfId, "code", {multiline: true, code: true, refs: "none"}),
                      gettext("run(args) gets the arguments below and returns the node's output; it runs in the sandbox.")),
                field(gettext("Arguments"), mapControl(node, dfId, "arguments")),
                field(gettext("Timeout (s)"), numberControl(node, dfId, "timeout_s", "0.1")),
                field(gettext("Max output (bytes)"), numberControl(node, dfId, "max_output_bytes", "1"))];
      case "condition":
        return [casesControl(node, dfId)];
      case "template":
        return [field(gettext("Jinja template"), textControl(node, dfId, "template", {multiline: true, code: true}))];
      case "http":
        return [field(gettext("Method"), pickControl(node, dfId, "method", catalogue.http_methods.map((name) => [name, name]))),
                field(gettext("URL"), textControl(node, dfId, "url")),
                field(gettext("Headers"), mapControl(node, dfId, "headers")),
                field(gettext("Body"), textControl(node, dfId, "body", {multiline: true})),
                field(gettext("Timeout (s)"), numberControl(node, dfId, "timeout_s", "0.1"))];
      case "iteration": {
        s.do ||= {kind: "template", settings: {}};
        const kind = make("select", {disabled: !canEdit},
                          ...Object.keys(catalogue.kinds).filter((name) => catalogue.kinds[name].iterable).sort()
                            .map((name) => make("option", {value: name, textContent: kindLabel(name)})));
        kind.value = s.do.kind;
        kind.addEventListener("change", () => { s.do = {kind: kind.value, settings: defaults(kind.value)}; changed(dfId); showNode(dfId); });
        return [field(gettext("List to go through"), textControl(node, dfId, "items", {refs: "bare"}),
                      gettext("A variable holding a list, as node.field; each item is item.value (and item.index).")),
                field(gettext("For each item, run"), kind),
                field(gettext("Its settings (JSON)"), jsonControl(s.do.settings, (value) => { s.do.settings = value || {}; changed(dfId); },
                                                                  {allowEmpty: false}))];
      }
      case "aggregator":
        return [field(gettext("Variables, one a line (the first that has a value wins)"),
                      listControl(node, dfId, "variables", {separator: "\n", refs: "bare"}))];
      case "agent":
        return [field(gettext("Agent"), pickControl(node, dfId, "agent", named(catalogue.agents), {numeric: true})),
                field(gettext("Message to the agent"), textControl(node, dfId, "input", {multiline: true}))];
      case "answer":
        return [field(gettext("Answer"), textControl(node, dfId, "answer", {multiline: true}))];
      default:
        return [];
    }
  };

  const policyFields = (node, dfId) => {
    const policy = node.on_error;
    const box = make("fieldset", {}, make("legend", {textContent: gettext("When the node fails")}));
    const pick = make("select", {disabled: !canEdit},
                      make("option", {value: "fail", textContent: gettext("fail the run")}),
                      make("option", {value: "default", textContent: gettext("use a default output")}),
                      make("option", {value: "retry", textContent: gettext("retry, then fail")}));
    pick.value = policy.policy || "fail";
    pick.addEventListener("change", () => {
      node.on_error = {policy: pick.value, ...(pick.value === "retry" ? {retries: 2, backoff_s: 0.5} : {}),
                       ...(pick.value === "default" ? {default: ""} : {})};
      changed(dfId);
      showNode(dfId);
    });
    box.append(pick);
    if (policy.policy === "default") {
      box.append(field(gettext("Default output (JSON or text)"),
                       jsonControl(policy.default, (value) => { policy.default = value; changed(dfId); })));
    }
    if (policy.policy === "retry") {
      for (const [key, label, step] of [["retries", gettext("Retries"), "1"], ["backoff_s", gettext("Backoff (s)"), "0.1"]]) {
        const control = make("input", {type: "number", step, value: policy[key] ?? "", disabled: !canEdit});
        control.addEventListener("input", () => { policy[key] = Number(control.value); changed(dfId); });
        box.append(field(label, control));
      }
    }
    return box;
  };

  // The variables a node may read: every output of the nodes upstream of it, and the inputs.
  const variablePicker = (node) => {
    const picker = make("select", {className: "wf-variable-picker", ariaLabel: gettext("Insert a variable")},
                        make("option", {value: "", textContent: gettext("Insert a variable…")}));
    const upstream = upstreamOf(node.id);
    const groups = Object.values(nodes).filter((other) => upstream.has(other.id))
      .map((other) => [other.id, outputsOf(other).map((name) => `${other.id}.${name}`)]);
    if (catalogue.kinds[node.kind]?.loops) groups.push(["item", ["item.value", "item.index"]]);
    for (const [label, names] of groups) {
      if (!names.length) continue;
      picker.append(make("optgroup", {label}, ...names.map((name) => make("option", {value: name, textContent: `{{${name}}}`}))));
    }
    picker.addEventListener("change", () => {
      const name = picker.value;
      picker.value = "";
      const target = lastFocused && form.contains(lastFocused) ? lastFocused : form.querySelector("[data-refs=braces], [data-refs=bare]");
      if (!name || !target || target.dataset.refs === "none") return;
      const text = target.dataset.refs === "bare" ? name : `{{${name}}}`;
      if (target.dataset.refs === "bare" && target.tagName === "INPUT") target.value = text;
      else target.setRangeText(text, target.selectionStart ?? target.value.length, target.selectionEnd ?? target.value.length, "end");
      target.dispatchEvent(new Event("input", {bubbles: true}));
      target.focus();
    });
    return picker;
  };
  form.addEventListener("focusin", (event) => { if (event.target.dataset?.refs) lastFocused = event.target; });

  const renameNode = (dfId, newId) => {
    const node = nodes[dfId], oldId = node.id;
    if (newId === oldId) return "";
    if (!NODE_ID.test(newId) || RESERVED.has(newId)) return gettext("An id is a name of letters, digits and _ (not item, outputs or settled).");
    if (Object.values(nodes).some((other) => other.id === newId)) return gettext("Another node has this id.");
    if (node.kind === "start") return gettext("The start node's id stays start.");
    // References to the node follow it: {{old.field}} and old.field become the new id's.
    const braces = new RegExp(`(\\{\\{\\s*)${oldId}\\.`, "g"), bare = new RegExp(`^${oldId}\\.`);
    const rewrite = (value) => {
      if (typeof value === "string") return value.replace(braces, `$1${newId}.`).replace(bare, `${newId}.`);
      if (Array.isArray(value)) return value.map(rewrite);
      if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, rewrite(v)]));
      return value;
    };
    for (const other of Object.values(nodes)) other.settings = rewrite(other.settings);
    node.id = newId;
    Object.keys(nodes).forEach(refreshNode);
    saveLayout();
    markDirty();
    recordStep();
    return "";
  };

  const showNode = (dfId) => {
    form.replaceChildren();
    $(".wf-no-node").hidden = Boolean(dfId && nodes[dfId]);
    if (!dfId || !nodes[dfId]) { selected = null; return; }
    dfId = String(dfId);
    const node = nodes[dfId];
    const heading = make("h3", {textContent: `${kindLabel(node.kind)} · ${node.id}`});
    const idInput = make("input", {value: node.id, disabled: !canEdit || node.kind === "start", ariaLabel: gettext("Node id")});
    const idError = make("span", {className: "wf-field-error"});
    idInput.addEventListener("change", () => {
      idError.textContent = renameNode(dfId, idInput.value.trim());
      if (!idError.textContent) showNode(dfId);
    });
    const error = elementOf(dfId)?.dataset.error;
    form.append(...[heading, error ? make("p", {className: "msg error wf-node-error", textContent: error}) : null,
                     field(gettext("Node id (others read its outputs as {{id.output}})"), idInput), idError].filter(present));
    if (node.kind !== "start") form.append(variablePicker(node));
    form.append(...settingsFields(node, dfId));
    if (node.kind !== "start") form.append(policyFields(node, dfId));
    if (canEdit) {
      const remove = make("button", {type: "button", className: "small danger", textContent: gettext("Delete the node")});
      remove.onclick = () => editor.removeNodeId(`node-${dfId}`);
      form.append(remove);
    }
    const record = lastRun[node.id];
    if (record) {
      form.append(make("h3", {textContent: gettext("In the last run")}),
                  make("p", {}, make("span", {className: `badge ${record.status}`, textContent: STATUS_LABELS[record.status] || record.status}),
                       record.latency_ms !== null && record.latency_ms !== undefined ? ` ${Math.round(record.latency_ms)} ms` : "",
                       record.output_tokens ? ` · ${record.input_tokens}+${record.output_tokens} tok` : "",
                       record.attempts > 1 ? ` · ${interpolate(gettext("%s attempts"), [record.attempts])}` : ""));
      if (record.inputs && Object.keys(record.inputs).length) {
        form.append(make("h3", {textContent: gettext("Inputs")}), make("pre", {textContent: JSON.stringify(record.inputs, null, 2)}));
      }
      if (record.error) form.append(make("p", {className: "msg error", textContent: record.error_text || record.error}));
      else if (record.outputs) form.append(make("h3", {textContent: gettext("Outputs")}), make("pre", {className: "wf-node-outputs", textContent: JSON.stringify(record.outputs, null, 2)}));
    }
  };

  // --- Inputs: the run's variables.
  const renderInputs = () => {
    const body = $(".wf-inputs tbody");
    body.replaceChildren();
    inputs.forEach((item, index) => {
      const name = make("input", {value: item.name, disabled: !canEdit, ariaLabel: gettext("Input name")});
      const type = make("select", {disabled: !canEdit, ariaLabel: gettext("Type")},
                        ...catalogue.input_types.map((value) => make("option", {value, textContent: TYPE_LABELS[value] || value})));
      type.value = item.type || "string";
      const required = make("input", {type: "checkbox", checked: item.required !== false, disabled: !canEdit,
                                      ariaLabel: gettext("Required")});
      const remove = make("button", {type: "button", className: "small danger", textContent: "✕", hidden: !canEdit,
                                     ariaLabel: gettext("Remove the input")});
      name.addEventListener("input", () => { item.name = name.value.trim(); inputsChanged(); });
      type.addEventListener("change", () => { item.type = type.value; inputsChanged(); });
      required.addEventListener("change", () => { item.required = required.checked; inputsChanged(); });
      remove.onclick = () => { inputs.splice(index, 1); inputsChanged(); renderInputs(); };
      body.append(make("tr", {}, make("td", {}, name), make("td", {}, type), make("td", {}, required), make("td", {}, remove)));
    });
  };
  const inputsChanged = () => {
    markDirty();
    const start = dfIdOf("start");
    if (start) refreshNode(start);
    recordStep("inputs");
  };
  const addInput = $(".wf-add-input");
  if (addInput) {
    addInput.onclick = () => {
      let n = inputs.length + 1;
      while (inputs.some((item) => item.name === `input_${n}`)) n += 1;
      inputs.push({name: `input_${n}`, type: "string", required: true});
      inputsChanged();
      renderInputs();
    };
  }

  // --- Save: the server checks the graph; an error names the node, which is outlined and opened.
  const clearInvalid = () => root.querySelectorAll(".drawflow-node.wf-invalid").forEach((element) => {
    element.classList.remove("wf-invalid");
    delete element.dataset.error;
  });
  // A new workflow's first wire, start straight to the answer, is easily left when nodes are put in between.
  const leftoverWire = (g) => {
    const kinds = Object.fromEntries(g.nodes.map((node) => [node.id, node.kind]));
    return g.edges.find((edge) => kinds[edge.from] === "start" && kinds[edge.to] === "answer"
                        && g.edges.some((other) => other !== edge && (other.from === edge.from || other.to === edge.to)));
  };
  const save = async () => {
    clearInvalid();
    try {
      clearTimeout(layoutTimer);
      const sent = graph();
      const saved = await api("PUT", `${API}${data.id}/`, {name: data.name, description: data.description,
                                                           graph: sent, layout: currentLayout()});
      layout = saved.layout;
      const before = version;
      version = saved.version;
      $(".wf-version").textContent = `v${version}`;
      // The graph as checked, with its defaults filled in.
      edgeOrder = saved.graph.edges.map(edgeKey);
      for (const checked of saved.graph.nodes) {
        const dfId = dfIdOf(checked.id);
        if (dfId) { nodes[dfId].settings = checked.settings; nodes[dfId].on_error = checked.on_error; }
      }
      dirty = false;
      $(".wf-dirty").hidden = true;
      savedGraph = JSON.stringify(graph());
      const said = version === before ? gettext("Saved; nothing had changed.")
                                      : interpolate(gettext("Saved: version %s."), [version]);
      const leftover = leftoverWire(sent);
      if (leftover) {
        const dfIds = dfIdsById();
        const wire = editor.precanvas.querySelector(
          `.connection.node_out_node-${dfIds[leftover.from]}.node_in_node-${dfIds[leftover.to]} .main-path`);
        if (wire) selectOnCanvas(wire);
        message(`${said} ${interpolate(gettext("The wire from start straight to %s is still there beside other paths; it is selected: press Delete to remove it."), [leftover.to])}`, "warning");
      } else {
        message(said, "success");
      }
      if (selected) showNode(selected);
      return true;
    } catch (error) {
      const nodeId = error.fields?.node?.[0];
      const dfId = nodeId && dfIdOf(nodeId);
      if (dfId) {
        elementOf(dfId).classList.add("wf-invalid");
        elementOf(dfId).dataset.error = error.message;
        selectNode(dfId);
      }
      message(error.message, "error");
      return false;
    }
  };
  const saveButton = $(".wf-save");
  if (saveButton) saveButton.onclick = () => save();

  // --- Run: the inputs form, then each node lit up from the run's events.
  const renderRunForm = () => {
    const box = $(".wf-run-inputs");
    const values = Object.fromEntries([...box.querySelectorAll("[data-input]")].map((control) => [control.dataset.input, control]));
    box.replaceChildren();
    for (const item of inputs) {
      const previous = values[item.name];
      let control;
      if (item.type === "boolean") control = make("input", {type: "checkbox", checked: previous?.checked || false});
      else if (item.type === "number") control = make("input", {type: "number", step: "any", value: previous?.value || ""});
      else if (item.type === "string") control = make("textarea", {value: previous?.value || "", rows: 2});
      else control = make("textarea", {value: previous?.value || "", placeholder: item.type === "array" ? "[ ]" : "{ }", spellcheck: false});
      control.dataset.input = item.name;
      control.dataset.type = item.type;
      box.append(field(`${item.name}${item.required !== false ? " *" : ""}`, control));
    }
  };
  const runInputs = () => {
    const values = {};
    for (const control of $(".wf-run-inputs").querySelectorAll("[data-input]")) {
      const name = control.dataset.input, type = control.dataset.type;
      if (type === "boolean") { values[name] = control.checked; continue; }
      if (control.value === "") continue;
      if (type === "number") values[name] = Number(control.value);
      else if (type === "string") values[name] = control.value;
      else {
        try { values[name] = JSON.parse(control.value); } catch {
          throw new Error(interpolate(gettext("The input %s is not valid JSON."), [name]));
        }
      }
    }
    return values;
  };
  const paint = (record) => {
    const dfId = dfIdOf(record.node);
    if (!dfId) return;
    const element = elementOf(dfId);
    element.dataset.status = record.status;
    const result = $(".wf-result", element);
    if (record.status === "running") {
      result.textContent = result.title = "";
      return;
    }
    lastRun[record.node] = record;
    const timing = record.latency_ms !== null && record.latency_ms !== undefined ? `${Math.round(record.latency_ms)} ms · ` : "";
    const text = record.status === "failed" ? record.error_text || record.error || ""
      : asText(record.outputs?.output ?? record.outputs ?? "");
    // The node shows the first lines (clipped by its style); the whole output is its tooltip and in the side panel.
    result.textContent = record.status === "skipped" ? STATUS_LABELS.skipped : timing + clip(text, 300);
    result.title = record.status === "skipped" ? "" : clip(text, 4000);
    if (selected === dfId) showNode(dfId);
  };
  const runStatus = (status, detail = {}) => {
    $(".wf-run-status").hidden = false;
    const badge = $(".wf-run-badge");
    badge.className = `badge wf-run-badge ${status}`;
    badge.textContent = STATUS_LABELS[status] || status;
    $(".wf-run-timing").textContent = detail.latency_ms ? `${Math.round(detail.latency_ms)} ms` : "";
    if (detail.answer !== undefined) $(".wf-run-answer").textContent = detail.answer;
    const error = $(".wf-run-error");
    error.textContent = detail.error_text || detail.error || "";
    error.hidden = !detail.error;
  };
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const FINAL = ["done", "failed", "cancelled"];
  const follow = async (id) => {
    let done = false, after = "0", failures = 0;
    while (!done && id === runId && failures < 5) {
      try {
        const response = await fetch(`${API}runs/${id}/events/?after=${encodeURIComponent(after)}`);
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        for await (const {event, data: payload, id: eventId} of readEvents(response)) {
          if (id !== runId) return;
          if (eventId) after = eventId;
          if (event === "node") paint(payload);
          else if (event === "status") runStatus(payload.status);
          else if (["done", "error", "cancelled"].includes(event)) {
            runStatus(payload.status || event, payload);
            done = true;
            // The events carry errors as the worker wrote them (English); the run's record has them in the page's language.
            const detail = event === "done" ? null : await api("GET", `${API}runs/${id}/`).catch(() => null);
            if (detail && id === runId) {
              detail.nodes.forEach(paint);
              runStatus(detail.status, detail);
            }
            break;
          }
        }
      } catch {
        failures += 1;
        await pause(1000);
      }
    }
    // The events could not be followed: the run's record says how it went, read until it ends.
    while (!done && id === runId) {
      const detail = await api("GET", `${API}runs/${id}/`).catch(() => null);
      if (detail) {
        detail.nodes.forEach(paint);
        runStatus(detail.status, detail);
        done = FINAL.includes(detail.status);
      }
      if (!done) await pause(1000);
    }
    $(".wf-cancel").hidden = true;
    $(".wf-run").disabled = false;
  };
  const runForm = $(".wf-run-form");
  runForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!canEdit) return;
    message("");
    let values;
    try { values = runInputs(); } catch (error) { message(error.message, "error"); return; }
    if (dirty && !(await save())) return;
    $(".wf-run").disabled = true;
    try {
      const run = await api("POST", `${API}${data.id}/run/`, {inputs: values});
      runId = run.run_id;
      lastRun = {};
      root.querySelectorAll(".drawflow-node").forEach((element) => {
        delete element.dataset.status;
        const result = $(".wf-result", element);
        result.textContent = result.title = "";
      });
      $(".wf-run-answer").textContent = "";
      runStatus(run.status);
      $(".wf-cancel").hidden = false;
      follow(runId);
    } catch (error) {
      message(error.message, "error");
      $(".wf-run").disabled = false;
    }
  });
  const cancelButton = $(".wf-cancel");
  if (cancelButton) {
    cancelButton.onclick = async () => {
      try { await api("POST", `${API}runs/${runId}/cancel/`); } catch (error) { message(error.message, "error"); }
    };
  }

  // --- Versions: the history, a diff between two, and rollback (the old graph saved as a new version).
  let versions = [];
  const loadVersions = async () => {
    versions = await api("GET", `${API}${data.id}/versions/`);
    const body = $(".wf-versions tbody");
    body.replaceChildren();
    for (const item of versions) {
      const row = make("tr", {dataset: {version: item.number}},
                       make("td", {textContent: `v${item.number}`}),
                       make("td", {className: "small", textContent: new Date(item.created_at).toLocaleString()}));
      const actions = make("td");
      if (canEdit && item.number !== version) {
        const rollback = make("button", {type: "button", className: "small", textContent: gettext("Roll back to this")});
        rollback.onclick = () => rollbackTo(item);
        actions.append(rollback);
      } else if (item.number === version) {
        actions.append(make("span", {className: "muted small", textContent: gettext("current")}));
      }
      row.append(actions);
      body.append(row);
    }
    for (const [selector, pick] of [[".wf-diff-from", 1], [".wf-diff-to", 0]]) {
      const select = $(selector);
      const keep = select.value;
      select.replaceChildren(...versions.map((item) => make("option", {value: item.number, textContent: `v${item.number}`})));
      select.value = keep && versions.some((item) => String(item.number) === keep) ? keep : String(versions[Math.min(pick, versions.length - 1)]?.number ?? "");
    }
  };
  const rollbackTo = async (item) => {
    if (!confirm(interpolate(gettext("Save version %s's graph as a new version?"), [item.number]))) return;
    try {
      clearTimeout(layoutTimer);
      const saved = await api("PUT", `${API}${data.id}/`, {name: data.name, description: data.description,
                                                           graph: item.graph, layout: currentLayout()});
      layout = saved.layout;
      version = saved.version;
      $(".wf-version").textContent = `v${version}`;
      load(saved.graph);
      message(interpolate(gettext("Rolled back: version %(new)s has version %(old)s's graph."), {new: version, old: item.number}, true), "success");
      loadVersions();
    } catch (error) {
      message(error.message, "error");
    }
  };
  const diffGraphs = (before, after) => {
    const lines = [];
    const byId = (g) => Object.fromEntries(g.nodes.map((node) => [node.id, node]));
    const old = byId(before), now = byId(after);
    const inputsText = (g) => g.inputs.map((item) => `${item.name}: ${item.type}${item.required ? "" : "?"}`).join(", ");
    if (inputsText(before) !== inputsText(after)) {
      lines.push(["changed", interpolate(gettext("Inputs: %(old)s → %(new)s"), {old: inputsText(before) || "—", new: inputsText(after) || "—"}, true)]);
    }
    for (const id of Object.keys(now)) {
      if (!old[id]) lines.push(["added", interpolate(gettext("Node %(id)s added (%(kind)s)"), {id, kind: kindLabel(now[id].kind)}, true)]);
    }
    for (const id of Object.keys(old)) {
      if (!now[id]) { lines.push(["removed", interpolate(gettext("Node %(id)s removed (%(kind)s)"), {id, kind: kindLabel(old[id].kind)}, true)]); continue; }
      const a = {...old[id].settings, on_error: old[id].on_error}, b = {...now[id].settings, on_error: now[id].on_error};
      if (old[id].kind !== now[id].kind) lines.push(["changed", `${id}: ${kindLabel(old[id].kind)} → ${kindLabel(now[id].kind)}`]);
      for (const key of new Set([...Object.keys(a), ...Object.keys(b)])) {
        if (JSON.stringify(a[key]) === JSON.stringify(b[key])) continue;
        lines.push(["changed", `${id}.${key}: ${clip(asText(a[key] ?? "—"), 160)} → ${clip(asText(b[key] ?? "—"), 160)}`]);
      }
    }
    const edgeText = (edge) => `${edge.from} → ${edge.to}${edge.branch ? ` [${edge.branch}]` : ""}`;
    const oldEdges = new Set(before.edges.map(edgeText)), newEdges = new Set(after.edges.map(edgeText));
    for (const edge of newEdges) if (!oldEdges.has(edge)) lines.push(["added", interpolate(gettext("Wire %s added"), [edge])]);
    for (const edge of oldEdges) if (!newEdges.has(edge)) lines.push(["removed", interpolate(gettext("Wire %s removed"), [edge])]);
    return lines;
  };
  $(".wf-diff-show").onclick = () => {
    const pick = (selector) => versions.find((item) => String(item.number) === $(selector).value);
    const before = pick(".wf-diff-from"), after = pick(".wf-diff-to");
    const list = $(".wf-diff");
    list.replaceChildren();
    if (!before || !after) return;
    const lines = diffGraphs(before.graph, after.graph);
    if (!lines.length) lines.push(["", gettext("The two versions have the same graph.")]);
    for (const [kind, text] of lines) {
      list.append(make("li", {className: kind, textContent: `${{added: "+ ", removed: "− ", changed: "~ "}[kind] || ""}${text}`}));
    }
  };

  load(data.graph);
  if (!data.graph.nodes?.length) addNode({id: "start", kind: "start", settings: {}}, 40, 40);
})();
