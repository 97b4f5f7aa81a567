"""tallow create: a model made from a Modelfile, used by name everywhere with its settings as
defaults (Modelfile < flag < request field); show --modelfile; the errors, with their lines;
and Ollama's /api/create, /api/show and /api/copy through the official `ollama` client.

The script model answers "abab...", so a count and a stop string show in its answer; the
random synthetic model shows a temperature (greedy: the same answer whatever the seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

from tallow.models.modelfile import parse
from tallow.models.store import Store

SCRIPT = {"\n": "a", "a": "b", "b": "a"}
MODELFILE = '''# settings for the script model
FROM script
PARAMETER temperature 0
PARAMETER num_predict 4
SYSTEM """Answer with letters.
Only letters."""
'''


@pytest.fixture(scope="module")
def home(tmp_path_factory, synth_model) -> Path:
    """A home with the script model stored as `script` and `letters` created from it, and the
    random synthetic model as `noise`."""
    home = tmp_path_factory.mktemp("create")
    path = write_synthetic_gguf(home / "script.gguf", script=SCRIPT)
    assert run_tallow(["import", str(path), "--name", "script"], home=home).returncode == 0
    assert run_tallow(["import", str(synth_model), "--name", "noise"], home=home).returncode == 0
    (home / "Modelfile").write_text(MODELFILE)
    made = run_tallow(["create", "letters", "-f", str(home / "Modelfile")], home=home)
    assert made.returncode == 0 and "created letters:latest from script" in made.stderr.decode(), made.stderr
    return home


def run_json(home: Path, *args: str) -> dict:
    r = run_tallow(["run", *args, "--json"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_created_model_shares_the_blobs_and_runs_with_its_settings(home):
    store = Store(home / "models")
    base, made = store.get("script"), store.get("letters")
    assert made.files == base.files and len(list(store.blobs.iterdir())) == 2  # nothing copied
    assert made.source == {"kind": "create", "from": "script:latest"}
    out = run_json(home, "letters", "go")
    assert (out["text"], out["finish_reason"], out["usage"]["completion_tokens"]) == ("abab", "length", 4)
    # the SYSTEM prompt is in the prompt, as if given with --system
    same = run_json(home, "script", "go", "--system", "Answer with letters.\nOnly letters.", "-n", "1")
    assert out["usage"]["prompt_tokens"] == same["usage"]["prompt_tokens"]
    assert out["usage"]["prompt_tokens"] > run_json(home, "script", "go", "-n", "1")["usage"]["prompt_tokens"]
    # a --system of the run's own replaces the model's
    mine = run_json(home, "letters", "go", "--system", "x")
    assert mine["usage"]["prompt_tokens"] == run_json(home, "script", "go", "--system", "x", "-n", "1")["usage"]["prompt_tokens"]


def test_flags_override_the_modelfile(home):
    assert run_json(home, "letters", "go", "-n", "2")["text"] == "ab"
    # temperature 0 from the Modelfile: one answer whatever the seed; --temperature 1 over it samples
    r = run_tallow(["create", "cold", "-f", "-"], home=home, input=b"FROM noise\nPARAMETER temperature 0\nPARAMETER num_predict 12\n")
    assert r.returncode == 0, r.stderr
    greedy = {run_json(home, "cold", "hi", "--seed", str(s))["text"] for s in range(4)}
    sampled = {run_json(home, "cold", "hi", "--temperature", "1", "--seed", str(s))["text"] for s in range(4)}
    assert len(greedy) == 1 and len(sampled) > 1


def test_show_modelfile_recreates_the_model(home):
    store = Store(home / "models")
    shown = run_tallow(["show", "letters", "--modelfile"], home=home)
    assert shown.returncode == 0
    text = shown.stdout.decode()
    assert text.startswith("FROM script:latest\n") and parse(text).preset == store.get("letters").preset
    again = run_tallow(["create", "letters2", "-f", "-"], home=home, input=shown.stdout)
    assert again.returncode == 0, again.stderr
    assert store.get("letters2").preset == store.get("letters").preset
    info = json.loads(run_tallow(["show", "letters", "--json"], home=home).stdout)
    assert info["preset"]["parameters"] == {"temperature": 0.0, "num_predict": 4}
    assert "settings       temperature=0.0, num_predict=4" in run_tallow(["show", "letters"], home=home).stdout.decode()
    # a model made from a made model takes its settings and adds its own
    r = run_tallow(["create", "stopper", "-f", "-"], home=home, input=b"FROM letters\nPARAMETER stop bab\n")
    assert r.returncode == 0, r.stderr
    out = run_json(home, "stopper", "go")
    assert (out["text"], out["finish_reason"]) == ("a", "stop")
    assert store.get("stopper").preset.system == "Answer with letters.\nOnly letters."


def test_create_replaces_only_a_created_model(home):
    r = run_tallow(["create", "letters", "-f", "-"], home=home, input=b"FROM script\nPARAMETER num_predict 3\n")
    assert r.returncode == 0
    assert run_json(home, "letters", "go")["text"] == "aba"
    r = run_tallow(["create", "letters", "-f", str(home / "Modelfile")], home=home)
    assert r.returncode == 0 and run_json(home, "letters", "go")["text"] == "abab"
    bad = run_tallow(["create", "script", "-f", "-"], home=home, input=b"FROM letters\n")
    assert bad.returncode == 1 and "a model named script:latest is stored and was not made by tallow create" in bad.stderr.decode()


@pytest.mark.parametrize("modelfile,message", [
    (b"FROM script\nPARAMETER temprature 1\n", "stdin line 2: unknown parameter 'temprature'"),
    (b"FROM script\nPARAMETER num_ctx lots\n", "stdin line 2: num_ctx wants a whole number, not 'lots'"),
    (b"SYSTEM hi\n", "stdin line 1: no FROM"),
    (b"# me\nFROM made\n", "stdin line 2: FROM made: a model cannot be created from itself"),
    (b"FROM nothing:here\n", "stdin line 1: FROM nothing:here: model 'nothing:here' not found"),
    (b"FROM org/repo:Q4_K_M\n", "stdin line 1: FROM org/repo:Q4_K_M: it is not stored, and tallow is offline"),
    (b"FROM ./missing.gguf\n", "stdin line 1: FROM ./missing.gguf: no such file"),
    (b"FROM script\nTEMPLATE \"\"\"{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}\"\"\"\n",
     "stdin line 2: TEMPLATE is an Ollama (Go) template; tallow renders chat templates with Jinja"),
    (b"FROM script\nTEMPLATE \"{% for m in messages %}\"\n", "stdin line 2: TEMPLATE: the model's chat template does not parse"),
    (b"FROM script\nTEMPLATE hello\n", "stdin line 2: TEMPLATE does not show the conversation"),
    (b"FROM script\nADAPTER ./lora.gguf\n", "stdin line 2: ADAPTER ./lora.gguf: no such file"),
])
def test_bad_modelfiles_are_refused_with_their_line_and_nothing_is_stored(home, modelfile, message):
    r = run_tallow(["create", "made", "-f", "-", "--offline"], home=home, input=modelfile)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) <= 2  # the error and at most its hint
    assert Store(home / "models").get("made") is None


def test_a_jinja_template_replaces_the_models(home):
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    r = run_tallow(["create", "plain", "-f", "-"], home=home, input=f'FROM script\nTEMPLATE """{template}"""\n'.encode())
    assert r.returncode == 0, r.stderr
    assert run_tallow(["show", "plain", "--template"], home=home).stdout.decode() == template + "\n"
    # the model's own ChatML wraps each turn in special tokens; this one is plain text
    ours = run_json(home, "plain", "go", "-n", "1", "--temperature", "0")
    theirs = run_json(home, "script", "go", "-n", "1", "--temperature", "0")
    assert ours["usage"]["prompt_tokens"] == len("[user] go\n".encode()) - 1  # "go" is one merged token here
    assert ours["usage"]["prompt_tokens"] != theirs["usage"]["prompt_tokens"]


def test_the_engine_frames_every_conversation(home):
    """In process: the system prompt first unless the conversation has one, then the few-shot turns."""
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Persona

    path = Store(home / "models").paths(Store(home / "models").get("script"))
    persona = Persona("S", (("user", "u1"), ("assistant", "a1")))
    with Engine(path, LoadSettings(n_ctx=256, n_threads=1)) as plain, \
            Engine(path, LoadSettings(n_ctx=256, n_threads=1, persona=persona)) as framed:
        hi = [{"role": "user", "content": "hi"}]
        shots = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
        assert framed.request(hi).prompt_tokens == plain.prompt_for([{"role": "system", "content": "S"}, *shots, *hi])
        own = [{"role": "system", "content": "T"}, *hi]
        assert framed.request(own).prompt_tokens == plain.prompt_for([own[0], *shots, *hi])
        assert framed.request(hi, raw=True).prompt_tokens == plain.prompt_for(hi, raw=True)  # raw is as given


def test_served_model_takes_its_settings_and_requests_override_them(home):
    import ollama

    server = Server(None, home, "--offline", "--max-tokens", "64")
    try:
        client = server.client()
        chat = client.chat.completions.create(model="letters", messages=[{"role": "user", "content": "go"}])
        assert chat.choices[0].message.content == "abab" and chat.usage.completion_tokens == 4
        chat = client.chat.completions.create(model="letters", messages=[{"role": "user", "content": "go"}], max_tokens=3)
        assert chat.choices[0].message.content == "aba"
        # the made model's stop string, and a request's own in its place
        chat = client.chat.completions.create(model="stopper", messages=[{"role": "user", "content": "go"}])
        assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == ("a", "stop")
        chat = client.chat.completions.create(model="stopper", messages=[{"role": "user", "content": "go"}], stop=["x"])
        assert chat.choices[0].message.content == "abab"

        ol = ollama.Client(host=server.url)
        made = ol.create("fromapi", from_="script", system="Answer.", parameters={"num_predict": 2, "temperature": 0,
                                                                                  "stop": ["zz"]},
                         messages=[{"role": "user", "content": "go"}, {"role": "assistant", "content": "ab"}])
        assert made.status == "success"
        shown = ol.show("fromapi")
        assert parse(shown.modelfile).preset == Store(home / "models").get("fromapi").preset
        assert shown.parameters.splitlines() == [f"{'num_predict':<30} 2", f"{'temperature':<30} 0.0",
                                                 f"{'stop':<30} \"zz\""]
        assert ol.chat("fromapi", messages=[{"role": "user", "content": "go"}]).message.content == "ab"
        raw = server.raw("/api/show", json.dumps({"model": "fromapi"}).encode())[2]
        assert raw["system"] == "Answer."
        ol.copy("fromapi", "fromapi2")
        assert ol.show("fromapi2").modelfile == shown.modelfile  # the same settings, FROM the same base
        for kwargs, status, words in (
                (dict(from_="nothing"), 404, "FROM nothing: model 'nothing:latest' not found"),
                (dict(from_="script", parameters={"tfs_z": 1}), 400, "does not implement the parameter tfs_z"),
                (dict(from_="script", template="{{ .Prompt }}"), 400, "TEMPLATE is an Ollama (Go) template"),
                (dict(from_="script", quantize="q4_0"), 400, "'quantize': create does not quantize"),
                (dict(from_=str(home / "script.gguf")), 400, "is a file path; name a stored model"),
                (dict(from_="script", adapters={"a.gguf": "sha256:" + "0" * 64}), 400, "'adapters'")):
            with pytest.raises(ollama.ResponseError) as err:
                ol.create("broken", **kwargs)
            assert err.value.status_code == status and words in err.value.error, err.value.error
        assert Store(home / "models").get("broken") is None
    finally:
        server.close()


API_RUN = r"""
import json, sys
from tallow import api

