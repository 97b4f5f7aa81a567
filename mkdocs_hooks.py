"""The manual's charts, drawn as the site is built from the bench runs recorded in docs/data/
(each the -o json of a real `tallow bench` run, named on the performance page): every chart
tallow bench --plot would draw from that run, as images/STEM-NAME.svg. Nothing is fetched."""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.structure.files import File, Files

from tallow.common.charts import charts, svg


def on_files(files: Files, config) -> Files:
    for recorded in sorted((Path(config["docs_dir"]) / "data").glob("*.json")):
        for chart in charts(json.loads(recorded.read_text(encoding="utf-8"))):
            files.append(File.generated(config, f"images/{recorded.stem}-{chart.name}.svg", content=svg(chart)))
    return files
