"""The rules the README examples are held to (tests/helpers/readme_examples.py) catch real drift."""

from __future__ import annotations

from helpers.readme_examples import compare, parse

STATS = "prompt 36 tok (0 cached) · TTFT 120 ms · prefill 302.0 tok/s · output 40 tok · decode 129.3 tok/s · load 147 ms"


def test_answers_and_numbers_are_free_but_tallows_own_lines_are_not():
    shown = ["The sky is blue because of", "Rayleigh scattering.", STATS + " · length"]
    assert compare("tallow run m 'why'", shown, ["Because of physics, mostly.", STATS.replace("36", "41")]) == []
    assert compare("tallow run m 'why'", shown, ["Because.", STATS.replace("(0 cached)", "(3 cached from disk)")])
    assert compare("tallow run m 'why'", shown, ["Because."])  # the stats line went missing
    assert compare("tallow run m 'why'", shown, ["Because.", "note: something new", STATS])  # an unshown line
    assert compare("tallow run m 'why'", shown, [STATS])  # no answer at all


def test_errors_hints_and_key_value_lines():
    shown = ["error: model 'qwen' not found", "hint: Try: tallow pull qwen2.5:0.5b"]
    assert compare("tallow run qwen hi", shown, shown) == []
    assert compare("tallow run qwen hi", shown, [shown[0], "hint: pull it first"])
    table = ["NAME          QUANT  SIZE", "smollm2:135m  Q4_1   98.4 MB"]
    assert compare("tallow list", table, ["NAME          QUANT  SIZE", "smollm2:135m  Q8_0   140.1 MB"]) == []
    assert compare("tallow list", table, ["NAME          QUANT  SIZE", "other:model   Q4_1   98.4 MB"])


def test_json_fields_and_shortened_records():
    shown = ['{"model": "m", "usage": {"prompt_tokens": 3,', ' "cached_tokens": 0}, "text": "hi"}']
    assert compare("tallow run m x --json", shown, ['{"model": "x", "text": "other", "usage": {"prompt_tokens": 9, "cached_tokens": 1}}']) == []
    assert compare("tallow run m x --json", shown, ['{"model": "x", "text": "o", "usage": {"prompt_tokens": 9}}'])
    assert compare("tallow run m x --json", shown, ['{"model": "x", "text": 5, "usage": {"prompt_tokens": 9, "cached_tokens": 1}}'])
    short = ['{"id": "q1", "text": "...", "usage": {"completion_tokens": 16, ...}}']
    assert compare("cat a.jsonl", short, ['{"id": "q1", "text": "x", "usage": {"completion_tokens": 2, "x": 1}}']) == []
    assert compare("cat a.jsonl", short, ['{"id": "q2", "text": "x", "usage": {"completion_tokens": 2}}'])


def test_blocks_commands_continuations_and_directives():
    readme = "\n".join([
        "## Section", "<!-- example: before=tallow pull x; files=a.txt,b.gguf -->", "```console",
        "$ curl -d '{\"a\": 1,", "    \"b\": 2}'", '{"ok": true}', "$ tallow list", "NAME", "```",
        "```console", "note: no command here", "```"])
    [block] = parse(readme)
    assert block.section == "Section" and block.before == ["tallow pull x"] and block.files == ["a.txt", "b.gguf"]
    assert [c.text for c in block.commands] == ["curl -d '{\"a\": 1,\n    \"b\": 2}'", "tallow list"]
    assert block.commands[0].expected == ['{"ok": true}']
