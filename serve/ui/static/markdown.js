// Model output is untrusted. It is rendered as Markdown with raw HTML shown as text (never
// parsed), links only to http(s) and mailto, and images not loaded (a picture from anywhere
// else would be a request leaving this origin); then the HTML is sanitised by DOMPurify
// before it becomes DOM, as a second line of defence.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

function safeHref(href) {
  const url = String(href || "").trim();
  return /^(https?:|mailto:)/i.test(url) ? url : null;
}

const marked = new Marked({ gfm: true, breaks: false, async: false });
marked.use({
  renderer: {
    html(token) {
      return escapeHtml(token.raw ?? token.text ?? "");
    },
    link(token) {
      const text = this.parser.parseInline(token.tokens);
      const href = safeHref(token.href);
      if (!href) return text;
      return `<a href="${escapeHtml(href)}" rel="noopener noreferrer nofollow" target="_blank">${text}</a>`;
    },
    image(token) {
      return escapeHtml(`![${token.text || ""}](${token.href || ""})`);
    },
  },
});

const PURIFY = {
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "iframe", "object", "embed",
    "svg", "math", "video", "audio", "source", "picture", "link", "meta", "base"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction", "background", "poster"],
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("rel", "noopener noreferrer nofollow");
    node.setAttribute("target", "_blank");
  }
});

// A code block gets a copy button; the text copied is the block's own text
function addCopyButtons(fragment) {
  for (const pre of fragment.querySelectorAll("pre")) {
    const wrap = document.createElement("div");
    wrap.className = "code";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy this code");
    pre.replaceWith(wrap);
    wrap.append(button, pre);
  }
  return fragment;
}

export function render(text) {
  let html;
  try {
    html = marked.parse(text);
  } catch (_) {
    html = `<p>${escapeHtml(text)}</p>`;
  }
  return addCopyButtons(DOMPurify.sanitize(html, PURIFY));
}

export async function copyCode(button) {
  const code = button.parentElement.querySelector("pre").textContent;
  try {
    await navigator.clipboard.writeText(code);
  } catch (_) {
    const area = document.createElement("textarea");
    area.value = code;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}
