"""Every command with bad arguments: a clean one-line error (and a hint), the right exit
code, never a traceback. Missing, unreadable and directory paths; empty, huge and
mistyped values; names that would leave the store."""

from __future__ import annotations

import pytest
from helpers.processes import run_tallow

pytestmark = pytest.mark.slow  # a hundred failing commands, each a process

USAGE, ERROR = 2, 1
HUGE = "x" * 100_000
UNREADABLE = "/proc/self/mem"  # reading it fails with EIO, even as root


def cases(synth: str, d: str, missing: str, text: str) -> list[tuple[list[str], int]]:
    return [
        (["run"], USAGE), (["run", "", "hi"], ERROR), (["run", d, "hi"], ERROR), (["run", missing, "hi"], ERROR),
        (["run", UNREADABLE, "hi"], ERROR), (["run", HUGE, "hi"], ERROR),
        (["run", synth, "hi", "--ctx", "abc"], USAGE), (["run", synth, "hi", "--max-tokens", "-1"], USAGE),
        (["run", synth, "hi", "--ctx", "99999999999999"], ERROR), (["run", synth, "hi", "--json-schema", d], USAGE),
        (["run", synth, "hi", "--temperature", "nan"], USAGE), (["run", synth, "hi", "--nope"], USAGE),
        (["chat", d], ERROR), (["chat", missing], ERROR), (["chat", synth, "--ctx", "-5"], USAGE),
        (["pull", ""], ERROR), (["pull", HUGE], ERROR), (["pull", d], USAGE), (["pull", "a/b/../../c"], ERROR),
        (["pull", "a/b", "--json"], USAGE), (["pull", "a/b:Q4_0", "--list"], USAGE),
        (["find", "x", "--limit", "0"], USAGE), (["find", "x", "--sort", "nope"], USAGE),
        (["find", "x", "--min-params", "abc"], USAGE), (["find", "x", "--offline"], ERROR),
        (["list", "extra"], USAGE),
        (["show"], USAGE), (["show", d], ERROR), (["show", missing], ERROR), (["show", UNREADABLE], ERROR),
        (["show", "../../etc/passwd:x"], ERROR),
        (["rm"], USAGE), (["rm", "nope:x"], ERROR), (["rm", "../x"], ERROR), (["rm", HUGE], ERROR),
        (["import", d], ERROR), (["import", missing], ERROR), (["import", UNREADABLE], ERROR),
        (["import", synth, "--name", "../evil"], ERROR), (["import", synth, "--name", "/etc/x"], ERROR),
        (["import", text], ERROR),
        (["quantize", d, "--type", "Q4_0"], ERROR), (["quantize", synth, "--type", "nope"], ERROR),
        (["quantize", missing, "--type", "Q8_0"], ERROR), (["quantize", synth, "--type", "Q8_0", "--name", "../x"], ERROR),
        (["eval"], USAGE), (["eval", d], ERROR), (["eval", synth, "--text", d], ERROR),
        (["eval", synth, "--text", missing], ERROR),
        (["imatrix", synth, "--text", missing], ERROR), (["imatrix", synth, "--text", text, "-o", d], ERROR),
        (["bench", d], ERROR), (["bench", synth, "-p", "abc"], USAGE), (["bench", synth, "-t", "0"], USAGE),
        (["bench", synth, "-p", "99999999999999999999"], USAGE),
        (["bench", synth, "--compare", missing], ERROR), (["bench", synth, "--compare", d], ERROR),
        (["batch", d, "-o", missing], USAGE), (["batch", missing, "-o", missing], USAGE),
        (["batch", UNREADABLE, "-o", missing], ERROR), (["batch", text, "-o", d], USAGE),
        (["embed"], USAGE), (["embed", missing, "x"], ERROR), (["embed", synth, "x", "--format", "xml"], USAGE),
        (["embed", synth, "x", "--dimensions", "0"], USAGE), (["embed", synth, "x", "--pooling", "max"], ERROR),
        (["embed", synth, "x", "--index", d], ERROR), (["embed", synth, "x", "-o", d], USAGE),
        (["embed", synth, "x", "--index", text, "-o", missing], ERROR), (["embed", synth, "x", "--batch-size", "1"], USAGE),
        (["search"], USAGE), (["search", missing, "q"], ERROR), (["search", text, "q"], ERROR), (["search", d, "q"], ERROR),
        (["search", missing, "q", "-n", "0"], USAGE),
        (["serve", synth, "--port", "70000"], USAGE), (["serve", synth, "--host", "0.0.0.0"], USAGE),
        (["serve", d, "--port", "0"], ERROR), (["serve", synth, "--max-tokens", "0"], USAGE),
        (["serve", synth, "--keep-alive", "soon"], USAGE), (["serve", synth, "--memory-budget", "lots"], USAGE),
        (["serve", synth, "--model-option", "x parallel=zero"], USAGE),
        (["serve", synth, "--model-option", "x gpu_layers=most"], USAGE),
        (["serve", synth, synth, "--max-models", "1"], USAGE), (["serve", "--alias", "gpt-4o"], USAGE),
        (["ps", "--host", "127.0.0.1:1"], ERROR), (["ps", "--nope"], USAGE), (["ps", "--host", "203.0.113.9", "--offline"], ERROR),
        (["stop"], USAGE), (["stop", "x:y", "--host", "127.0.0.1:1"], ERROR),
        (["ui", "--nope"], USAGE), (["ui", "--host", "203.0.113.9", "--offline"], ERROR),
        (["serve", synth, "--open", "--no-ui"], USAGE), (["serve", synth, "--ray", "local", "--mcp", missing], USAGE),
        (["completions", ""], USAGE), (["completions"], USAGE),
        (["doctor", "extra"], USAGE), (["doctor", "-t", "0"], USAGE), (["doctor", "--nope"], USAGE),
        (["logs", "-n", "abc"], USAGE), (["logs", "--nope"], USAGE),
        (["cache", "ls", "extra"], USAGE), (["cache", "nope"], USAGE),
        (["run", "m", "hi", "--endpoint", "ftp://x/v1"], ERROR), (["run", "m", "hi", "--endpoint", "http://h:99999"], ERROR),
        (["run", "m", "hi", "--endpoint", "http://127.0.0.1:1", "--endpoint", "http://127.0.0.1:2"], USAGE),
        (["run", synth, "hi", "--api-key", "k"], USAGE), (["chat", "m", "--endpoint", "http://[::1"], ERROR),
        (["batch", text, "-o", missing, "--endpoint", "http://127.0.0.1:1", "--endpoint", "http://127.0.0.1:1"], USAGE),
        (["batch", text, "-o", missing, "--endpoint", "http://127.0.0.1:1", "--retries", "-1"], USAGE),
        (["batch", text, "-o", missing, "--ray-actors", "2"], USAGE),
        (["serve", synth, "--ray-replicas", "2"], USAGE), (["serve", "--ray", "local"], USAGE),
        (["serve", synth, synth, "--ray", "local"], USAGE), (["serve", synth, "--ray", "local", "--auth", "keys"], USAGE),
        (["serve", synth, "--ray", "local", "--keep-alive", "5m"], USAGE),
        (["serve", synth, "--ray", "10.1.2.3:6379", "--offline"], ERROR),
        (["batch", text, "-o", missing, "--ray", "local", "--endpoint", "http://127.0.0.1:1"], USAGE),
        (["batch", text, "-o", missing, "--ray", "local", "--threads", "2"], USAGE),
        (["batch", text, "-o", missing, "--ray", "local", "--ray-weights", "nope"], USAGE),
        (["batch", text, "-o", missing, "--ray", "10.1.2.3:6379", "--offline"], ERROR),
        (["batch", text, "-o", missing, "--ray", "auto", "--offline"], ERROR),
        (["batch", text, "-o", missing, "--ray", "local", "--ray-cpus-per-actor", "0"], USAGE),
        (["bench", "m", "--endpoint", "http://127.0.0.1:1", "--rate", "0"], USAGE),
        (["bench", "m", "--endpoint", "http://127.0.0.1:1", "--rate", "fast"], USAGE),
        (["bench", "m", "n", "--endpoint", "http://127.0.0.1:1"], USAGE),
        (["bench", "m", "--endpoint", "http://127.0.0.1:1", "--prompts", missing], ERROR),
        (["embed", "m", "x", "--endpoint", "http://127.0.0.1:1", "--truncate"], USAGE),
        (["serve", synth, "--drain-timeout", "-1"], USAGE),
        (["cp"], USAGE), (["cp", "a:b"], USAGE), (["cp", "not:stored", "x"], ERROR), (["cp", synth, "bad name!"], ERROR),
        (["create"], USAGE), (["create", "x", "-f", missing], USAGE), (["create", "x", "-f", d], USAGE),
        (["create", "x", "-f", text], ERROR), (["create", "x", "-f", UNREADABLE], ERROR),
        (["create", "bad name!", "-f", text], ERROR), (["show", synth, "--modelfile", "--nope"], USAGE),
        (["run", synth, "hi", "--lora", missing], USAGE), (["run", synth, "hi", "--lora", text], ERROR),
        (["run", synth, "hi", "--lora", f"{synth}:nan"], USAGE), (["serve", synth, "--lora", missing], USAGE),
        (["import", d, "--base", "nope:x"], ERROR), (["import", synth, "--base", synth], ERROR),
        (["run", synth, "hi", "--cache-type-k", "q9"], USAGE), (["serve", synth, "--model-option", "x cache_type_v=q9"], USAGE),
        (["keys", "create", "bad name!"], ERROR), (["keys", "create", "x", "--routes", "write"], ERROR),
        (["keys", "create", "x", "--expires", "soon"], ERROR), (["keys", "create", "x", "--concurrency", "-1"], USAGE),
        (["keys", "revoke", "nobody"], ERROR), (["keys", "update", "nobody"], ERROR), (["keys", "nope"], USAGE),
        (["usage", "--by", "week"], USAGE), (["usage", "--since", "yesterday"], ERROR),
        (["usage", "--prices", missing], ERROR), (["usage", "--prices", text], ERROR),
        (["serve", synth, "--auth", "ldap"], USAGE), (["serve", synth, "--auth", "keys", "--api-key", "k"], USAGE),
        (["mcp", "ls"], USAGE), (["mcp", "ls", missing], ERROR), (["mcp", "ls", text], ERROR),
        (["mcp", "serve"], USAGE), (["mcp", "serve", synth, "--index", missing], USAGE),
        (["launch"], USAGE), (["launch", "nope"], USAGE), (["docs", "nope"], USAGE), (["docs", "--bogus"], USAGE), (["logs", "--kind", "http"], USAGE),
        (["tokenize"], USAGE), (["tokenize", synth, "hi", "--count", "--json"], USAGE),
        (["tokenize", missing, "hi"], ERROR), (["tokenize", d, "hi"], ERROR),
        (["transcribe"], USAGE), (["transcribe", text, "--format", "docx"], USAGE),
        (["transcribe", text, text, "--offline"], USAGE), (["transcribe", text, "--temperature", "2"], USAGE),
        (["transcribe", text, "--offline"], ERROR), (["transcribe", missing, "--model", synth], ERROR),
        (["transcribe", d, "--model", "nope:x", "--offline"], ERROR),
        (["--nope"], USAGE), (["nosuchcommand"], USAGE),
    ]


