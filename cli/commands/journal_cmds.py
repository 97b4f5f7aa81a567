"""`tallow logs --follow` and `tallow logs --curl ID`: the journal of a running `tallow serve`
(serve/http/journal.py), as it grows, and one logged request as a command that replays it.

A request is shown on one line when it ends: the front's record (method, path, status, time,
model, key name) with its runner's (tokens, TTFT, decode speed, finish reason), which is
written first and waits here for it; loads, unloads and crashes as they happen."""

from __future__ import annotations

import fnmatch
import json
import shlex
import sys
from datetime import datetime
from typing import Any

from tallow.common.errors import TallowError
from tallow.env import settings

KINDS = ("http", "answer", "load", "unload", "crash")
WAITING = 1000  # answers held for their request's record, at most


def follow(model: str | None, kinds: list[str], errors: bool, as_json: bool) -> None:
    """Print the journal's new records until Ctrl-C."""
    from tallow.serve.http.journal import follow as records

    bad = [k for k in kinds if k not in KINDS]
    if bad:
        import typer

        raise typer.BadParameter(f"'{bad[0]}' is not a kind of record ({', '.join(KINDS)})", param_hint="--kind")
    path = settings.journal_path()
    sys.stderr.write(f"following {path} (Ctrl-C to stop)\n")
    sys.stderr.flush()
    answers: dict[str, dict] = {}
    for record in records(path, stop=lambda: False):
        if record.get("kind") == "answer" and not as_json:
            answers[str(record.get("id"))] = record  # shown with its request's line
            while len(answers) > WAITING:
                answers.pop(next(iter(answers)))
            continue
        if not _wanted(record, model, kinds, errors):
            continue
        line = json.dumps(record, ensure_ascii=False) if as_json else _line(record, answers.pop(str(record.get("id")),
                                                                                                  None))
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _wanted(record: dict[str, Any], model: str | None, kinds: list[str], errors: bool) -> bool:
    if kinds and record.get("kind") not in kinds:
        return False
    if model and not fnmatch.fnmatch(str(record.get("model") or ""), model):
        return False
    return not errors or record.get("kind") == "crash" or int(record.get("status") or 0) >= 400


def _line(record: dict[str, Any], answer: dict[str, Any] | None) -> str:
    when = datetime.fromtimestamp(float(record.get("t", 0))).strftime("%H:%M:%S")
    kind = record.get("kind")
    if kind == "load":
        return f"{when} load {record.get('model')} in {record.get('ms')} ms (pid {record.get('pid')})"
    if kind == "unload":
        return f"{when} unload {record.get('model')}: {record.get('why')}"
    if kind == "crash":
        return f"{when} crash {record.get('model')}: {record.get('exit')}" + \
            (f": {record['error']}" if record.get("error") else "")
    if kind == "answer":
        return f"{when} {record.get('id')} {record.get('model')} {_figures(record)}"
    model = record.get("model") or (answer or {}).get("model")  # a body that names none: the model that answered
    line = (f"{when} {record.get('id')} {record.get('method')} {record.get('path')} {record.get('status')} "
            f"{record.get('ms')} ms" + (f" {model}" if model else "")
            + (f" key {record['key']}" if record.get("key") else ""))
    return line + (f" · {_figures(answer)}" if answer else "")


def _figures(a: dict[str, Any]) -> str:
    return (f"prompt {a.get('prompt_tokens')} ({a.get('cached_tokens')} cached) · out {a.get('completion_tokens')} · "
            f"TTFT {a.get('ttft_ms')} ms · {a.get('decode_tps')} tok/s · {a.get('finish_reason')}")


def curl(rid: str) -> str:
    """The curl command that sends logged request `rid` again to the server that logged it."""
    from tallow.serve.http.journal import find

    record = find(settings.journal_path(), rid)
    if record is None:
        raise TallowError(f"no request {rid!r} in the journal {settings.journal_path()}",
                          "ids are in tallow logs --follow, and in each answer's X-Request-Id header")
    if "body" not in record:
        raise TallowError(f"the journal has no body for request {rid}",
                          "start tallow serve with --log-requests to keep them")
    body = record["body"]
    parts = ["curl", "-sS"] + (["-N"] if body.get("stream") else [])
    parts += [f"http://127.0.0.1:{record.get('port') or 8080}{record['path']}", "-H", "Content-Type: application/json"]
    command = " ".join(shlex.quote(p) for p in parts)
    if record.get("auth"):  # the key itself is never written: the variable holding it is named
        command += ' -H "Authorization: Bearer $TALLOW_API_KEY"'
    return command + " -d " + shlex.quote(json.dumps(body, ensure_ascii=False))
