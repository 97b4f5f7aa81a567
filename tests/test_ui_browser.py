"""The chat page in a real headless browser: Debian's chromium, driven by Playwright (its
Python package; its own browser download is never used). Script models make every answer
known in advance, so a test can tell what the page did with it."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, Watched
from helpers.synth import CHATML, HERMES, write_synthetic_gguf

pytestmark = pytest.mark.slow  # a browser and a server per module

sync_api = pytest.importorskip("playwright.sync_api")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)

from helpers.server import Server  # noqa: E402 - after the skips

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT = REPO / "docs" / "images" / "chat-page.png"
THINKING = CHATML + "{# a model that reasons: <think>...</think> #}"
CODE = "\n\n```python\nprint('hi')\n```"
MD_SCRIPT = {"\n": "<think>", "<think>": "Let me think.", "Let me think.": "</think>", "</think>": "Hello",
             "Hello": " **world**", " **world**": CODE, CODE: "<|im_end|>"}
IMG, SCRIPT, JS = "<img src=x onerror=alert(1)>", "<script>alert(2)</script>", " [click me](javascript:alert(3))"
LONG = "=" * 64
HOSTILE_SCRIPT = {"\n": IMG, IMG: SCRIPT, SCRIPT: JS, JS: LONG, LONG: LONG}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOL_SCRIPT = {"\n": "<tool_call>", "<tool_call>": CALL, CALL: "</tool_call>", "</tool_call>": "<|im_end|>"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("uimodels")
    return {
        "md": write_synthetic_gguf(d / "md.gguf", script=MD_SCRIPT, template=THINKING,
                                   extra_tokens=("Let me think.", "Hello", " **world**", CODE)),
        "hostile": write_synthetic_gguf(d / "hostile.gguf", script=HOSTILE_SCRIPT, ctx_train=16384,
                                        extra_tokens=(IMG, SCRIPT, JS)),
        "loop": write_synthetic_gguf(d / "loop.gguf", script={"\n": "a", "a": "b", "b": "a"}, ctx_train=32768),
        "lookup": write_synthetic_gguf(d / "lookup.gguf", script={"\n": "a", "a": "b", "b": "a"}),
        "tool": write_synthetic_gguf(d / "tool.gguf", script=TOOL_SCRIPT, template=HERMES,
                                     extra_tokens=("<tool_call>", "</tool_call>", CALL)),
    }


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    home = tmp_path_factory.mktemp("uihome")
    s = Server(models["md"], home, str(models["hostile"]), str(models["loop"]), str(models["tool"]), str(models["lookup"]),
               "--max-models", "5", "--model-option", "loop.gguf ctx=32768", "--model-option", "hostile.gguf ctx=16384",
               "--model-option", "lookup.gguf draft=lookup",
               env={"TALLOW_NO_LOG": "0"})
    yield s
    s.close()


@pytest.fixture(scope="module")
def playwright():
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright):
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    yield b
    b.close()


def shared_store(default_home: Path) -> dict[str, str]:
    """A test's own home (its history log) over the shared store and machine profile, so the
    default model is neither fetched nor the machine calibrated again."""
    return {"TALLOW_MODELS": str(default_home / "models"), "TALLOW_MACHINE_CACHE": str(default_home / "machine.json")}


def metrics(server) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        return r.read().decode()


def metric(page: str, name: str, model: str, **labels) -> float:
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def watched(browser, server):
    w = Watched(browser, server.url)
    yield w
    w.close()


def origin_only(w: Watched, server) -> None:
    assert w.requests, "the page made no requests"
    strangers = [u for u in w.requests if not u.startswith(server.url + "/")]
    assert strangers == [], f"requests left the origin: {strangers}"


def test_an_answer_streams_renders_and_shows_what_it_cost(watched, server):
    before = metrics(server)
    watched.open()
    assert watched.page.locator("#model option").all_inner_texts() == ["hostile.gguf", "lookup.gguf", "loop.gguf", "md.gguf",
                                                                       "tool.gguf"]
    # streaming: Stop replaces Send. A six-token answer may come and go between two looks, so
    # the page itself notes whether Stop was ever shown.
    watched.page.evaluate("""() => { const stop = document.querySelector('#stop'); window.stopShown = false;
        new MutationObserver(() => { if (!stop.hidden) window.stopShown = true; }).observe(stop, {attributes: true}); }""")
    watched.send("Say hello", "md.gguf")
    usage, line = watched.stats(0)
    assert watched.page.evaluate("window.stopShown") is True
    answer = watched.answered(0)
    assert answer.locator(".body strong").inner_text() == "world"
    watched.context.grant_permissions(["clipboard-read", "clipboard-write"])
    answer.locator("button.copy").click()
    answer.locator("button.copy", has_text="Copied").wait_for()  # once the clipboard has it
    assert watched.page.evaluate("navigator.clipboard.readText()").strip() == "print('hi')"
    assert answer.locator(".body pre code").inner_text().strip() == "print('hi')"
    assert answer.locator("button.copy").count() == 1
    reasoning = answer.locator("details.reasoning")
    assert reasoning.is_visible() and not reasoning.locator(".reasoning-text").is_visible()  # collapsed once done
    reasoning.locator("summary").click()
    assert reasoning.locator(".reasoning-text").inner_text() == "Let me think."
    # the stats line is the API's own usage, which the server's counters also moved by
    after = metrics(server)
    moved = {k: metric(after, f"tallow_{k}_total", "md.gguf") - metric(before, f"tallow_{k}_total", "md.gguf")
             for k in ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")}
    assert usage["prompt_tokens"] == moved["prompt_tokens"] and usage["completion_tokens"] == moved["completion_tokens"]
    assert usage["cached_tokens"] == moved["cached_prompt_tokens"]
    print(usage, line)
    assert usage["completion_tokens"] == 6 and usage["reasoning_tokens"] == 3
    assert re.fullmatch(rf"prompt {usage['prompt_tokens']} tok \({usage['cached_tokens']} cached\) · TTFT \d+ ms · "
                        rf"prefill [\d.]+ tok/s · output 6 tok · decode [\d.]+ tok/s · stop", line), line
    assert watched.page.locator("#send").is_visible() and watched.page.locator("#stop").is_hidden()
    assert watched.errors == [] and watched.dialogs == []
    origin_only(watched, server)


def test_drafting_shows_the_drafts_accepted(watched, server):
    watched.open()
    watched.setting("max_tokens", "120")
    watched.send("Repeat yourself", "lookup.gguf")
    usage, line = watched.stats(0)
    assert usage["draft"] == "lookup" and usage["draft_tokens"] > 0 and usage["accepted_tokens"] > 0
    assert line.endswith(f" · draft {usage['accepted_tokens']}/{usage['draft_tokens']} accepted · length"), line


def test_errors_are_shown_where_they_happen(watched, server):
    watched.open("?model=no-such-model")
    assert watched.page.input_value("#model") == "no-such-model"  # as asked; the server answers for it
    watched.send("Hello?")
    alert = watched.page.locator('article.assistant[data-index="0"] [role=alert]')
    alert.wait_for()
    assert "no-such-model" in alert.inner_text()
    watched.setting("tools", "[not json")
    watched.send("Hello?", "md.gguf")
    error = watched.page.locator("#settings-error")
    assert error.inner_text().startswith("Tools is not valid JSON") and error.is_visible()
    assert watched.page.locator("#settings").is_visible()  # opened where the fix is


def test_stop_cancels_the_request_and_frees_the_slot(watched, server):
    watched.open()
    watched.setting("max_tokens", "30000")  # would run for a long while
    watched.send("Go on forever", "loop.gguf")
    watched.page.locator('article.assistant[data-index="0"] .body').filter(has_text=re.compile("abab")).wait_for()
    watched.page.keyboard.press("Escape")  # Esc stops, as the Stop button does
    watched.page.locator("#send").wait_for(state="visible")
    page = ""
    for _ in range(100):  # the runner notices the closed stream at its next step
        page = metrics(server)
        if metric(page, "tallow_requests_total", "loop.gguf", finish_reason="cancelled") == 1:
            break
        time.sleep(0.1)
    assert metric(page, "tallow_requests_total", "loop.gguf", finish_reason="cancelled") == 1
    assert metric(page, "tallow_slots_busy", "loop.gguf") == 0
    assert metric(page, "tallow_completion_tokens_total", "loop.gguf") < 30000
    text = watched.page.locator('article.assistant[data-index="0"] .stats').inner_text()
    assert "cancelled" in text


def test_a_reloaded_conversation_resumes_with_its_cache(watched, server):
    watched.open()
    watched.send("First question", "md.gguf")
    first, _ = watched.stats(0)
    watched.page.locator("#conversations li").first.wait_for()
    watched.page.reload()
    watched.page.wait_for_selector("body[data-ready=true]")
    assert watched.page.locator("article").count() == 0
    item = watched.page.locator("#conversations li", has_text="First question")
    item.locator("[data-action=open]").click()
    assert watched.page.locator('article.user[data-index="0"]').inner_text().startswith("First question")
    watched.send("Second question")
    second, _ = watched.stats(1)
    assert second["cached_tokens"] >= first["prompt_tokens"] - 1 > 0
    # renamed from the sidebar
    item = watched.page.locator("#conversations li", has_text="First question")
    item.locator("[data-action=rename]").click()
    watched.page.keyboard.press("Control+A")
    watched.page.keyboard.type("Renamed chat")
    watched.page.keyboard.press("Enter")
    watched.page.locator("#conversations li", has_text="Renamed chat").wait_for()
    _, _, listing = server.raw("/ui/api/conversations")
    assert "Renamed chat" in [c["title"] for c in listing["conversations"]]


def test_edit_and_regenerate_replace_turns(watched, server):
    watched.open()
    watched.send("One", "md.gguf")
    watched.stats(0)
    watched.send("Two")
    watched.stats(1)
    watched.page.locator('article.user[data-index="0"] [data-action=edit]').click()
    watched.page.fill('article.user[data-index="0"] textarea', "One, edited")
    watched.page.press('article.user[data-index="0"] textarea', "Enter")
    watched.stats(0)
    assert watched.page.locator("article.user").count() == 1
    watched.page.locator('article.assistant[data-index="0"] [data-action=regenerate]').click()
    watched.stats(0)
    cid = watched.page.evaluate("document.querySelector('#conversations li.current').dataset.id")
    _, _, conv = server.raw(f"/ui/api/conversations/{cid}")
    assert [t["prompt"] for t in conv["turns"]] == ["One, edited"]


def test_hostile_answers_render_as_text(watched, server):
    watched.open()
    watched.setting("max_tokens", "1570")  # 1,566 tokens of 64 '=': a line of 100,000 characters
    watched.send("Be hostile", "hostile.gguf")
    node = watched.answered(0)
    text = node.locator(".body").inner_text()
    assert IMG in text and SCRIPT in text and "click me" in text
    assert len(max(text.split("\n"), key=len)) >= 100_000
    assert node.locator(".body img, .body script, .body iframe").count() == 0
    assert watched.page.locator("a[href^='javascript']").count() == 0
    assert watched.dialogs == [], "model output ran script"
    width = watched.page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], "a long line widened the page"
    box = watched.page.locator("#prompt").bounding_box()
    assert box and box["y"] + box["height"] <= watched.page.viewport_size["height"]
    assert watched.errors == []
    origin_only(watched, server)


def test_tool_calls_are_shown(watched, server):
    watched.open()
    watched.setting("tools", json.dumps(TOOLS))
    watched.send("Weather in Paris?", "tool.gguf")
    watched.answered(0)
    call = watched.page.locator('article.assistant[data-index="0"] .call')
    assert call.locator(".call-name").inner_text() == "Tool call: get_weather"
    assert json.loads(call.locator(".call-args").inner_text()) == {"city": "Paris"}
    assert "tool_calls" in watched.page.locator('article.assistant[data-index="0"] .stats').inner_text()


def test_keyboard_shift_enter_is_a_newline_and_labels_are_there(watched, server):
    watched.open()
    watched.page.focus("#prompt")
    watched.page.keyboard.type("line one")
    watched.page.keyboard.press("Shift+Enter")
    watched.page.keyboard.type("line two")
    assert watched.page.input_value("#prompt") == "line one\nline two"
    assert watched.page.locator("article").count() == 0  # nothing sent
    for control in ("#prompt", "#model", "#system", "#temperature", "#tools"):
        assert watched.page.locator(control).evaluate("e => e.labels.length > 0 || e.hasAttribute('aria-label')")
    assert watched.page.get_by_role("button", name="Send").is_visible()
    assert watched.page.get_by_role("log", name="Messages").count() == 1


def test_narrow_screens_and_dark_mode(browser, server):
    w = Watched(browser, server.url, viewport={"width": 390, "height": 800}, color_scheme="dark")
    try:
        w.open()
        assert w.page.locator("#sidebar").evaluate("e => e.getBoundingClientRect().right <= 0")
        w.page.click("#open-sidebar")
        assert w.page.locator("#new-chat").is_visible()
        w.page.click("#close-sidebar")
        background = w.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(int(c) for c in re.findall(r"\d+", background)[:3]) < 150, background
        assert w.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        w.close()


def test_with_the_log_off_the_page_says_conversations_are_not_kept(browser, models, tmp_path):
    s = Server(models["md"], tmp_path)  # the helper's TALLOW_NO_LOG=1
    w = Watched(browser, s.url)
    try:
        w.open()
        assert w.page.locator("#not-kept").is_visible()
        assert "not kept" in w.page.locator("#not-kept").inner_text()
        w.send("Say hello")
        w.stats(0)  # answered all the same
        assert w.page.locator("#conversations li").count() == 0 and w.errors == []
    finally:
        w.close()
        s.close()


def test_images_attach_when_the_model_has_a_projector(browser, default_home, default_model, tmp_path):
    """The colour projector (tests/helpers/projector.py) makes the default model see a solid
    colour: the answer names the colour of the picture the page attached."""
    from helpers.projector import solid_png, write_colour_projector

    proj = write_colour_projector(tmp_path / "colour-mmproj.gguf", default_model)
    s = Server("smollm2:135m", tmp_path, "--mmproj", str(proj), env=shared_store(default_home))
    w = Watched(browser, s.url)
    try:
        w.open("?model=smollm2:135m")  # the shared store holds other models too (an embedding model, say)
        assert w.page.locator("#attach-label").is_visible()
        w.setting("temperature", "0")
        w.setting("max_tokens", "12")
        for i, (colour, rgb) in enumerate((("red", (255, 0, 0)), ("blue", (0, 0, 255)))):
            w.page.set_input_files("#attach", str(solid_png(tmp_path / f"{colour}.png", rgb)))
            w.page.locator(".chip", has_text=f"{colour}.png").wait_for()
            w.send("What colour is this image? Answer with one word.")
            w.stats(i)
            assert w.page.locator(f'article.user[data-index="{i}"] img').count() == 1
            answer = w.page.locator(f'article.assistant[data-index="{i}"] .body').inner_text().lower()
            assert colour in answer, answer
        origin_only(w, s)
    finally:
        w.close()
        s.close()


def test_a_server_with_a_key_asks_for_it_once(browser, models, tmp_path):
    s = Server(models["md"], tmp_path, "--api-key", "sesame", env={"TALLOW_NO_LOG": "0"})
    w = Watched(browser, s.url)
    try:
        w.page.goto(s.url + "/")
        dialog = w.page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        w.page.fill("#key", "wrong")
        w.page.press("#key", "Enter")
        w.page.locator("#key-why", has_text="refused").wait_for()
        w.page.fill("#key", "sesame")
        w.page.press("#key", "Enter")
        w.page.wait_for_selector("body[data-ready=true]")
        w.send("Say hello", "md.gguf")
        usage, _ = w.stats(0)
        assert usage["completion_tokens"] == 6
        w.page.reload()
        w.page.wait_for_selector("body[data-ready=true]")
        assert dialog.is_hidden()  # kept in this browser: asked once
        assert w.page.locator("#conversations li").count() == 1
        assert w.errors == [] or all("401" in e for e in w.errors)
        origin_only(w, s)
    finally:
        w.close()
        s.close()


def test_screenshot_for_the_readme(browser, default_home, tmp_path):
    """The README's picture, taken here: the default model answering, with its stats line.
    Written to docs/images/ when TALLOW_UPDATE_SCREENSHOT=1, else to a temporary folder."""
    # the stored model by its name, from the shared store; this test's own history log
    s = Server("smollm2:135m", tmp_path, env={"TALLOW_NO_LOG": "0", **shared_store(default_home)})
    w = Watched(browser, s.url, viewport={"width": 1100, "height": 720}, color_scheme="light")
    try:
        w.open()  # the shared store may hold an embedding model too, sorted first: the page picks one that chats
        assert w.page.input_value("#model") == "smollm2:135m"
        w.setting("max_tokens", "60")
        w.setting("temperature", "0")
        w.send("Why is the sky blue? Answer in two sentences.")
        usage, line = w.stats(0)
        assert usage["completion_tokens"] > 0 and line.startswith(f"prompt {usage['prompt_tokens']} tok")
        w.setting("max_tokens", "30")
        w.send("And at sunset?")
        again, _ = w.stats(1)
        assert again["cached_tokens"] >= usage["prompt_tokens"] - 1  # the first turn's prompt, from the KV cache
        w.page.locator("#conversations li").first.wait_for()
        out = SCREENSHOT if os.environ.get("TALLOW_UPDATE_SCREENSHOT") == "1" else tmp_path / "chat-page.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        w.page.screenshot(path=str(out))
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert SCREENSHOT.exists() and "docs/images/chat-page.png" in (REPO / "README.md").read_text()
    finally:
        w.close()
        s.close()


DROP = """([data, name, type]) => {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  const files = new DataTransfer();
  files.items.add(new File([bytes], name, { type }));
  document.querySelector("#composer").dispatchEvent(new DragEvent("drop", { dataTransfer: files, bubbles: true,
                                                                             cancelable: true }));
}"""


def test_speech_dropped_or_recorded_is_written_into_the_message_box(playwright, default_model, tmp_path):
    """A recording dropped on the page, and one made with the page's microphone button (Chromium's
    fake capture device plays an espeak-ng clip), are transcribed by the server's Whisper model
    into the message box, to be read over before sending."""
    import base64

    pytest.importorskip("faster_whisper")
    from helpers.processes import run_tallow
    from helpers.speech import spoken, whisper_folder

    home = tmp_path / "home"
    for name, source in (("smollm2:135m", default_model), ("whisper:base", whisper_folder())):
        done = run_tallow(["import", str(source), "--name", name, "--link"], home=home)
        assert done.returncode == 0, done.stderr.decode()
    clip = spoken("The quick brown fox jumps over the lazy dog.", tmp_path / "fox.wav")
    fox = {"quick", "brown", "fox", "lazy", "dog"}
    heard = lambda: fox <= set(re.findall(r"[a-z]+", w.page.input_value("#prompt").lower()))  # noqa: E731
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={clip}"])
    s = Server("smollm2:135m", home)
    w = Watched(b, s.url)
    try:
        w.open()
        assert w.page.input_value("#model") == "smollm2:135m" and w.page.locator("#dictate").is_visible()
        w.page.evaluate(DROP, [base64.b64encode(clip.read_bytes()).decode(), "fox.wav", "audio/wav"])
        w.page.wait_for_function("() => /fox/i.test(document.querySelector('#prompt').value)", timeout=120_000)
        assert heard()
        w.page.evaluate(DROP, [base64.b64encode(b"%PDF-1.4").decode(), "notes.pdf", "application/pdf"])
        w.page.locator("#status", has_text="notes.pdf: not a picture or a recording").wait_for()
        w.page.fill("#prompt", "")
        w.page.click("#dictate")
        w.page.locator("#dictate[aria-pressed=true]").wait_for()
        w.page.wait_for_timeout(4000)  # the fake microphone plays the clip (about 3 s) meanwhile
        w.page.click("#dictate")
        w.page.wait_for_function("() => /fox/i.test(document.querySelector('#prompt').value)", timeout=120_000)
        assert heard() and w.page.get_attribute("#dictate", "aria-pressed") == "false"
        assert w.errors == []
        origin_only(w, s)
    finally:
        w.close()
        b.close()
        s.close()