def test_every_command_fails_cleanly(synth_model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("some words\n")
    d = tmp_path / "a-directory.gguf"
    d.mkdir()
    missing = str(tmp_path / "missing.gguf")
    bad = []
    for args, code in cases(str(synth_model), str(d), missing, str(text)):
        r = run_tallow(args, home=tmp_path / "home", timeout=120)
        err = r.stderr.decode(errors="replace")
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error: ")]
        ok = (r.returncode == code and "Traceback" not in err and len(errors) == 1
              and lines[-1].startswith(("error: ", "hint: ")) and len(errors[0]) < 2000)
        if not ok:
            bad.append(([a[:40] for a in args[:4]], r.returncode, err[-400:]))
    assert not bad, "\n".join(map(repr, bad))


def test_the_covered_commands_are_all_of_them():
    from tallow.cli.reference import commands

    covered = {args[0] for args, _ in cases("m", "d", "x", "t")}
    top = {path[0] for path in commands() if path}
    assert top <= covered, top - covered


@pytest.mark.parametrize("digest", ["../../../tmp/evil", "/etc/passwd", "a" * 63 + "/", "A" * 64 + "\x00"])
def test_a_published_digest_never_becomes_a_path(digest):
    # A hostile package index or hub publishes the sha256 that names the partial download.
    from tallow.models.download import Expected, partial_key
    from tallow.models.errors import InvalidName

    with pytest.raises(InvalidName, match="invalid digest"):
        partial_key(Expected(1, digest))
    assert partial_key(Expected(1, "AB" * 32)) == "sha256-" + "ab" * 32
