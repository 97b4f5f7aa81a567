"""tallow serve under a long mixed load, with hostile habits, and nothing lost.

    python tests/benchmarks/soak.py [--minutes 10] [--clients 6] [--seed 1]

One `tallow serve` with two chat models, an embedding model when the test home has one
(all-minilm:l6-v2, from the test suite's fetch) and `--auth keys`: a team key, an admin key
and a flooding key held to 120 requests a minute. At once, until the time is up:
- the official openai (chat, whole and streamed, n=2, a JSON schema, tools, an image, a draft
  model; stored Responses, each second one continuing an earlier; embeddings), anthropic and
  ollama clients, and llama.cpp's native /completion over plain HTTP (alpha has a projector,
  and `sketch` drafts for either model);
- clients that leave mid-stream, and one that reads slowly;
- the admin unloading a model (keep_alive 0) every 15 s, racing the requests for it, and
  models expiring (--keep-alive 20s);
- a runner killed with SIGKILL every 90 s, mid-answer when there is one;
- the flooding key, as fast as it is answered (429s are its expected answers).

It fails (exit 1) on: a 5xx other than a killed runner's in-flight requests (those must name
the crash), a request never answered, the front's RSS or open files growing after warm-up
(compared in thirds, slope reported), a process or a temporary folder left behind, or the
journal's books not balancing: every 200 of a generating route has exactly its answers'
records (one per choice), and every answer of a keyed request has its usage row (request by
request: a row carries its request's id); or a stored Response a client was given missing
from the history database.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.growth import Growth  # noqa: E402
from helpers.processes import shared_home  # noqa: E402
from helpers.projector import solid_png, write_colour_projector  # noqa: E402
from helpers.synth import write_synthetic_gguf  # noqa: E402

GENERATING = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat", "/completion")
WINDOW_MARGIN_S = 150.0  # longer than any request takes: an answer and its request's record are both in the window
CRASH_WORDS = ("runner_crashed", "stopped mid-answer", "failed to load", "killed by")


class Soak:
    def __init__(self, home: Path, minutes: float, clients: int, seed: int, kill_every: float = 90.0) -> None:
        self.home, self.deadline, self.clients = home, time.monotonic() + minutes * 60, clients
        self.kill_every, self.started = kill_every, time.monotonic()
        self.random = random.Random(seed)
        self.outcomes: Counter = Counter()
        self.problems: list[str] = []
        self.ttft: list[float] = []
        self.kills: list[float] = []  # when a runner was killed (monotonic)
        self.killed: set[int] = set()  # the runners killed
        self.lock = threading.Lock()
        self.growth = Growth()  # the front's and the runners' RSS and open files, every second
        self.runner_pids: set[int] = set()
        self.private: set[Path] = set()  # the server's own temporary folders (its runners' sockets)
        self.stored: list[str] = []  # the ids of the stored Responses the clients were given
        self.stored_model: dict[str, str] = {}

    # -- set-up ----------------------------------------------------------------------------
    def tallow(self, *args: str) -> str:
        env = {**os.environ, "TALLOW_HOME": str(self.home), "NO_COLOR": "1"}
        got = subprocess.run([sys.executable, "-m", "tallow.cli", *args], env=env, capture_output=True, text=True,
                             timeout=300)
        if got.returncode != 0:
            raise SystemExit(f"tallow {' '.join(args)} failed: {got.stderr}")
        return got.stdout.strip()

    def start(self) -> None:
        models = self.home / "files"
        models.mkdir()
        alpha = write_synthetic_gguf(models / "alpha.gguf", seed=1)
        self.tallow("import", str(alpha), "--name", "alpha", "--mmproj",
                    str(write_colour_projector(models / "alpha-mmproj.gguf", alpha)))
        self.tallow("import", str(write_synthetic_gguf(models / "beta.gguf", seed=2)), "--name", "beta")
        self.tallow("import", str(write_synthetic_gguf(models / "sketch.gguf", seed=3)), "--name", "sketch")
        png = solid_png(models / "red.png", (255, 0, 0)).read_bytes()
        self.picture = "data:image/png;base64," + base64.b64encode(png).decode()
        minilm = _minilm()
        self.embedder = None
        if minilm is not None:
            self.tallow("import", str(minilm), "--name", "minilm")
            self.embedder = "minilm"
        self.keys = {"team": self.tallow("keys", "create", "team"),
                     "admin": self.tallow("keys", "create", "admin", "--routes", "generate,embed,admin"),
                     "flood": self.tallow("keys", "create", "flood", "--requests-per-minute", "120")}
        env = {**os.environ, "TALLOW_HOME": str(self.home), "NO_COLOR": "1"}
        env.pop("TALLOW_API_KEY", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", "alpha", "beta", "--auth", "keys",
                                      "--port", "0", "--parallel", "2", "--max-models", "3", "--keep-alive", "20s",
                                      "--log-requests"],
                                     env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        line = ""
        while "serving" not in line:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit("tallow serve did not start")
        self.url = line.split(" on ")[-1].split()[0]
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    # -- the load --------------------------------------------------------------------------
    def note(self, kind: str, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes[(kind, outcome)] += 1
            if outcome in ("unexpected", "unanswered"):
                self.problems.append(f"{kind}: {detail}"[:300])

    def judged(self, kind: str, exc: BaseException) -> None:
        """An exception of a client call: a refusal, a killed runner's request, or a problem."""
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None) or getattr(exc, "code", None)
        text = f"{type(exc).__name__}: {exc}"
        recent_kill = any(time.monotonic() - k < 30 for k in self.kills)
        if isinstance(status, int) and 400 <= status < 500:
            self.note(kind, "refused")
        elif recent_kill and any(w in text for w in CRASH_WORDS):
            self.note(kind, "killed runner")
        elif "timed out" in text.lower() or "Timeout" in type(exc).__name__:
            self.note(kind, "unanswered", text)
        else:
            self.note(kind, "unexpected", text)

    def client(self, i: int) -> None:
        import anthropic
        import ollama
        import openai

        rnd = random.Random(i)
        key = self.keys["team"]
        oa = openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)
        an = anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0, timeout=120)
        ol = ollama.Client(host=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        kinds = ["chat", "stream", "leave", "slow", "n2", "schema", "tools", "image", "draft", "responses",
                 "anthropic", "ollama", "native"]
        if self.embedder:
            kinds.append("embed")
        while time.monotonic() < self.deadline:
            kind = rnd.choice(kinds)
            model = rnd.choice(("alpha", "beta"))
            try:
                self.one(kind, model, oa, an, ol, rnd)
            except Exception as exc:  # noqa: BLE001 - every failure is classified
                self.judged(kind, exc)

    def one(self, kind: str, model: str, oa, an, ol, rnd) -> None:
        user = [{"role": "user", "content": f"question {rnd.random():.6f}"}]
        if kind in ("stream", "leave", "slow"):
            started, first, chunks = time.perf_counter(), None, 0
            stream = oa.chat.completions.create(model=model, messages=user, max_tokens=24, stream=True,
                                                extra_body={"ignore_eos": True})
            for _ in stream:
                chunks += 1
                if first is None:
                    first = time.perf_counter() - started
                if kind == "leave" and chunks == 3:
                    stream.close()  # the client leaves mid-answer
                    self.note(kind, "left")
                    return
                if kind == "slow":
                    time.sleep(0.05)
            with self.lock:
                self.ttft.append(first or 0.0)
            self.note(kind, "ok")
        elif kind == "chat":
            oa.chat.completions.create(model=model, messages=user, max_tokens=8)
            self.note(kind, "ok")
        elif kind == "n2":
            got = oa.chat.completions.create(model=model, messages=user, max_tokens=6, n=2)
            self.note(kind, "ok" if len(got.choices) == 2 else "unexpected", f"{len(got.choices)} choices")
        elif kind == "schema":
            schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
            oa.chat.completions.create(model=model, messages=user, max_tokens=16, response_format={
                "type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
            self.note(kind, "ok")
        elif kind == "tools":
            tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
            oa.chat.completions.create(model=model, messages=user, max_tokens=8, tools=[tool])
            self.note(kind, "ok")
        elif kind == "image":  # alpha's projector: a picture's tokens in the prompt
            oa.chat.completions.create(model="alpha", max_tokens=8, messages=[{"role": "user", "content": [
                {"type": "text", "text": "what colour?"}, {"type": "image_url", "image_url": {"url": self.picture}}]}])
            self.note(kind, "ok")
        elif kind == "draft":  # speculative decoding: the runner loads sketch on first use (again after a kill)
            got = oa.chat.completions.create(model=model, messages=user, max_tokens=12,
                                             extra_body={"draft": "sketch", "ignore_eos": True})
            tokens = got.usage.completion_tokens if got.usage else None
            self.note(kind, "ok" if tokens == 12 else "unexpected", f"a drafted answer of {tokens} tokens, not 12")
        elif kind == "responses":  # stored; every second one continues one stored earlier (by its model)
            with self.lock:
                earlier = self.stored[-1] if self.stored and rnd.random() < 0.5 else None
            got = oa.responses.create(model=model if earlier is None else self.stored_model[earlier],
                                      input=user[0]["content"], max_output_tokens=8, store=True,
                                      previous_response_id=earlier)
            with self.lock:
                self.stored.append(got.id)
                self.stored_model[got.id] = got.model
            self.note(kind, "ok")
        elif kind == "anthropic":  # whole or streamed, by turns
            if rnd.random() < 0.5:
                an.messages.create(model=model, max_tokens=8, messages=user)
            else:
                with an.messages.stream(model=model, max_tokens=8, messages=user) as stream:
                    stream.get_final_message()
            self.note(kind, "ok")
        elif kind == "ollama":
            if rnd.random() < 0.5:
                ol.chat(model=model, messages=user, options={"num_predict": 8})
            else:
                parts = list(ol.chat(model=model, messages=user, options={"num_predict": 8}, stream=True))
                self.note(kind, "ok" if parts and parts[-1].done else "unexpected", "a stream that did not end")
                return
            self.note(kind, "ok")
        elif kind == "native":
            self.post("/completion", {"model": model, "prompt": "once upon", "n_predict": 8}, self.keys["team"])
            self.note(kind, "ok")
        elif kind == "embed":
            oa.embeddings.create(model=self.embedder, input=["a sentence", "another one"])
            self.note(kind, "ok")

    def post(self, path: str, body: dict, key: str) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # judged by its status and what its body says
            raise Refusal(exc.code, exc.read().decode("utf-8", "replace")) from None

    def flood(self) -> None:
        import openai

        oa = openai.OpenAI(base_url=self.url + "/v1", api_key=self.keys["flood"], max_retries=0, timeout=120)
        while time.monotonic() < self.deadline:
            try:
                oa.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "x"}], max_tokens=2)
                self.note("flood", "ok")
            except Exception as exc:  # noqa: BLE001 - 429 is the expected refusal
                self.judged("flood", exc)
            time.sleep(0.02)  # fifty a second at most: a flood, not a busy loop of this process

    def racer(self) -> None:
        last_unload = last_kill = time.monotonic()
        while time.monotonic() < self.deadline:
            time.sleep(1)
            now = time.monotonic()
            if now - last_unload > 15:
                last_unload = now
                try:
                    self.post("/api/generate", {"model": self.random.choice(("alpha", "beta")), "keep_alive": 0},
                              self.keys["admin"])
                except Exception as exc:  # noqa: BLE001
                    self.judged("unload", exc)
            if now - last_kill > self.kill_every:
                last_kill = now
                pids = [m["pid"] for m in self.get("/api/ps")["models"] if m.get("pid")]
                self.runner_pids.update(pids)
                if pids:
                    self.kills.append(time.monotonic())
                    self.killed.add(victim := self.random.choice(pids))
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # it ended a moment ago (an unload)
                print(f"{time.monotonic() - self.started:6.1f} s: killed a runner, one of {pids}", flush=True)
            self.sample()
            try:
                self.watch_runners()
            except Exception as exc:  # noqa: BLE001 - a listing that failed is a finding, not the end of the racer
                self.judged("ps", exc)

    def watch_runners(self) -> None:
        """The runners' pids, and the private folder of their sockets: both must be gone at the end."""
        for m in self.get("/api/ps")["models"]:
            pid = m.get("pid")
            if not pid:
                continue
            self.runner_pids.add(pid)
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            self.private.update(Path(a.decode()).parent for a in args if b"tallow-serve-" in a)

    def get(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.keys['admin']}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def sample(self) -> None:
        self.growth.sample(self.proc.pid, list(self.runner_pids))

    def run(self) -> None:
        import anthropic  # noqa: F401 - imported here, once: imports racing in threads see half a module
        import ollama  # noqa: F401
        import openai  # noqa: F401

        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.clients)]
        threads += [threading.Thread(target=self.flood, daemon=True), threading.Thread(target=self.racer, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, self.deadline - time.monotonic() + 180))
            if t.is_alive():
                self.problems.append(f"{t.name} still waiting 180 s past the end: a request never answered")

    # -- the books -------------------------------------------------------------------------
    def stop(self) -> list[str]:
        time.sleep(2)  # the last usage rows and journal lines are written as requests end
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(120)
        failures = [] if code == 0 else [f"the server exited {code} on SIGTERM"]
        time.sleep(1)
        failures += [f"runner process {pid} left behind" for pid in sorted(self.runner_pids) if _alive(pid)]
        failures += [f"temporary folder {p} left behind" for p in sorted(self.private) if p.exists()]
        return failures + self.leftovers() + self.books()

    def leftovers(self) -> list[str]:
        """Temporary files in the home: the store's, a half-written file's, and the engines'
        thread claims of runners that ended on their own (a killed one's is swept by the next
        engine to start, so the last kills' may stay)."""
        out = [f"temporary file {p} left behind" for p in (self.home / "models" / "tmp").glob("*")]
        out += [f"half-written file {p} left behind" for p in self.home.rglob("*.tmp")]
        for claim in (self.home / "run" / "engines").glob("*.json"):
            if not claim.stem.isdigit() or int(claim.stem) not in self.killed:
                out.append(f"engine claim {claim.name} left behind by a runner that was not killed")
        return out

    def books(self) -> list[str]:
        """The journal against itself and against the usage rows, request by request (a row
        carries its request's id). The journal is cut at 16 MiB with one old file kept, so a
        long run's books cover the requests that ended WINDOW_MARGIN_S past the oldest record kept."""
        journal = self.home / "serve-journal.jsonl"
        old = journal.with_name(journal.name + ".1")
        records = [json.loads(line) for f in (old, journal) if f.exists() for line in f.read_text().splitlines()]
        start = records[0]["t"] + WINDOW_MARGIN_S if old.exists() else 0.0
        answers = Counter(r["id"] for r in records if r["kind"] == "answer")
        rows = self.rows()
        failures: list[str] = []
        self.lost = self.extra = self.judged_requests = 0
        for r in records:
            if r["kind"] != "http" or r["t"] < start or r["path"] not in GENERATING or not r.get("key"):
                continue
            self.judged_requests += 1
            rid, body = r["id"], r.get("body") or {}
            have, metered = answers.get(rid, 0), rows.get(rid, 0)
            want = body.get("n", 1)  # a whole answer's 200 comes after its answers; a stream's says it began
            if r["status"] == 200 and (have > want or (not body.get("stream") and have != want)):
                failures.append(f"request {rid} ({r['path']}, 200) has {have} answer records, not {want}")
            if metered < have:  # an answer given, never metered
                self.lost += have - metered
                failures.append(f"request {rid} ({r['path']}) has {have} answers and {metered} usage rows")
            self.extra += max(0, metered - have)
        # A row is committed before its answer's journal line and its end: a runner killed in
        # that moment leaves a row of an answer never given (its client got the crash error).
        if self.extra > 2 * len(self.kills):
            failures.append(f"{self.extra} usage rows of answers never given ({len(self.kills)} runners killed)")
        failures += self.history()
        self.loads = sum(r["kind"] == "load" for r in records)
        self.crashes = sum(r["kind"] == "crash" for r in records)
        self.window = (records[-1]["t"] - max(start, records[0]["t"])) / 60 if records else 0.0
        return failures[:20]

    def history(self) -> list[str]:
        """Every stored Response a client was given is in the history database (stored before
        its client hears it is complete); one stored and then cut by a kill is reported."""
        import sqlite3

        db = sqlite3.connect(self.home / "history.db")
        try:
            kept = {rid for (rid,) in db.execute("SELECT id FROM api_responses")}
        finally:
            db.close()
        missing = [rid for rid in self.stored if rid not in kept]
        self.unheard = len(kept - set(self.stored))
        out = [f"{len(missing)} of {len(self.stored)} stored Responses given missing, e.g. {missing[0]}"] if missing else []
        if self.unheard > 2 * len(self.kills):
            out.append(f"{self.unheard} stored Responses no client was given ({len(self.kills)} runners killed)")
        return out

    def rows(self) -> Counter:
        """Usage rows by the id of the request they meter."""
        import sqlite3

        db = sqlite3.connect(self.home / "history.db")
        try:
            return Counter(dict(db.execute("SELECT request, COUNT(*) FROM usage WHERE request IS NOT NULL "
                                           "GROUP BY request").fetchall()))
        finally:
            db.close()

    def report(self) -> None:
        print(f"requests by kind and outcome ({sum(self.outcomes.values())} in all):")
        for (kind, outcome), n in sorted(self.outcomes.items()):
            print(f"  {kind:<10} {outcome:<14} {n}")
        if self.ttft:
            q = statistics.quantiles(self.ttft, n=100) if len(self.ttft) > 1 else [self.ttft[0]] * 99
            print(f"streamed TTFT p50 {q[49] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms ({len(self.ttft)} streams)")
        print(f"runners killed {len(self.kills)}; in the journal's last {getattr(self, 'window', 0):.1f} minutes: loads "
              f"{getattr(self, 'loads', 0)}, crashes {getattr(self, 'crashes', 0)}; of "
              f"{getattr(self, 'judged_requests', 0)} keyed generations judged, answers without a usage row "
              f"{getattr(self, 'lost', 0)}, rows of answers cut by a kill {getattr(self, 'extra', 0)}; stored Responses "
              f"given {len(self.stored)}, kept but cut by a kill {getattr(self, 'unheard', 0)}")


