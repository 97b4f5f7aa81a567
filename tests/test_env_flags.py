"""TALLOW_<FLAG>: every flag of run, chat, serve and bench can be set from the environment;
the help shows the variable, a flag on the command line wins, and a bad value is refused
naming the variable. The declaration (cli/env_flags.py) is walked, not each flag by hand."""

from __future__ import annotations

import json
import re

import pytest
from helpers.processes import run_tallow
from helpers.server import Server

from tallow.cli.app import load_command
from tallow.cli.env_flags import MIRRORED, READS, flag_name, variable
from tallow.cli.reference import help_text


@pytest.mark.parametrize("command", MIRRORED)
def test_every_flag_has_a_variable_that_its_help_shows(command):
    options = [p for p in load_command(command).params if p.param_type_name == "option" and not p.hidden]
    named = {flag_name(p): variable(command, p) for p in options if flag_name(p) not in (None, "--help")}
    assert len(named) >= 25 and all(named.values()), [f for f, v in named.items() if not v]
    assert len(set(named.values())) == len(named)  # one variable per flag
    shown = re.sub(r"\s+", "", help_text([command]))  # the help wraps the names
    missing = [v for v in named.values() if v not in shown]
    assert not missing, missing
    for flag, name in named.items():
        plain = flag[2:].upper().replace("-", "_")
        if (command, flag) not in READS:  # TALLOW_<FLAG>, or scoped by the command where that means another thing
            assert name in (f"TALLOW_{plain}", f"TALLOW_{command.upper()}_{plain}"), (flag, name)


def test_a_variable_applies_and_the_flag_wins(synth_model, tmp_path):
    def load(*args: str) -> dict:
        got = run_tallow(["run", str(synth_model), "hello", "--json", "-n", "2", *args], home=tmp_path,
                         env={"TALLOW_CTX": "512", "TALLOW_THREADS": "1", "TALLOW_NO_LOG": "1"})
        assert got.returncode == 0, got.stderr.decode()
        return json.loads(got.stdout)["load"]

    assert (load()["n_ctx"], load()["threads"]) == (512, 1)
    assert load("--ctx", "1024")["n_ctx"] == 1024


@pytest.mark.parametrize("args,env,named", [
    (["run", "x", "hi"], {"TALLOW_CTX": "lots"}, "TALLOW_CTX"),
    (["run", "x", "hi"], {"TALLOW_TEMPERATURE": "9"}, "TALLOW_TEMPERATURE"),
    (["chat", "x"], {"TALLOW_STATS": "maybe"}, "TALLOW_STATS"),
    (["serve", "x"], {"TALLOW_PORT": "http"}, "TALLOW_PORT"),
    (["bench", "x"], {"TALLOW_BENCH_PARALLEL": "x"}, "TALLOW_BENCH_PARALLEL"),  # refused by bench's own parsing
])
def test_a_bad_value_is_refused_naming_the_variable(args, env, named, tmp_path):
    got = run_tallow(args, home=tmp_path, env=env)
    err = got.stderr.decode()
    assert got.returncode == 2 and f"{named} (from the environment)" in err and "Traceback" not in err, err


def test_serve_takes_its_flags_from_the_environment(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, env={"TALLOW_PARALLEL": "3", "TALLOW_CTX": "3072"})
    try:
        assert re.search(r"\(3 parallel, context 3072, 1024 per request\)", "".join(s.log)), s.log
    finally:
        s.close()
