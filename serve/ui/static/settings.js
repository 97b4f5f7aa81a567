// The sampling settings (kept in this browser) and the tools a request offers; each field is
// sent only when it is set, so the model's own defaults (its Modelfile) hold otherwise.

const STORE = "tallow.settings";
const NUMBERS = { temperature: false, top_p: false, top_k: true, min_p: false, repeat_penalty: false, max_tokens: true, seed: true };

const $ = (id) => document.getElementById(id);

export function loadSettings() {
  let saved = {};
  try { saved = JSON.parse(localStorage.getItem(STORE) || "{}"); } catch (_) { saved = {}; }
  for (const name of Object.keys(NUMBERS)) if (saved[name] !== undefined) $(name).value = saved[name];
  if (typeof saved.tools === "string") $("tools").value = saved.tools;
  const save = () => {
    const out = { tools: $("tools").value };
    for (const name of Object.keys(NUMBERS)) if ($(name).value !== "") out[name] = $(name).value;
    localStorage.setItem(STORE, JSON.stringify(out));
  };
  for (const name of [...Object.keys(NUMBERS), "tools"]) $(name).addEventListener("change", save);
}

// The request fields the settings give; throws with a message when one is not valid
export function requestFields() {
  const out = {};
  for (const [name, integer] of Object.entries(NUMBERS)) {
    const text = $(name).value.trim();
    if (text === "") continue;
    const value = Number(text);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new Error(`${$(name).labels[0].textContent} must be ${integer ? "a whole number" : "a number"}`);
    }
    out[name] = value;
  }
  const tools = $("tools").value.trim();
  if (tools) {
    let parsed;
    try { parsed = JSON.parse(tools); } catch (e) { throw new Error(`Tools is not valid JSON: ${e.message}`); }
    if (!Array.isArray(parsed)) throw new Error("Tools must be a JSON list");
    if (parsed.length) out.tools = parsed;
  }
  return out;
}
