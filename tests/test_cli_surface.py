"""The CLI as a newcomer meets it: help for every command, errors, colour rules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.processes import run_tallow
from helpers.terminal import Terminal


def all_commands() -> list[list[str]]:
    from tallow.cli.reference import commands

    return [path for path in commands() if path]


def test_every_command_has_a_one_line_summary_and_an_example(tmp_path):
    import inspect

    import typer.main

    from tallow.cli.app import app

    root = typer.main.get_command(app)
    for path in all_commands():
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        doc = inspect.getdoc(cmd.callback) or ""
        summary = doc.split("\n\n")[0]
        assert "\n" not in summary and len(summary) <= 60, (path, summary)
        if not getattr(cmd, "commands", None):  # groups list their commands instead
            assert "Example" in doc, path
    listing = run_tallow(["--help"], home=tmp_path).stdout.decode()
    assert "..." not in listing.split("Commands:")[1].split("Environment")[0]  # no summary cut short


def test_root_help_ends_with_every_setting_and_the_exit_codes(tmp_path):
    from tallow.env.settings import REGISTRY

    text = run_tallow(["--help"], home=tmp_path).stdout.decode()
    table = text.split("Environment variables:")[1]
    for s in REGISTRY:
        assert s.name in table and s.help in table
    assert text.rstrip().endswith("Exit codes: 0 ok, 1 error, 2 usage, 130 interrupted.")


def test_near_miss_names_get_a_did_you_mean(synth_model, tmp_path):
    r = run_tallow(["run", "qwen", "hi", "--offline"], home=tmp_path)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and lines == ["error: model 'qwen' not found; did you mean qwen2.5:0.5b or qwen2.5:1.5b?",
                                           "hint: Try: tallow pull qwen2.5:0.5b"]
    assert run_tallow(["import", str(synth_model), "--name", "synthy:tiny"], home=tmp_path).returncode == 0
    r = run_tallow(["run", "synthi:tiny", "hi", "--offline"], home=tmp_path)
    assert "did you mean synthy:tiny?" in r.stderr.decode() and "Try: tallow run synthy:tiny" in r.stderr.decode()
    r = run_tallow(["rm", "synty:tiny"], home=tmp_path)
    assert r.returncode == 1 and "is not stored; did you mean synthy:tiny?" in r.stderr.decode()
    r = run_tallow(["run", "zzzz", "hi", "--offline"], home=tmp_path)
    assert "did you mean" not in r.stderr.decode() and "name a hub model (ORG/REPO:QUANT) or one of:" in r.stderr.decode()


def test_hints_point_the_right_way(synth_model, tmp_path):
    """A stored near-miss comes first and the hint repeats the command that was run; a pull
    is never told to pull first; every error has a hint line."""
    assert run_tallow(["import", str(synth_model), "--name", "smollm2:135m"], home=tmp_path).returncode == 0

    def lines(args):
        r = run_tallow(args, home=tmp_path)
        assert r.returncode in (1, 2), (args, r.returncode)
        return r.stderr.decode().splitlines()

    assert lines(["run", "smollm", "hi there", "--offline"]) == [
        "error: model 'smollm' not found; did you mean smollm2:135m or smollm2:1.7b?",
        "hint: Try: tallow run smollm2:135m 'hi there' --offline"]
    assert lines(["eval", "smollm2:135m-q", "smollm2:135m"])[1] == "hint: Try: tallow eval smollm2:135m smollm2:135m"
    pull = lines(["pull", "nonsense", "--offline"])
    assert "pull it first" not in pull[1] and pull[1].startswith("hint: name a hub model")
    serve = lines(["serve", str(synth_model), "--host", "192.0.2.1", "--api-key", "k"])  # bind only: nothing is sent
    assert serve[0].startswith("error: cannot listen on 192.0.2.1:8080") and "not an address of this machine" in serve[1]
    schema = lines(["run", str(synth_model), "hi", "--json-schema", "{bad"])
    assert schema[0].startswith("error: the JSON schema is not valid JSON") and schema[1].startswith("hint: give a schema")
    text = lines(["eval", str(synth_model), "--text", str(tmp_path / "nosuch.txt")])
    assert text == [f"error: {tmp_path / 'nosuch.txt'}: No such file or directory", "hint: check the path"]


def _screen(args: list[str], home, **env_extra) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_") and k not in ("NO_COLOR", "TERM")}
    env.update(TALLOW_HOME=str(home), **env_extra)
    term = Terminal(args, env)
    assert term.wait() in (0, 1)
    return term.buf.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"NO_COLOR": "1", "TERM": "xterm-256color"}, {"TERM": "dumb"}])
def test_no_color_and_dumb_terminals_get_no_escape_codes(synth_model, tmp_path, env):
    assert run_tallow(["import", str(synth_model), "--name", "synthy:tiny"], home=tmp_path).returncode == 0
    # On a real terminal with colour allowed, the same screens do carry escape codes.
    assert "\x1b[" in _screen(["list"], tmp_path, TERM="xterm-256color")
    batch = tmp_path / "in.jsonl"
    batch.write_text('{"id": 1, "prompt": "hi", "max_tokens": 3}\n')
    for args in (["list"], ["show", "synthy:tiny"], ["run", "nosuch", "hi", "--offline"], ["--help"],
                 ["run", "synthy:tiny", "hi", "-n", "4", "--temperature", "0", "--no-log"],
                 ["batch", str(batch), "-o", str(tmp_path / f"out-{len(env)}.jsonl"), "-m", "synthy:tiny"],
                 ["bench", "synthy:tiny", "-p", "8", "-n", "4", "-r", "1"]):
        screen = _screen(args, tmp_path, **env)
        assert "\x1b" not in screen, (args, screen[:200])


@pytest.mark.slow
def test_pipes_get_plain_text(synth_model, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_") and k != "NO_COLOR"}
    env.update(TALLOW_HOME=str(tmp_path), TERM="xterm-256color")
    subprocess.run([sys.executable, "-m", "tallow.cli", "import", str(synth_model), "--name", "s:t"], env=env,
                   capture_output=True, check=True)
    for args in (["list"], ["show", "s:t"], ["run", "s:t", "hi", "-n", "4", "--stats", "--no-log"]):
        r = subprocess.run([sys.executable, "-m", "tallow.cli", *args], env=env, capture_output=True, timeout=120)
        assert r.returncode == 0 and b"\x1b" not in r.stdout + r.stderr, args


def test_the_command_table_says_what_each_command_s_own_help_says():
    """`tallow --help` lists the commands from cli/app.py's table without importing them; each
    line there is the command's own one-line help, and every command is in the table."""
    import typer.main

    from tallow.cli.app import COMMANDS, app, load_command

    for name, (_, _, short, hidden) in COMMANDS.items():
        cmd = load_command(name)
        assert cmd.get_short_help_str(200) == short and bool(cmd.hidden) == hidden, name
    root = typer.main.get_command(app)
    assert root.list_commands(None) == list(COMMANDS)


