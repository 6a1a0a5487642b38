# CSV and JSON output of the scenarios. The CSV headers are part of the CLI's
# contract (the README and the tests name them); JSON carries the same rows plus
# the parameters that produced them. Nothing time-dependent is written, so the
# same seed gives byte-identical files.
from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BUDGET_HEADER",
    "HEDGING_HEADER",
    "LAYERS_HEADER",
    "OCC_HEADER",
    "STORM_HEADER",
    "TIMELINE_HEADER",
    "format_cell",
    "write_csv",
    "write_json",
]

OCC_HEADER = ("strategy", "clients", "runs", "calls_mean", "calls_sd", "time_mean", "time_sd")
STORM_HEADER = ("strategy", "server", "peak_rps", "amplification", "failed", "recovery_s")
TIMELINE_HEADER = ("strategy", "server", "second", "requests", "attempts", "successes", "failures")
BUDGET_HEADER = ("strategy", "clients", "failure_rate", "success", "load")
LAYERS_HEADER = ("policy", "depth", "attempts", "load")
HEDGING_HEADER = ("strategy", "requests", "extra", "p50_ms", "p99_ms", "p999_ms")


def format_cell(value: object) -> object:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return format(value, ".10g")
    return value


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """Write ``rows`` under ``header``; floats with 10 significant digits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow([format_cell(value) for value in row])
    return path


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no infinity
    if isinstance(value, tuple | list):
        return [_json_value(item) for item in value]
    return value


def write_json(
    path: Path,
    scenario: str,
    parameters: Mapping[str, Any],
    tables: Mapping[str, tuple[Sequence[str], Iterable[Sequence[object]]]],
) -> Path:
    """One JSON document: the scenario, its parameters, and each table as records."""
    document: dict[str, Any] = {
        "scenario": scenario,
        "parameters": {key: _json_value(value) for key, value in parameters.items()},
    }
    for name, (header, rows) in tables.items():
        document[name] = [
            {column: _json_value(value) for column, value in zip(header, row, strict=True)}
            for row in rows
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
