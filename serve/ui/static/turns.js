// A turn as the chat API sees it: the conversation as its messages, and each streamed event
// of an answer folded into the turn (text, reasoning, tool calls, usage).

import { toolMessages } from "./tools.js";
import { flatUsage } from "./view.js";

function userContent(turn) {
  if (!turn.images || !turn.images.length) return turn.prompt;
  return [{ type: "text", text: turn.prompt }, ...turn.images.map((url) => ({ type: "image_url", image_url: { url } }))];
}

export function messages(system, turns) {
  const out = [];
  if (system) out.push({ role: "system", content: system });
  turns.forEach((t, i) => {
    out.push({ role: "user", content: userContent(t) }, ...toolMessages(t));
    if (i < turns.length - 1) out.push({ role: "assistant", content: t.response || "" });
  });
  return out;
}

// One streamed event into the turn
export function apply(turn, event) {
  if (event.usage) {
    turn.usage = flatUsage(event.usage);
    turn.timings = event.timings || {};
  }
  for (const choice of event.choices || []) {
    const d = choice.delta || {};
    if (d.content) turn.response += d.content;
    if (d.reasoning_content) turn.reasoning += d.reasoning_content;
    for (const c of d.tool_calls || []) {  // a round's calls go after the earlier rounds'
      const at = (turn.base || 0) + c.index;
      turn.tool_calls[at] ||= { id: c.id, type: "function", function: { name: "", arguments: "" } };
      const call = turn.tool_calls[at];
      if (c.function && c.function.name) call.function.name += c.function.name;
      if (c.function && c.function.arguments) call.function.arguments += c.function.arguments;
    }
    if (choice.finish_reason) turn.finish_reason = choice.finish_reason;
  }
}
