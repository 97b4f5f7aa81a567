"""Every TALLOW_* environment variable, in one registry, read at call time.

Only the CLI reads the environment; lower layers get explicit values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    help: str

    def raw(self) -> str:
        return os.environ.get(self.name, "")


HOME = Setting("TALLOW_HOME", "the platform's user data dir", "where tallow keeps its files")
MODELS = Setting("TALLOW_MODELS", "$TALLOW_HOME/models", "where models are stored")
OFFLINE = Setting("TALLOW_OFFLINE", "0", "1: never open a network connection (same as --offline)")
DEBUG = Setting("TALLOW_DEBUG", "0", "1: show tracebacks and llama.cpp's own log")
CONTEXT = Setting("TALLOW_CONTEXT_LENGTH", "4096", "default context size (capped at the model's trained length)")
NO_LOG = Setting("TALLOW_NO_LOG", "0", "1: do not record runs and chats in the local history log")
CACHE_MAX = Setting("TALLOW_CACHE_MAX", "2GiB", "size cap of the prompt cache on disk (bytes, or with KB/MB/GB/KiB/MiB/GiB)")
CACHE_MIN = Setting("TALLOW_CACHE_MIN_TOKENS", "256", "shortest prompt prefix worth saving to the prompt cache")
API_KEY = Setting("TALLOW_API_KEY", "none", "the key `tallow serve` requires (same as --api-key)")
CPU_REPACK = Setting("TALLOW_CPU_REPACK", "auto", "repacked CPU weight layouts: auto (probed once per machine), on, off")
MACHINE = Setting("TALLOW_MACHINE_CACHE", "$TALLOW_HOME/cache/machine.json",
                  "what tallow measured about this machine (repack probe, flash-attention timings)")
HOST = Setting("TALLOW_HOST", "127.0.0.1:8080", "the server `tallow ps` and `tallow stop` talk to (host:port)")
KEEP_ALIVE = Setting("TALLOW_KEEP_ALIVE", "5m", "how long `tallow serve` keeps an idle model loaded (same as --keep-alive)")
ENDPOINT = Setting("TALLOW_ENDPOINT", "none (the local engine)",
                   "an OpenAI-compatible server for run, chat, batch, bench and embed (same as --endpoint)")
ENDPOINT_KEY = Setting("TALLOW_ENDPOINT_KEY", "none", "the API key sent to --endpoint servers (same as --api-key)")

REGISTRY = [HOME, MODELS, OFFLINE, DEBUG, CONTEXT, NO_LOG, CACHE_MAX, CACHE_MIN, API_KEY, CPU_REPACK, MACHINE, HOST,
            KEEP_ALIVE, ENDPOINT, ENDPOINT_KEY]
# Test hooks, not user settings (docs/DESIGN.md, "Calibration"): make the probe child crash or
# hang ("crash", "hang"), or probe where no type needs it ("probe"); and its time limit.
TEST_PROBE = "TALLOW_TEST_PROBE"
TEST_PROBE_TIMEOUT = "TALLOW_TEST_PROBE_TIMEOUT"
# ... and make the runner of one model die by SIGSEGV at its Nth token ("MODEL:N:MARKER"; only
# while the file MARKER does not exist, which the crash creates: the next runner lives), for
# the crash-containment tests (docs/DESIGN.md, "Runners").
TEST_RUNNER_CRASH = "TALLOW_TEST_RUNNER_CRASH"
# ... and make a server measure the machine again sooner ("SECONDS": after that long with no
# request, asking every second, whatever the load), or never ("off": the test suite's default,
# so that one machine profile holds for the whole run) (docs/DESIGN.md, "Calibration").
TEST_RECHECK = "TALLOW_TEST_RECHECK"

_TRUE = {"1", "true", "yes", "on"}


def home() -> Path:
    if HOME.raw():
        return Path(HOME.raw()).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("tallow", appauthor=False))


def models_dir() -> Path:
    return Path(MODELS.raw()).expanduser() if MODELS.raw() else home() / "models"


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int | None:
    """Bytes from "2GiB", "500MB", "8 GB" or "1073741824"; None when it is not a size."""
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", text.strip().lower().replace(" ", ""))
    if not m or m.group(2) not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _size(setting: Setting) -> int:
    size = parse_size(setting.raw() or setting.default)
    if size is None:
        from tallow.common.errors import TallowError

        raise TallowError(f"{setting.name}={setting.raw()!r} is not a size", "e.g. 2GiB, 500MB or 1073741824")
    return size


def cache_max_bytes() -> int:
    return _size(CACHE_MAX)


def cache_min_tokens() -> int:
    value = (CACHE_MIN.raw() or CACHE_MIN.default).strip()
    if not value.isdigit():
        from tallow.common.errors import TallowError

        raise TallowError(f"{CACHE_MIN.name}={value!r} is not a number of tokens")
    return int(value)


def cpu_repack() -> str:
    value = (CPU_REPACK.raw() or CPU_REPACK.default).strip().lower()
    if value not in ("auto", "on", "off"):
        from tallow.common.errors import TallowError

        raise TallowError(f"{CPU_REPACK.name}={CPU_REPACK.raw()!r} is not auto, on or off")
    return value


def machine_cache() -> Path:
    return Path(MACHINE.raw()).expanduser() if MACHINE.raw() else home() / "cache" / "machine.json"


def engines_dir() -> Path:
    """The running engines' thread claims (runtime/host/threads.py)."""
    return home() / "run" / "engines"


