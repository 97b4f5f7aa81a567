// The chat page: a conversation sent to /v1/chat/completions as any client sends it, streamed,
// and recorded in the server's history log with the usage and timings the API returned.

import * as api from "./api.js";
import { copyCode } from "./markdown.js";
import { loadSettings, requestFields } from "./settings.js";
import { HEARD, Recorder, speechModel, transcribe } from "./speech.js";
import { loadTools, offer, runnable, settle } from "./tools.js";
import { apply, messages } from "./turns.js";
import { answerNode, conversationItem, fillAnswer, questionNode } from "./view.js";

const $ = (id) => document.getElementById(id);
const state = { id: null, turns: [], kept: true, busy: null, images: [], caps: new Map(), frame: null, speech: null };
const recorder = new Recorder();
const empty = $("empty");

function setStatus(text) {
  $("status").textContent = text;
}

// Runs `work`; when the server wants a key, asks for it once and runs it again
async function guarded(work) {
  for (;;) {
    try {
      return await work();
    } catch (e) {
      if (!(e instanceof api.AuthNeeded)) throw e;
      await askKey();
    }
  }
}

function askKey() {
  return new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-why").textContent = api.hasKey() ? "That key was refused. Give this server's API key."
      : "This server needs an API key. It is kept in this browser only.";
    $("key").value = "";
    $("key-form").onsubmit = (event) => {
      event.preventDefault();
      api.setKey($("key").value.trim());
      dialog.close();
      resolve();
    };
    dialog.oncancel = (event) => event.preventDefault();
    dialog.showModal();
  });
}

async function loadModels() {
  const list = await guarded(() => api.json("/v1/models"));
  const select = $("model");
  const wanted = new URLSearchParams(location.search).get("model");
  const saved = localStorage.getItem("tallow.model");
  const names = list.data.map((m) => m.id);
  if (wanted && !names.includes(wanted)) names.unshift(wanted);  // loaded on demand when asked
  select.replaceChildren(...names.map((n) => new Option(n, n)));
  const pick = wanted || saved;
  if (pick && names.includes(pick)) select.value = pick;
  else {  // the first model that chats (an embedding model sorts first as often as not)
    for (const name of names) {
      if ((await capabilities(name)).includes("completion")) {
        select.value = name;
        break;
      }
    }
  }
  if (!names.length) setStatus("No models are stored: pull one with tallow pull");
  state.speech = await speechModel(names, capabilities);
  $("dictate").hidden = !(state.speech && Recorder.available());
  await showAttach();
}

// What a model can do, as /api/show says (Ollama's names: completion, embedding, vision, tools)
async function capabilities(model) {
  if (!state.caps.has(model)) {
    let caps = [];
    try {
      caps = (await guarded(() => api.json("/api/show", { method: "POST", body: { model } }))).capabilities || [];
    } catch (_) { /* no details: nothing assumed */ }
    state.caps.set(model, caps);
  }
  return state.caps.get(model);
}

async function showAttach() {
  const model = $("model").value;
  const sees = Boolean(model) && (await capabilities(model)).includes("vision");
  $("attach-label").hidden = !(sees || state.speech);
  $("attach").accept = [sees ? "image/png,image/jpeg,image/webp,image/gif" : "", state.speech ? "audio/*" : ""]
    .filter(Boolean).join(",");
  $("attach-what").textContent = sees && state.speech ? "Attach images, or transcribe audio"
    : sees ? "Attach images" : "Transcribe audio";
}

async function refreshList() {
  const out = await guarded(() => api.conversations.list());
  state.kept = out.kept;
  $("not-kept").hidden = out.kept;
  $("conversations").replaceChildren(...out.conversations.map((c) => conversationItem(c, state.id)));
}

function renderAll() {
  const nodes = [];
  state.turns.forEach((turn, i) => {
    nodes.push(questionNode(turn, i));
    const answer = answerNode(i);
    fillAnswer(answer, turn, false);
    if (turn.error) showError(answer, turn.error);
    nodes.push(answer);
  });
  $("log").replaceChildren(...(nodes.length ? nodes : [empty]));
  const regenerate = $("log").querySelectorAll("[data-action=regenerate]");
  regenerate.forEach((b, i) => { b.hidden = i !== regenerate.length - 1; });
}

function showError(node, message) {
  const p = document.createElement("p");
  p.className = "error";
  p.setAttribute("role", "alert");
  p.textContent = message;
  node.append(p);
}

async function openConversation(id) {
  stop();
  const conv = await guarded(() => api.conversations.get(id));
  state.id = id;
  state.turns = conv.turns.map((t) => ({ ...t, tool_calls: t.tool_calls || [] }));
  $("system").value = conv.system || "";
  if ([...$("model").options].some((o) => o.value === conv.model)) $("model").value = conv.model;
  renderAll();
  document.body.classList.remove("show-sidebar");
  await refreshList();
  await showAttach();
  $("prompt").focus();
}

function newChat() {
  stop();
  state.id = null;
  state.turns = [];
  $("system").value = "";
  renderAll();
  refreshList().catch((e) => setStatus(e.message));
  $("prompt").focus();
}

