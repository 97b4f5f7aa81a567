// Speech into the message box: a recording made here (the browser's MediaRecorder) or an audio
// file dropped or picked, sent to this server's /v1/audio/transcriptions with a speech model it
// has, and the text put in the box to be read over before it is sent.

import * as api from "./api.js";

// What is transcribed rather than shown: a recording, a voice note, a clip's sound
export const HEARD = /^(audio|video)\//;

// The first of `names` whose capabilities (as /api/show says them) include transcription
export async function speechModel(names, capabilities) {
  const caps = await Promise.all(names.map((n) => capabilities(n)));
  const i = caps.findIndex((c) => c.includes("transcription"));
  return i < 0 ? null : names[i];
}

export async function transcribe(model, blob, name) {
  const form = new FormData();
  form.append("model", model);
  form.append("file", blob, name);
  const out = await api.json("/v1/audio/transcriptions", { method: "POST", body: form });
  return (out.text || "").trim();
}

export class Recorder {
  constructor() {
    this.recorder = null;
    this.chunks = [];
  }

  static available() {
    return Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia && window.MediaRecorder);
  }

  get recording() {
    return this.recorder !== null;
  }

  async start() {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    this.chunks = [];
    this.recorder = new MediaRecorder(stream);
    this.recorder.ondataavailable = (e) => { if (e.data.size) this.chunks.push(e.data); };
    this.recorder.start();
  }

  // The recording so far as one Blob; the microphone is released
  stop() {
    const r = this.recorder;
    this.recorder = null;
    return new Promise((resolve) => {
      r.onstop = () => {
        r.stream.getTracks().forEach((t) => t.stop());
        resolve(new Blob(this.chunks, { type: r.mimeType || "audio/webm" }));
      };
      r.stop();
    });
  }
}
