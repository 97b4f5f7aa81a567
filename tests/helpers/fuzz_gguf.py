"""A fuzz target for tallow's bounded GGUF reader (header, metadata, tensor table).

    python tests/helpers/fuzz_gguf.py CORPUS_DIR -runs=100000 -timeout=1    # atheris (libFuzzer)

The property: any bytes give either a GGUFInfo or tallow's GGUFError; anything else
(IndexError, struct.error, MemoryError, a read past the file...) is a crash libFuzzer
reports with the input. `-timeout=1` makes libFuzzer fail any input slower than a second.
`write_seeds(dir, synth, default)` fills a corpus: the malformed-file generator's cases and
the headers of the real models.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.*


def write_seeds(folder: Path, *models: Path) -> None:
    from helpers.gguf_corpus import malformed
    from tallow.models.gguf_file import read_gguf

    folder.mkdir(parents=True, exist_ok=True)
    for model in models:
        data = model.read_bytes() if model.stat().st_size < 2**20 else None
        if data is None:  # a big model: its header and tensor table, and a little data
            end = read_gguf(model).data_offset + 4096
            with open(model, "rb") as f:
                data = f.read(end)
        (folder / f"real-{model.stem[:40]}").write_bytes(data)
    for i, (_, data, _) in enumerate(malformed(models[0])):
        (folder / f"malformed-{i:03d}").write_bytes(data)


def main() -> None:
    import atheris

    with atheris.instrument_imports():
        from tallow.models.errors import GGUFError
        from tallow.models.gguf_file import read_gguf

    fd, name = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    path = Path(name)

    def one(data: bytes) -> None:
        path.write_bytes(data)
        try:
            read_gguf(path)
        except GGUFError:
            pass

    atheris.Setup(sys.argv, one)
    try:
        atheris.Fuzz()
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