function nearBottom() {
  const log = $("log");
  return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
}

function paint(node, turn) {
  if (state.frame) return;
  state.frame = requestAnimationFrame(() => {
    state.frame = null;
    const stick = nearBottom();
    fillAnswer(node, turn, true);
    if (stick) $("log").scrollTop = $("log").scrollHeight;
  });
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("log").setAttribute("aria-busy", String(busy));
}

// Ask for the answer to turn `index` (a new question, an edited one, or a regeneration)
async function ask(index, prompt, images) {
  let fields;
  try {
    fields = requestFields();
    $("settings-error").textContent = "";
  } catch (e) {
    $("settings-error").textContent = e.message;
    openSettings(true);
    return;
  }
  if (!state.id) state.id = api.newId();
  const model = $("model").value;
  const turn = { prompt, images, response: "", reasoning: "", tool_calls: [], model };
  state.turns = [...state.turns.slice(0, index), turn];
  renderAll();
  const node = $("log").querySelector(`article.assistant[data-index="${index}"]`);
  fillAnswer(node, turn, true);
  $("log").scrollTop = $("log").scrollHeight;
  const controller = new AbortController();
  state.busy = controller;
  setBusy(true);
  try {
    const takesTools = $("server-tools").checked && (await capabilities(model)).includes("tools");
    for (let round = 0; ; round += 1) {  // until the answer is text: the server's tools run as allowed here
      const body = { model, messages: messages($("system").value.trim(), state.turns), stream: true, stream_options: { include_usage: true },
        ...fields, ...offer(fields, takesTools, round) };
      turn.base = turn.tool_calls.length;
      const response = await guarded(() => api.call("/v1/chat/completions", { method: "POST", body, signal: controller.signal }));
      for await (const event of api.events(response)) {
        apply(turn, event);
        paint(node, turn);
      }
      const calls = turn.finish_reason === "tool_calls" ? runnable(turn) : [];
      if (!calls.length) break;
      fillAnswer(node, turn, true);
      await guarded(() => settle(calls, node, controller.signal, round));
      fillAnswer(node, turn, true);
    }
  } catch (e) {
    if (e.name === "AbortError") turn.finish_reason = "cancelled";
    else {
      turn.finish_reason = turn.finish_reason || "error";
      turn.error = e.message;
    }
  } finally {
    state.busy = null;
    setBusy(false);
    if (state.frame) cancelAnimationFrame(state.frame);
    state.frame = null;
  }
  fillAnswer(node, turn, false);
  if (turn.error) showError(node, turn.error);
  if (!turn.error) await record(index, turn);
}

async function record(index, turn) {
  if (!state.kept) return;
  const payload = {
    index, model: turn.model, system: $("system").value.trim() || null, prompt: turn.prompt,
    response: turn.response, reasoning: turn.reasoning || null, finish_reason: turn.finish_reason || null,
    usage: turn.usage || {}, timings: turn.timings || {}, tool_calls: turn.tool_calls.length ? turn.tool_calls : null,
  };
  try {
    await guarded(() => api.conversations.record(state.id, payload));
    await refreshList();
  } catch (e) {
    if (e.status === 409) {
      state.kept = false;
      $("not-kept").hidden = false;
    } else setStatus(`Not saved: ${e.message}`);
  }
}

function stop() {
  if (state.busy) state.busy.abort();
}

function send() {
  const text = $("prompt").value;
  if (state.busy || !text.trim()) return;
  if (!$("model").value) {
    setStatus("Pick a model first");
    return;
  }
  const images = state.images;
  $("prompt").value = "";
  state.images = [];
  $("attachments").replaceChildren();
  ask(state.turns.length, text, images);
}

function editTurn(index) {
  if (state.busy) return;
  const node = $("log").querySelector(`article.user[data-index="${index}"]`);
  const area = document.createElement("textarea");
  area.value = state.turns[index].prompt;
  area.setAttribute("aria-label", "Edit the message");
  area.rows = 3;
  const save = Object.assign(document.createElement("button"), { type: "button", textContent: "Send", className: "primary small" });
  const cancel = Object.assign(document.createElement("button"), { type: "button", textContent: "Cancel", className: "small" });
  const row = document.createElement("div");
  row.className = "tools";
  row.append(save, cancel);
  node.replaceChildren(area, row);
  area.focus();
  save.onclick = () => ask(index, area.value, state.turns[index].images);
  cancel.onclick = renderAll;
  area.onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      save.onclick();
    } else if (e.key === "Escape") renderAll();
  };
}

function renameItem(li) {
  const open = li.querySelector("[data-action=open]");
  const input = Object.assign(document.createElement("input"), { type: "text", value: open.textContent, maxLength: 200 });
  input.setAttribute("aria-label", "New name for the conversation");
  open.replaceWith(input);
  input.select();
  let done = false;
  const finish = async (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) {
      try { await guarded(() => api.conversations.rename(li.dataset.id, input.value.trim())); } catch (e) { setStatus(e.message); }
    }
    await refreshList();
  };
  input.onkeydown = (e) => {
    if (e.key === "Enter") finish(true);
    else if (e.key === "Escape") finish(false);
  };
  input.onblur = () => finish(true);
}