class Refusal(Exception):
    """An HTTP error answer of a plain request, with its body (a killed runner's names the crash)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def _minilm() -> Path | None:
    """all-MiniLM's GGUF from the test suite's home, when a test run fetched it."""
    found = sorted((shared_home() / "models" / "blobs").glob("sha256-*")) if (shared_home() / "models").exists() else []
    for blob in found:
        with open(blob, "rb") as f:
            head = f.read(4096)
        if b"bert" in head and blob.stat().st_size < 200 * 2**20:
            return blob
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill-every", type=float, default=90.0, help="seconds between runner kills")
    ap.add_argument("--keep", action="store_true", help="keep the server's home (journal, database) and say where")
    args = ap.parse_args()
    home = contextlib.nullcontext(tempfile.mkdtemp(prefix="tallow-soak-")) if args.keep else \
        tempfile.TemporaryDirectory(prefix="tallow-soak-")
    with home as tmp:
        if args.keep:
            print(f"the server's home: {tmp}", flush=True)
        soak = Soak(Path(tmp), args.minutes, args.clients, args.seed, args.kill_every)
        soak.start()
        try:
            soak.run()
        finally:
            if soak.proc.poll() is None:
                failures = soak.stop()
            else:
                failures = [f"the server died (exit {soak.proc.returncode})"]
        failures = soak.problems[:20] + failures + soak.growth.judge(len(soak.runner_pids))
        soak.report()
    for f in failures:
        print("FAIL:", f)
    print("soak:", "failed" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
