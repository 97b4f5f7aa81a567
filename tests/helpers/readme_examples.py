"""The console examples of the README and the manual's pages as data, and how a run's output
is held against them.

A ```console block holds commands (`$ ...`, continued on the next lines while a quote is
open) and the output each printed. A comment on the line just before the block steers
the runner: `<!-- example: before=CMD; files=a,b; skip=WHY -->` (a command to run first,
unseen; files the runner makes in the working folder; a block that cannot run here).

What "the output matches" means, since answers and timings differ between machines:
- numbers, hex digests and ids, and the words on/off are wildcards; whitespace runs are one;
- a key-value line (`key   value`, as in show, doctor, list) matches a line with the same key;
- JSON (one object, possibly shown wrapped) matches JSON with the same fields, recursively,
  and the same kinds of value; a JSON line shown with `...` names a subset of the fields;
- a model's own words (the answer of run and chat, the answers in the history log) match
  any text, one line or more; tallow's own lines around them (stats, notes, errors) do not;
- everything else matches line for line, in order, and nothing may be left over.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Command:
    text: str  # the command line(s), as typed
    expected: list[str]  # the output shown under it


@dataclass
class Block:
    line: int  # where the block starts in its file (1-based)
    section: str
    commands: list[Command]
    before: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skip: str | None = None


def manual(root: Path) -> list[Path]:
    """The README, then the manual's pages in the order of mkdocs.yml's nav (a newcomer's
    order: later pages may use what earlier ones stored)."""
    import yaml

    def flat(items: list) -> list[str]:
        out: list[str] = []
        for item in items:
            for value in (item.values() if isinstance(item, dict) else [item]):
                out += flat(value) if isinstance(value, list) else [value]
        return out

    nav = yaml.safe_load((root / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [root / "README.md", *(root / "docs" / page for page in flat(nav))]


def parse(readme: str) -> list[Block]:
    blocks: list[Block] = []
    lines = readme.splitlines()
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = line.lstrip("#").strip()
        if line.strip() == "```console":
            start = i
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            block = Block(start + 1, section, _commands(body))
            directive = re.match(r"<!-- example: (.*) -->", lines[start - 1].strip()) if start else None
            if directive:
                for part in directive.group(1).split(";"):
                    key, _, value = part.strip().partition("=")
                    if key == "before":
                        block.before.append(value.strip())
                    elif key == "files":
                        block.files += [f.strip() for f in value.split(",") if f.strip()]
                    elif key == "skip":
                        block.skip = value.strip() or "marked"
                    else:
                        raise ValueError(f"line {start}: unknown example directive {key!r}")
            if block.commands:
                blocks.append(block)
        i += 1
    return blocks


def _commands(body: list[str]) -> list[Command]:
    out: list[Command] = []
    i = 0
    while i < len(body):
        if body[i].startswith("$ "):
            text = body[i][2:]
            while not _complete(text) and i + 1 < len(body):
                i += 1
                text += "\n" + body[i]
            out.append(Command(text, []))
        elif out:
            out[-1].expected.append(body[i])
        i += 1
    return out


def _complete(text: str) -> bool:
    try:
        shlex.split(text)
        return True
    except ValueError:
        return False


# -- matching -----------------------------------------------------------------------------------
_HEX = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
_NUM = re.compile(r"\d+(?:[.,]\d+)*")
_KV = re.compile(r"^(\s*\S.*?)\s{2,}(\S.*)$")
TALLOW_LINE = re.compile(r"^(error:|hint:|note:|interrupted|chatting with|>>> |pulling |pulled )|·")


def shape(line: str) -> str:
    text = re.sub(r" · (length|stop|interrupted|time_limit)$", "", line.strip())  # how the answer ended
    text = _HEX.sub("H", text)
    text = _NUM.sub("#", text)
    text = re.sub(r"\b(on|off)\b", "O", text)
    return re.sub(r"\s+", " ", text)


def _key(line: str) -> str | None:
    m = _KV.match(line)
    return shape(m.group(1)) if m else None


def lines_match(expected: str, actual: str) -> bool:
    key = _key(expected)
    if key is not None and _key(actual) == key:
        return True
    return shape(expected) == shape(actual)


def answer_lines(command: str, expected: list[str]) -> set[int]:
    """Which of a command's shown lines are the model's own words."""
    words = command.split()
    if "tallow" not in words:
        return set()
    sub = words[words.index("tallow") + 1] if words.index("tallow") + 1 < len(words) else ""
    if sub in ("run", "chat") and "--json" not in words:
        return {i for i, line in enumerate(expected) if line.strip() and not TALLOW_LINE.search(line)}
    if sub == "logs":
        return {i for i, line in enumerate(expected) if line.strip() and not line.startswith(("# ", "> "))}
    return set()


def json_value(lines: list[str]):
    """A JSON document shown wrapped over several lines (continuations indented)."""
    return json.loads(" ".join(line.strip() for line in lines))


def same_fields(expected, actual, where: str = "") -> list[str]:
    """Where two JSON values differ in fields or kinds of value (not in values)."""
    kind = lambda v: "null" if v is None else "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__  # noqa: E731
    if isinstance(expected, dict) and isinstance(actual, dict):
        problems = [f"{where}: fields {sorted(set(expected) ^ set(actual))} differ"] if set(expected) != set(actual) else []
        for k in set(expected) & set(actual):
            problems += same_fields(expected[k], actual[k], f"{where}.{k}")
        return problems
    if isinstance(expected, list) and isinstance(actual, list):
        return same_fields(expected[0], actual[0], f"{where}[0]") if expected and actual else []
    if kind(expected) != kind(actual) and expected is not None and actual is not None:
        return [f"{where}: {kind(expected)} shown, {kind(actual)} printed"]
    return []


def named_fields(text: str) -> set[str]:
    """The field names a JSON line shown with `...` mentions."""
    return set(re.findall(r'"(\w+)":', text))


def all_fields(value) -> set[str]:
    out = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(k)
            out |= all_fields(v)
    return out


PROGRESS = re.compile(r"^(pulling|quantizing) \S+: ")  # what a colour terminal shows as a passing bar


def compare(command: str, expected: list[str], actual: list[str]) -> list[str]:
    """What is wrong with `actual` as the output shown; empty when it matches. Progress
    lines (NO_COLOR's stand-in for a bar that disappears) are not part of what is shown."""
    expected = [line.rstrip() for line in expected]
    actual = [line.rstrip() for line in actual if line.strip() and not PROGRESS.match(line)]
    if expected and expected[0].lstrip().startswith("{") and all(
            line.lstrip().startswith("{") or line.startswith(" ") for line in expected if line.strip()):
        return _compare_json(expected, actual)
    free = answer_lines(command, expected)
    shown = [(i, line) for i, line in enumerate(expected) if line.strip()]
    if _align(shown, 0, actual, 0, free, {}):
        return []
    return ["the output does not match what the README shows:", *("  shown:   " + line for _, line in shown),
            *("  printed: " + line for line in actual)]


def _align(shown, i, actual, j, free, memo) -> bool:
    if (i, j) in memo:
        return memo[(i, j)]
    if i == len(shown):
        ok = j == len(actual)
    elif shown[i][0] in free:  # the model's words: one line or more of anything but tallow's own lines
        ok = j < len(actual) and not TALLOW_LINE.search(actual[j]) and (_align(shown, i + 1, actual, j + 1, free, memo) or
                                  _align(shown, i, actual, j + 1, free, memo) or
                                  (i + 1 < len(shown) and shown[i + 1][0] in free and
                                   _align(shown, i + 1, actual, j, free, memo)))
    else:
        ok = j < len(actual) and lines_match(shown[i][1], actual[j]) and _align(shown, i + 1, actual, j + 1, free, memo)
    memo[(i, j)] = ok
    return ok


def _compare_json(expected: list[str], actual: list[str]) -> list[str]:
    """One JSON document shown wrapped, or JSON lines (some shortened with `...`)."""
    records: list[list[str]] = []
    for line in expected:
        if line.lstrip().startswith("{") and not line.startswith(" "):
            records.append([line])
        elif line.strip():
            records[-1].append(line)
    try:
        got = [json.loads(line) for line in actual]
    except ValueError as exc:
        return [f"printed a line that is not JSON ({exc}): {actual}"]
    if len(got) != len(records):
        return [f"{len(records)} JSON record(s) shown, {len(got)} printed"]
    problems = []
    unused = list(got)
    for record in records:
        text = " ".join(part.strip() for part in record)
        if "..." in text:  # shortened: the fields it names must be there, in the record with its id
            wanted = named_fields(text)
            rid = re.search(r'"id": ("[^"]*"|\d+)', text)
            match = [g for g in unused if rid is None or json.dumps(g.get("id")) == rid.group(1)]
            if not match or not wanted <= all_fields(match[0]):
                problems.append(f"no printed record has the fields {sorted(wanted)} of: {text[:80]}")
            else:
                unused.remove(match[0])
            continue
        value = json.loads(text)
        match = [g for g in unused if not same_fields(value, g)]
        if not match:
            problems += same_fields(value, unused[0] if unused else {}) or ["no record matches"]
        else:
            unused.remove(match[0])
    return problems
