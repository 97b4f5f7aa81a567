"""A page in Debian's chromium, driven by Playwright (its Python package; its own browser
download is never used), and everything the page did that a test may check afterwards."""

from __future__ import annotations

import json
import os
import shutil

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)),
                None)


class Watched:
    """A page, and everything it did that a test may want to check afterwards."""

    def __init__(self, browser, url: str, **context) -> None:
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", self.dialog)
        self.url = url

    def dialog(self, d) -> None:
        self.dialogs.append(d.message)
        d.dismiss()

    def open(self, query: str = "") -> None:
        self.page.goto(self.url + "/" + query)
        self.page.wait_for_selector("body[data-ready=true]")

    def send(self, text: str, model: str | None = None) -> None:
        if model:
            self.page.select_option("#model", model)
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def setting(self, name: str, value: str) -> None:
        """One field of the settings panel, as a person sets it: open, type, close."""
        self.page.click("#open-settings")
        self.page.fill("#" + name, value)
        self.page.click("#close-settings")

    def answered(self, index: int):
        """The answer's node once its stats line is there (the stream has ended)."""
        node = self.page.locator(f'article.assistant[data-index="{index}"]')
        node.locator(".stats[data-usage]").wait_for(timeout=180_000)  # bounded; a loaded CI machine is slow
        return node

    def stats(self, index: int) -> tuple[dict, str]:
        node = self.answered(index)
        stats = node.locator(".stats")
        return json.loads(stats.get_attribute("data-usage")), stats.inner_text()

    def close(self) -> None:
        self.context.close()