async function deleteItem(li) {
  const title = li.querySelector("[data-action=open]").textContent;
  if (!window.confirm(`Delete “${title}”?`)) return;
  await guarded(() => api.conversations.remove(li.dataset.id));
  if (state.id === li.dataset.id) newChat();
  else await refreshList();
}

function openSettings(open) {
  $("settings").hidden = !open;
  $("open-settings").setAttribute("aria-expanded", String(open));
  if (open) $("system").focus();
}

// Speech written into the message box, where the person reads it over before sending
async function hear(blob, name) {
  if (!state.speech) {
    setStatus(`${name}: this server has no speech model (tallow pull whisper:base)`);
    return;
  }
  setStatus(`Transcribing ${name}…`);
  try {
    const text = await guarded(() => transcribe(state.speech, blob, name));
    const box = $("prompt");
    box.value += (box.value && !/\s$/.test(box.value) ? " " : "") + text;
    setStatus(text ? "" : `${name}: no speech heard`);
    box.focus();
  } catch (e) {
    setStatus(`${name}: ${e.message}`);
  }
}

async function dictate() {
  const button = $("dictate");
  if (recorder.recording) {
    button.setAttribute("aria-pressed", "false");
    await hear(await recorder.stop(), "recording.webm");
    return;
  }
  try {
    await recorder.start();
    button.setAttribute("aria-pressed", "true");
    setStatus("Recording: press the microphone again to stop");
  } catch (e) {
    setStatus(`Cannot record: ${e.message}`);
  }
}

async function attach(files) {
  const sees = (await capabilities($("model").value)).includes("vision");
  for (const file of files) {
    if (HEARD.test(file.type)) {
      hear(file, file.name);
      continue;
    }
    if (!file.type.startsWith("image/") || !sees) {
      setStatus(`${file.name}: ${file.type.startsWith("image/") ? "this model takes no images" : "not a picture or a recording"}`);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      state.images.push(reader.result);
      const chip = document.createElement("span");
      chip.className = "chip";
      chip.textContent = file.name;
      const remove = Object.assign(document.createElement("button"), { type: "button", textContent: "✕", className: "icon" });
      remove.setAttribute("aria-label", `Remove ${file.name}`);
      remove.onclick = () => {
        state.images = state.images.filter((x) => x !== reader.result);
        chip.remove();
      };
      chip.append(remove);
      $("attachments").append(chip);
    };
    reader.readAsDataURL(file);
  }
}

function wire() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.busy) stop(); });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("model").addEventListener("change", () => {
    localStorage.setItem("tallow.model", $("model").value);
    showAttach();
  });
  $("attach").addEventListener("change", (e) => { attach([...e.target.files]); e.target.value = ""; });
  $("dictate").addEventListener("click", dictate);
  for (const name of ["dragover", "drop"]) {  // a file dropped anywhere on the page
    document.addEventListener(name, (e) => {
      if (!e.dataTransfer || ![...e.dataTransfer.types].includes("Files")) return;
      e.preventDefault();
      if (name === "drop") attach([...e.dataTransfer.files]);
    });
  }
  $("open-settings").addEventListener("click", () => openSettings($("settings").hidden));
  $("close-settings").addEventListener("click", () => openSettings(false));
  $("open-sidebar").addEventListener("click", () => {
    document.body.classList.add("show-sidebar");
    $("open-sidebar").setAttribute("aria-expanded", "true");
  });
  $("close-sidebar").addEventListener("click", () => {
    document.body.classList.remove("show-sidebar");
    $("open-sidebar").setAttribute("aria-expanded", "false");
  });
  $("log").addEventListener("click", (e) => {
    const target = e.target.closest("button");
    if (!target) return;
    const index = Number(target.closest("article")?.dataset.index);
    if (target.classList.contains("copy")) copyCode(target);
    else if (target.dataset.action === "edit") editTurn(index);
    else if (target.dataset.action === "regenerate" && !state.busy) ask(index, state.turns[index].prompt, state.turns[index].images);
  });
  $("conversations").addEventListener("click", (e) => {
    const target = e.target.closest("button");
    const li = target && target.closest("li");
    if (!li) return;
    const action = target.dataset.action;
    const work = action === "open" ? openConversation(li.dataset.id) : action === "rename" ? renameItem(li) : deleteItem(li);
    Promise.resolve(work).catch((err) => setStatus(err.message));
  });
}

function showServerTools({ tools, failed }) {
  const names = tools.map((t) => t.function.name);
  const left = Object.entries(failed).map(([server, why]) => `${server} (${why})`);
  $("server-tools-row").hidden = !names.length && !left.length;
  $("server-tools-list").textContent = (names.length ? `Offered: ${names.join(", ")}.` : "")
    + (left.length ? ` Left out: ${left.join("; ")}.` : "");
}

async function boot() {
  loadSettings();
  wire();
  try {
    await loadModels();
    await refreshList();
    showServerTools(await loadTools(guarded));
  } catch (e) {
    setStatus(e.message);
  }
  document.body.dataset.ready = "true";
  $("prompt").focus();
}

boot();