def test_probe() -> tuple[str | None, float | None]:
    hook = os.environ.get(TEST_PROBE) or None
    timeout = os.environ.get(TEST_PROBE_TIMEOUT)
    return hook, float(timeout) if timeout else None


def test_recheck() -> float | str | None:
    """None: as for users; "off"; or the seconds of quiet the test asks for."""
    raw = os.environ.get(TEST_RECHECK)
    return None if not raw else "off" if raw == "off" else float(raw)


def test_runner_crash(model: str) -> tuple[int, Path] | None:
    parts = os.environ.get(TEST_RUNNER_CRASH, "").rsplit(":", 2)
    if len(parts) != 3 or parts[0] != model or not parts[1].isdigit() or Path(parts[2]).exists():
        return None
    return int(parts[1]), Path(parts[2])


def server_address(given: str | None = None) -> str:
    """--host, else TALLOW_HOST, as a base URL ("host:port", "host", ":port" or a URL)."""
    raw = (given or "").strip() or HOST.raw().strip() or HOST.default
    if "://" not in raw:
        raw = "http://" + raw
    scheme, rest = raw.split("://", 1)
    hostport = rest.split("/", 1)[0]
    if hostport.startswith(":"):
        hostport = "127.0.0.1" + hostport
    if not hostport.rsplit(":", 1)[-1].isdigit() or hostport.endswith("]"):
        hostport += ":8080"
    return f"{scheme}://{hostport}"


def keep_alive() -> str:
    return KEEP_ALIVE.raw().strip() or KEEP_ALIVE.default


def prompt_cache_dir() -> Path:
    return home() / "cache" / "prompts"


def digest_index() -> Path:
    return home() / "cache" / "file-digests.json"


def history_path() -> Path:
    return home() / "history.db"


def journal_path() -> Path:
    """The journal a running tallow serve appends to, and tallow logs --follow reads."""
    return home() / "serve-journal.jsonl"


def logs_off_marker() -> Path:
    return home() / "logs-off"


def conversations_dir() -> Path:
    return home() / "conversations"


def logging_enabled() -> bool:
    return NO_LOG.raw().strip().lower() not in _TRUE and not logs_off_marker().exists()


def offline() -> bool:
    """TALLOW_OFFLINE, or huggingface_hub's own HF_HUB_OFFLINE: either means no network."""
    return OFFLINE.raw().strip().lower() in _TRUE or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def hub_token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def api_key() -> str | None:
    return API_KEY.raw() or None


def endpoints() -> list[str]:
    """TALLOW_ENDPOINT: one URL, or several separated by commas or spaces (batch spreads over them)."""
    return [u for u in ENDPOINT.raw().replace(",", " ").split() if u]


def endpoint_key() -> str | None:
    return ENDPOINT_KEY.raw() or None


def debug() -> bool:
    return DEBUG.raw().strip().lower() in _TRUE


def context_length() -> int:
    value = CONTEXT.raw().strip()
    if not value:
        return int(CONTEXT.default)
    if not value.isdigit() or int(value) < 16:
        from tallow.common.errors import TallowError

        raise TallowError(f"{CONTEXT.name}={value!r} is not a context size", "set a whole number of tokens, e.g. 4096")
    return int(value)


def env_table() -> str:
    width = max(len(s.name) for s in REGISTRY)
    lines = [f"  {s.name:<{width}}  {s.help} (default: {s.default})" for s in REGISTRY]
    lines.append(f"  {'HF_TOKEN, HF_ENDPOINT':<{width}}  read for Hugging Face hub pulls; HF_HUB_OFFLINE=1 acts as TALLOW_OFFLINE=1")
    # "\b" tells click not to re-wrap the paragraph that follows.
    return "Environment variables:\n\n\b\n" + "\n".join(lines)