def test_help_and_list_import_no_command_they_do_not_run(tmp_path):
    probe = ("import sys; from tallow.cli.app import run_app; run_app(sys.argv[1:]); "
             "print(sorted(m for m in sys.modules if m.startswith(('tallow.cli.commands.', 'rich', 'pydantic'))),"
             " file=sys.stderr)")
    env = {**os.environ, "TALLOW_HOME": str(tmp_path)}
    helped = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, env=env)
    assert helped.stderr.strip() == "[]", helped.stderr  # no command, no rich, no pydantic
    listed = subprocess.run([sys.executable, "-c", probe, "list"], capture_output=True, text=True, env=env)
    loaded = eval(listed.stderr.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith("tallow.cli.commands.")] == ["tallow.cli.commands.store",
                                                                             "tallow.cli.commands.store.store_cmds"]
    assert not [m for m in loaded if m.startswith("pydantic")], loaded


def test_tallow_alone_on_a_terminal_shows_the_models_and_where_to_start(synth_model, tmp_path):
    from helpers.processes import run_tallow, tallow_env
    from helpers.terminal import Terminal, plain

    home = tmp_path / "home"
    t = Terminal([], tallow_env(home, {"TERM": "xterm"}))
    seen = plain(t.read_until(r"every command"))
    assert t.wait() == 0
    assert "No models stored yet." in seen and 'tallow run smollm2:135m "Why is the sky blue?"' in seen
    assert "tallow find QUERY" in seen and "Usage:" not in seen
    assert run_tallow(["import", str(synth_model), "--name", "synth:f32", "--link"], home=home).returncode == 0
    t = Terminal([], tallow_env(home, {"TERM": "xterm"}))
    seen = plain(t.read_until(r"every command"))
    assert t.wait() == 0
    assert "Stored models (1):" in seen and "synth:f32" in seen and "F32" in seen
    piped = run_tallow([], home=home)  # not a terminal: the usage text, as scripts have always had it
    assert piped.returncode == 2 and "Usage: tallow" in piped.stdout.decode()
