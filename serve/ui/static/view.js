// The messages as DOM: a question, an answer (reasoning, text, tool calls, the stats line).
// Nothing the model wrote is ever put into the page as HTML except through markdown.render.

import { render } from "./markdown.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, action, aria) {
  const b = el("button", "small", label);
  b.type = "button";
  b.dataset.action = action;
  if (aria) b.setAttribute("aria-label", aria);
  return b;
}

// The usage the API returned, as the history log keeps it (one flat object)
export function flatUsage(usage) {
  if (!usage) return {};
  const out = {
    prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens,
    cached_tokens: usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : undefined,
    reasoning_tokens: usage.completion_tokens_details ? usage.completion_tokens_details.reasoning_tokens : undefined,
  };
  if (usage.draft_tokens) Object.assign(out, { draft_tokens: usage.draft_tokens, accepted_tokens: usage.accepted_tokens, draft: usage.draft });
  for (const key of Object.keys(out)) if (out[key] === undefined || out[key] === null) delete out[key];
  return out;
}

const fixed = (n, digits) => (typeof n === "number" ? n.toFixed(digits) : "?");

// The figures tallow's CLI prints under an answer (cli/render.py, stats_line), from the API's
// usage and timings
export function statsLine(turn) {
  const u = turn.usage || {};
  const t = turn.timings || {};
  if (u.prompt_tokens === undefined) return turn.finish_reason ? `stopped · ${turn.finish_reason}` : "";
  const cached = u.cached_tokens === undefined ? "cached: not reported" : `${u.cached_tokens} cached`;
  const parts = [
    `prompt ${u.prompt_tokens} tok (${cached})`,
    `TTFT ${fixed(t.ttft_ms, 0)} ms`,
    `prefill ${fixed(t.prefill_tps, 1)} tok/s`,
    `output ${u.completion_tokens} tok`,
    `decode ${fixed(t.decode_tps, 1)} tok/s`,
  ];
  if (u.draft_tokens) {
    const by = u.draft && u.draft !== "lookup" ? ` by ${u.draft}` : "";
    parts.push(`draft${by} ${u.accepted_tokens}/${u.draft_tokens} accepted`);
  }
  parts.push(turn.finish_reason || "?");
  return parts.join(" · ");
}

export function questionNode(turn, index) {
  const node = el("article", "msg user");
  node.dataset.index = String(index);
  node.setAttribute("aria-label", "You said");
  const body = el("div", "body");
  body.textContent = turn.prompt;
  node.append(body);
  if (turn.images && turn.images.length) {
    const pics = el("div", "pics");
    for (const src of turn.images) {
      const img = el("img");
      img.src = src;  // a data: URL the user attached
      img.alt = "attached image";
      pics.append(img);
    }
    node.append(pics);
  }
  const tools = el("div", "tools");
  tools.append(button("Edit", "edit", "Edit this message and send it again"));
  node.append(tools);
  return node;
}

export function answerNode(index) {
  const node = el("article", "msg assistant");
  node.dataset.index = String(index);
  node.setAttribute("aria-label", "The model answered");
  const reasoning = el("details", "reasoning");
  reasoning.hidden = true;
  reasoning.append(el("summary", "", "Reasoning"), el("div", "reasoning-text"));
  const body = el("div", "body markdown");
  const calls = el("div", "calls");
  const stats = el("p", "stats");
  const tools = el("div", "tools");
  tools.append(button("Regenerate", "regenerate", "Regenerate this answer"));
  node.append(reasoning, body, calls, stats, tools);
  return node;
}

// Fill an answer's node from the turn as it stands (while streaming, and once done)
export function fillAnswer(node, turn, streaming) {
  const reasoning = node.querySelector(".reasoning");
  if (turn.reasoning) {
    reasoning.hidden = false;
    reasoning.querySelector(".reasoning-text").textContent = turn.reasoning;
    // open while the model thinks, closed once the answer begins (the user may open it again)
    if (streaming && !turn.response) {
      reasoning.open = true;
      node.dataset.thinking = "true";
    } else if (node.dataset.thinking) {
      reasoning.open = false;
      delete node.dataset.thinking;
    }
  }
  const body = node.querySelector(".body");
  body.replaceChildren(render(turn.response || ""));
  if (streaming && !turn.response && !turn.reasoning) body.replaceChildren(el("span", "waiting", "…"));
  const calls = node.querySelector(".calls");
  calls.replaceChildren(...(turn.tool_calls || []).map(callNode));
  const stats = node.querySelector(".stats");
  stats.textContent = streaming ? "" : statsLine(turn);
  if (!streaming && turn.usage) stats.dataset.usage = JSON.stringify(turn.usage);
  node.classList.toggle("streaming", Boolean(streaming));
}

function callNode(call) {
  const box = el("div", "call");
  const fn = call.function || {};
  box.append(el("div", "call-name", `Tool call: ${fn.name || "?"}`));
  let args = fn.arguments || "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* shown as sent */ }
  box.append(el("pre", "call-args", args));
  if (call.result !== undefined) {  // run (or denied) for the page, from a server's MCP tools
    box.dataset.outcome = call.allowed === false ? "denied" : call.error ? "error" : "ran";
    box.append(el("div", "call-name", call.allowed === false ? "Not allowed" : call.error ? "Failed" : "Result"),
      el("pre", "call-result", call.result));
  }
  return box;
}

export function conversationItem(conv, current) {
  const li = el("li", conv.id === current ? "current" : "");
  li.dataset.id = conv.id;
  const open = el("button", "open", conv.title || "(untitled)");
  open.type = "button";
  open.dataset.action = "open";
  if (conv.id === current) open.setAttribute("aria-current", "true");
  li.append(open, button("\u270E", "rename", `Rename “${conv.title}”`), button("\u2715", "delete", `Delete “${conv.title}”`));
  return li;
}
