// Calls to the server that serves this page, and to no one else: the API key (kept in this
// browser), JSON calls, and the chat stream read as server-sent events.

const KEY = "tallow.apiKey";

export class AuthNeeded extends Error {}

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export function setKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

export function hasKey() {
  return Boolean(localStorage.getItem(KEY));
}

function headers(json) {
  const out = {};
  if (json) out["Content-Type"] = "application/json";
  const key = localStorage.getItem(KEY);
  if (key) out.Authorization = "Bearer " + key;
  return out;
}

async function errorOf(response) {
  let message = response.status + " " + response.statusText;
  try {
    const body = await response.json();
    message = (body.error && (body.error.message || body.error)) || body.detail || message;
  } catch (_) { /* not JSON: the status says it */ }
  return new ApiError(String(message), response.status);
}

// fetch(path) on this origin; a 401 is AuthNeeded, any other failure an ApiError. A FormData
// body goes as the multipart form it is; any other body as JSON.
export async function call(path, { method = "GET", body, signal } = {}) {
  const form = body instanceof FormData;
  const response = await fetch(path, {
    method, signal, headers: headers(body !== undefined && !form), credentials: "same-origin", cache: "no-store",
    body: body === undefined || form ? body : JSON.stringify(body),
  });
  if (response.status === 401) throw new AuthNeeded();
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function json(path, options) {
  return (await call(path, options)).json();
}

// Each event of a chat stream, parsed; stops at [DONE]; an error event is thrown
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(event.error.message || String(event.error), 500);
      yield event;
    }
  }
}

export const conversations = {
  list: () => json("/ui/api/conversations"),
  get: (id) => json(`/ui/api/conversations/${id}`),
  rename: (id, title) => json(`/ui/api/conversations/${id}`, { method: "PATCH", body: { title } }),
  remove: (id) => json(`/ui/api/conversations/${id}`, { method: "DELETE" }),
  record: (id, turn) => json(`/ui/api/conversations/${id}/turns`, { method: "POST", body: turn }),
};

export function newId() {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
