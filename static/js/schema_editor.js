// The tool form's argument table. The raw JSON Schema textarea stays the field the form sends: every edit in the
// table rewrites it, and an edit of the raw schema redraws the table. What the table does not show (a property's
// `items` or `format`, the schema's `additionalProperties`) is kept as it was.
(function () {
  "use strict";

  const TYPES = ["string", "integer", "number", "boolean", "array", "object"];
  const SHOWN = ["type", "description", "default", "enum"];

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  // Whether the table can show the schema: an object whose properties each have one of the table's types.
  function fitsTable(schema) {
    if (!isObject(schema) || schema.type !== "object") return false;
    const properties = schema.properties === undefined ? {} : schema.properties;
    if (!isObject(properties)) return false;
    if (schema.required !== undefined && !Array.isArray(schema.required)) return false;
    return Object.values(properties).every((prop) => isObject(prop) && TYPES.includes(prop.type) &&
      (prop.enum === undefined || Array.isArray(prop.enum)));
  }

  // The text typed in a cell as a value of the type; undefined when it is not one.
  function valueOf(text, type) {
    if (type === "string") return text;
    if (type === "integer") return /^-?\d+$/.test(text) ? Number(text) : undefined;
    if (type === "number") return text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : undefined;
    if (type === "boolean") return text === "true" ? true : text === "false" ? false : undefined;
    try {
      const parsed = JSON.parse(text);
      return (type === "array" ? Array.isArray(parsed) : isObject(parsed)) ? parsed : undefined;
    } catch (error) {
      return undefined;
    }
  }

  function textOf(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function setUp(editor) {
    const raw = editor.querySelector("textarea[name='parameters']");
    const table = editor.querySelector("table.params");
    const body = table.querySelector("tbody");
    const rowTemplate = editor.querySelector("template[data-param-row]");
    const addButton = editor.querySelector(".param-add");
    const tooRich = editor.querySelector(".schema-too-rich");
    const details = editor.querySelector("details.raw-schema");
    let base = {};  // the schema's keys besides properties and required
    const extras = new WeakMap();  // row -> the property's keys the table does not show

    function addRow(name, prop, required) {
      const row = rowTemplate.content.firstElementChild.cloneNode(true);
      row.querySelector(".param-name").value = name;
      row.querySelector(".param-type").value = prop.type || "string";
      row.querySelector(".param-required").checked = required;
      row.querySelector(".param-description").value = prop.description || "";
      row.querySelector(".param-default").value = prop.default === undefined ? "" : textOf(prop.default);
      row.querySelector(".param-enum").value = (prop.enum || []).map(textOf).join(", ");
      extras.set(row, Object.fromEntries(Object.entries(prop).filter(([key]) => !SHOWN.includes(key))));
      body.appendChild(row);
      return row;
    }

    // The raw schema drawn as the table; false when the table cannot show it.
    function draw() {
      let schema;
      try {
        schema = JSON.parse(raw.value || "{}");
      } catch (error) {
        return false;
      }
      const fits = fitsTable(schema);
      table.hidden = addButton.hidden = !fits;
      tooRich.hidden = fits;
      if (!fits) {
        details.open = true;
        return false;
      }
      const { properties = {}, required = [], ...rest } = schema;
      base = rest;
      body.replaceChildren();
      for (const [name, prop] of Object.entries(properties)) addRow(name, prop, required.includes(name));
      if (!body.rows.length) addRow("", { type: "string" }, false);
      return true;
    }

    // The table written into the raw schema; a cell that is not a value of its type is marked and left out.
    function write() {
      const properties = {};
      const required = [];
      for (const row of body.rows) {
        const nameInput = row.querySelector(".param-name");
        const name = nameInput.value.trim();
        nameInput.setCustomValidity(name && name in properties ? editor.dataset.duplicateName : "");
        if (!name || name in properties) continue;
        const type = row.querySelector(".param-type").value;
        const prop = { ...extras.get(row), type };
        const description = row.querySelector(".param-description").value.trim();
        if (description) prop.description = description;
        const defaultInput = row.querySelector(".param-default");
        const fallback = defaultInput.value === "" ? undefined : valueOf(defaultInput.value, type);
        defaultInput.setCustomValidity(defaultInput.value !== "" && fallback === undefined
          ? editor.dataset.invalidValue : "");
        if (fallback !== undefined) prop.default = fallback;
        const enumInput = row.querySelector(".param-enum");
        const texts = enumInput.value.split(",").map((part) => part.trim()).filter((part) => part !== "");
        const allowed = texts.map((text) => valueOf(text, type));
        const allValid = allowed.every((value) => value !== undefined);
        enumInput.setCustomValidity(allValid ? "" : editor.dataset.invalidValue);
        if (texts.length && allValid) prop.enum = allowed;
        if (type !== "array") delete prop.items;
        if (type === "array" && prop.items === undefined) prop.items = {};
        properties[name] = prop;
        if (row.querySelector(".param-required").checked) required.push(name);
      }
      raw.value = JSON.stringify({ ...base, type: "object", properties, required }, null, 2);
    }

    body.addEventListener("input", write);
    body.addEventListener("change", write);
    body.addEventListener("click", (event) => {
      if (!event.target.closest(".param-remove")) return;
      event.target.closest("tr").remove();
      write();
    });
    addButton.addEventListener("click", () => {
      addRow("", { type: "string" }, false).querySelector(".param-name").focus();
    });
    raw.addEventListener("input", draw);
    if (draw()) details.open = raw.getAttribute("aria-invalid") === "true";
  }

  document.querySelectorAll("[data-schema-editor]").forEach(setUp);
})();
