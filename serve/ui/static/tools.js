// The tools of the MCP servers that `tallow serve --mcp CONFIG` started: offered to the model
// with each request, and each call it makes shown here and run only when the person allows
// it (once, always for that tool while the page is open, or denied: the model is told so).
// The server runs a call only when the page asks (POST /ui/api/tools/call); its APIs never do.

import * as api from "./api.js";

export const MAX_ROUNDS = 8;  // rounds of calls before the model must answer (as tallow run --mcp)
const DENIED = "the user did not allow this call";
const always = new Set();
let offered = [];
let failed = {};

// The server's tools (none without --mcp, or when it cannot be asked)
export async function loadTools(guarded) {
  try {
    const out = await guarded(() => api.json("/ui/api/tools"));
    offered = out.tools || [];
    failed = out.failed || {};
  } catch (_) {
    offered = [];
  }
  return { tools: offered, failed };
}

const served = (name) => offered.some((t) => t.function.name === name);

// The calls of this round, when the page runs them all (every one is a server's tool)
export function runnable(turn) {
  const fresh = turn.tool_calls.filter((c) => c.round === undefined);
  return fresh.length && fresh.every((c) => served(c.function.name)) ? fresh : [];
}

// Each call asked for, run (or denied) in turn; Stop ends the wait and the turn. Settled
// calls are passed over, so asking again after the key dialog runs none twice.
export async function settle(calls, node, signal, round) {
  for (const call of calls) {
    if (call.result !== undefined) continue;
    call.round = round;
    const allowed = await approve(node, call, signal);
    if (signal.aborted) throw new DOMException("stopped", "AbortError");
    call.allowed = allowed;
    if (!allowed) {
      Object.assign(call, { result: DENIED, error: true });
      continue;
    }
    try {
      const out = await api.json("/ui/api/tools/call", { method: "POST", body: { name: call.function.name, arguments: argsOf(call) } });
      Object.assign(call, { result: out.content, error: out.is_error });
    } catch (e) {
      if (e instanceof api.AuthNeeded) throw e;
      Object.assign(call, { result: `the call failed: ${e.message}`, error: true });
    }
  }
}

function argsOf(call) {
  try {
    const parsed = JSON.parse(call.function.arguments || "{}");
    return parsed && typeof parsed === "object" && !Array.isArray(parsed) ? parsed : {};
  } catch (_) {
    return {};
  }
}

function approve(node, call, signal) {
  const name = call.function.name;
  if (always.has(name)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const box = document.createElement("div");
    box.className = "approval";
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", `Allow the tool call ${name}?`);
    const what = document.createElement("p");
    what.textContent = `Run the tool ${name}?`;
    const args = document.createElement("pre");
    args.textContent = JSON.stringify(argsOf(call), null, 2);
    const finish = (answer) => {
      signal.removeEventListener("abort", stopped);
      box.remove();
      resolve(answer);
    };
    const stopped = () => finish(false);
    const choices = [["Allow once", "allow", () => finish(true)],
      ["Always allow", "always", () => { always.add(name); finish(true); }],
      ["Deny", "deny", () => finish(false)]].map(([label, action, act]) => {
      const b = Object.assign(document.createElement("button"), { type: "button", textContent: label, className: "small" });
      b.dataset.action = action;
      b.onclick = act;
      return b;
    });
    const row = document.createElement("div");
    row.className = "choices";
    row.append(...choices);
    box.append(what, args, row);
    signal.addEventListener("abort", stopped);
    node.querySelector(".stats").before(box);
    choices[0].focus();
  });
}

// A turn's calls that were run (or denied), as the messages the model saw: per round, the
// assistant's calls, then each result
export function toolMessages(turn) {
  const out = [];
  const done = (turn.tool_calls || []).filter((c) => c.round !== undefined && c.result !== undefined);
  const rounds = [...new Set(done.map((c) => c.round))].sort((a, b) => a - b);
  for (const round of rounds) {
    const calls = done.filter((c) => c.round === round);
    out.push({ role: "assistant", content: "", tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: c.function })) });
    for (const c of calls) out.push({ role: "tool", tool_call_id: c.id, content: c.result });
  }
  return out;
}

// The tools a request offers: the settings' own, and the server's where the model takes tools;
// after the last round, none may be called
export function offer(fields, takesTools, round) {
  const tools = [...(fields.tools || []), ...(takesTools ? offered : [])];
  if (!tools.length) return {};
  return round >= MAX_ROUNDS ? { tools, tool_choice: "none" } : { tools };
}