with api.load("letters") as model:
    final = model.generate("go")
    print(json.dumps({"text": final.text, "finish": final.finish_reason, "prompt": final.usage.prompt_tokens,
                      "completion": final.usage.completion_tokens}))
"""


def test_the_python_api_answers_as_tallow_run_does_for_a_created_model(home):
    import subprocess
    import sys

    from helpers.processes import tallow_env

    got = subprocess.run([sys.executable, "-c", API_RUN], capture_output=True, text=True, timeout=300,
                         env=tallow_env(home, {"TALLOW_OFFLINE": "1", "TALLOW_NO_LOG": "1"}))
    assert got.returncode == 0, got.stderr
    out, run = json.loads(got.stdout), run_json(home, "letters", "go")
    # its SYSTEM (the same prompt) and PARAMETERs (greedy, 4 tokens), as `tallow run` uses them
    assert (out["text"], out["finish"], out["completion"]) == ("abab", "length", 4)
    assert out["prompt"] == run["usage"]["prompt_tokens"] and out["text"] == run["text"]


def test_show_parameters_lists_every_field_with_the_model_s_values(home):
    r = run_tallow(["show", "letters", "--parameters", "--json"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    from tallow.common.fields import FIELDS

    assert set(rows) == {f.on("modelfile") for f in FIELDS}
    assert (rows["temperature"]["value"], rows["temperature"]["source"]) == (0.0, "model")
    assert (rows["num_predict"]["value"], rows["top_k"]["value"], rows["top_k"]["source"]) == (4, 40, "default")
    assert rows["mirostat"]["range"] == "0..2" and rows["temperature"]["range"] == "0..2"
    text = run_tallow(["show", "letters", "--parameters"], home=home).stdout.decode()
    assert any(line.split()[:3] == ["temperature", "0.0", "model"] for line in text.splitlines()), text
