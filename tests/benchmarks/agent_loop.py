"""A 10-step tool loop on the default model, through each agent API of tallow serve: chat
completions (the whole history each step), the Responses API (previous_response_id) and
Anthropic's Messages (the whole history). Each step the model must call a tool
(tool_choice required) and the loop appends a ~200-token result.

    python tests/benchmarks/agent_loop.py [--model PATH] [--steps 10] [--rounds 3]

Prints, per route and step, the prompt tokens, how many were evaluated (not cached) and the
client's TTFT; then, in paired, alternating rounds (tests/benchmarks/paired.py), step 10's
TTFT (the whole loop on a fresh server) against a cold prefill of the very same request on
a fresh server with no prompt cache. Exits 1 unless, on every route, each step after the
first evaluates about its new tokens only and step 10's TTFT <= 0.15x the cold one; 3 when
the machine was too noisy to say.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import free_port, wait_ready  # noqa: E402

TARGET = 0.15
SLACK = 64  # tokens a step may evaluate beyond what it adds: the last answer, as re-rendered
SYSTEM = "You are a research agent. Use the tools to look things up, one step at a time."
TOOL = {"name": "lookup", "description": "Look up a topic in the library and return the passage.",
        "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]}}


def passages(model: Path, n: int) -> list[str]:
    """n passages of ~200 tokens of the shipped prose, cut by the model's tokenizer."""
    from tallow.quantize.evaluate import shipped_text
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with Engine(model, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        tokens = engine.tokenize(shipped_text())
        return [engine.model.detokenize(tokens[i * 200:(i + 1) * 200]).decode("utf-8", "replace") for i in range(n)]


def stream(url: str, path: str, body: dict) -> tuple[float, dict, list[dict]]:
    """(client TTFT ms, the usage, all events) of a streamed request."""
    req = urllib.request.Request(url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    started, first, events = time.perf_counter(), None, []
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            events.append(ev)
            if first is None and _is_output(ev):
                first = time.perf_counter()
    return ((first or time.perf_counter()) - started) * 1000, _usage(events), events


def _is_output(ev: dict) -> bool:
    if "choices" in ev:
        return any(c.get("delta", {}).get("content") or c.get("delta", {}).get("tool_calls") for c in ev["choices"])
    return ev.get("type") in ("response.output_item.added", "content_block_start")


def _usage(events: list[dict]) -> dict:
    """(prompt tokens, cached tokens) in each API's terms."""
    for ev in reversed(events):
        if ev.get("usage") and "prompt_tokens" in ev["usage"]:
            u = ev["usage"]
            return {"prompt": u["prompt_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"]}
        if ev.get("type") in ("response.completed", "response.incomplete"):
            u = ev["response"]["usage"]
            return {"prompt": u["input_tokens"], "cached": u["input_tokens_details"]["cached_tokens"]}
        if ev.get("type") == "message_delta":
            u = ev["usage"]
            return {"prompt": u["input_tokens"] + u["cache_read_input_tokens"], "cached": u["cache_read_input_tokens"]}
    raise AssertionError("no usage in the stream")


def _call(events: list[dict], route: str) -> tuple[str, str, str]:
    """(call id, name, arguments) of the answer's first call."""
    if route == "chat":
        deltas = [d for ev in events for c in ev.get("choices", []) for d in c.get("delta", {}).get("tool_calls") or []]
        first = next(d for d in deltas if d.get("id"))
        args = "".join(d["function"].get("arguments", "") for d in deltas if d["index"] == first["index"])
        return first["id"], first["function"]["name"], args
    if route == "responses":
        item = next(ev["item"] for ev in events if ev.get("type") == "response.output_item.done"
                    and ev["item"]["type"] == "function_call")
        return item["call_id"], item["name"], item["arguments"]
    block = next(ev["content_block"] for ev in events if ev.get("type") == "content_block_start"
                 and ev["content_block"]["type"] == "tool_use")
    args = "".join(ev["delta"]["partial_json"] for ev in events if ev.get("type") == "content_block_delta"
                   and ev["delta"]["type"] == "input_json_delta")
    return block["id"], block["name"], args


def loop(url: str, route: str, results: list[str]) -> tuple[list[dict], dict]:
    """Run the loop; returns its steps and the last step's request written out in full (for
    the cold server, which has no stored responses)."""
    steps, history, previous, items = [], [], None, []
    question = "Find out how the library describes its history."
    for n, result in enumerate(results, 1):
        if route == "chat":
            body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}, *history],
                    "tools": [{"type": "function", "function": TOOL}], "tool_choice": "required", "max_tokens": 64,
                    "temperature": 0, "stream_options": {"include_usage": True}}
            path = "/v1/chat/completions"
        elif route == "responses":
            if previous is None:
                items.append({"role": "user", "content": question})
            new = items[-1:]
            body = {"input": new, "instructions": SYSTEM, "tools": [{"type": "function", **TOOL}],
                    "tool_choice": "required", "max_output_tokens": 64, "temperature": 0}
            if previous:
                body["previous_response_id"] = previous
            path = "/v1/responses"
        else:
            body = {"system": SYSTEM, "messages": [{"role": "user", "content": question}, *history], "max_tokens": 64,
                    "tools": [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}],
                    "tool_choice": {"type": "any"}, "temperature": 0}
            path = "/v1/messages"
        ttft, usage, events = stream(url, path, body)
        steps.append({"step": n, "ttft_ms": ttft, **usage, "evaluated": usage["prompt"] - usage["cached"]})
        cid, name, args = _call(events, route)
        full = body
        if route == "chat":
            history += [{"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function",
                                                                               "function": {"name": name, "arguments": args}}]},
                        {"role": "tool", "tool_call_id": cid, "content": result}]
        elif route == "responses":
            done = next(ev for ev in events if ev.get("type") in ("response.completed", "response.incomplete"))
            previous = done["response"]["id"]
            full = {**body, "input": list(items)}  # what the stored conversation holds, and the new item
            full.pop("previous_response_id", None)
            items += [{"type": "function_call", "call_id": cid, "name": name, "arguments": args},
                      {"type": "function_call_output", "call_id": cid, "output": result}]
        else:
            history += [{"role": "assistant", "content": [{"type": "tool_use", "id": cid, "name": name,
                                                           "input": json.loads(args)}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": result}]}]
    return steps, {"path": path, "body": full}


def server(model: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """A fresh server with an empty home (no prompt cache on disk, responses kept in memory)."""
    import tempfile

    from helpers.processes import shared_home

    from benchmarks.llamabench import tallow_env

    home = tempfile.mkdtemp(prefix="agent-loop-")
    env = tallow_env(Path(home), TALLOW_MACHINE_CACHE=str(shared_home() / "machine.json"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(port),
                             "--parallel", "1", "--ctx", "8192", "--threads", "2", *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, "tallow serve")
    return proc, url


def main() -> int:
    from benchmarks.overhead import default_model
    from benchmarks.paired import Comparison, compare, exit_code

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = args.model or default_model()
    results = passages(model, args.steps)
    ok, verdicts = True, []
    for route in ("chat", "responses", "messages"):
        runs: list[tuple[list[dict], dict]] = []

        def measure(arm: str, route: str = route, runs: list = runs) -> float:
            if arm == "subject" or not runs:
                proc, url = server(model)
                try:
                    runs.append(loop(url, route, results))
                finally:
                    proc.terminate()
                    proc.wait(30)
                if arm == "subject":
                    return runs[-1][0][-1]["ttft_ms"]
            cold_proc, cold_url = server(model, "--no-cache")
            try:  # for Responses, the stored conversation written out as items: the same prompt
                cold, usage, _ = stream(cold_url, runs[0][1]["path"], runs[0][1]["body"])
            finally:
                cold_proc.terminate()
                cold_proc.wait(30)
            assert usage["prompt"] == runs[0][0][-1]["prompt"], (usage, runs[0][0][-1])
            return cold

        verdicts.append(compare(Comparison(f"{route}: step {args.steps} TTFT / a cold prefill of its request", measure,
                                           TARGET, True, args.rounds, unit=" ms")))
        steps = runs[-1][0]
        print(f"{route}: step  prompt  evaluated  TTFT ms (the last loop)")
        for s in steps:
            print(f"{'':>{len(route)}}  {s['step']:>4}  {s['prompt']:>6}  {s['evaluated']:>9}  {s['ttft_ms']:>7.0f}")
        grew = all(s["evaluated"] <= (s["prompt"] - p["prompt"]) + SLACK for run, _ in runs
                   for p, s in zip(run, run[1:]))
        print("  every step evaluated only what it added" if grew else "  a step re-read old turns")
        ok = ok and grew
    return exit_code(verdicts) or (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
