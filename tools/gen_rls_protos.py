"""Regenerate the rate-limit service's protobuf modules from the vendored .proto files.

    python tools/gen_rls_protos.py          # what `make rls-protos` runs

Reads src/stormguard/gateway/rls/protos/**/*.proto, runs grpcio-tools' protoc (the
pinned version in the Makefile: the generated code's runtime check sets the floor of
the `protobuf` dependency in pyproject.toml) and writes one flat package,
src/stormguard/gateway/rls/_pb/, of ``*_pb2.py`` and ``*_pb2.pyi`` files whose imports
of each other are rewritten from ``envoy.x.y`` to relative ones -- so that the modules
live inside stormguard instead of claiming a top-level ``envoy`` package. Nothing is
fetched: protoc and the well-known types come with grpcio-tools.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RLS = ROOT / "src" / "stormguard" / "gateway" / "rls"
PROTOS = RLS / "protos"
OUT = RLS / "_pb"

INIT = """\
\"""Generated from the vendored Envoy protos (../protos); do not edit.

Regenerate with ``make rls-protos`` (tools/gen_rls_protos.py).
\"""

try:
    import google.protobuf  # noqa: F401
except ImportError as exc:  # the generated modules need the protobuf runtime
    from ...._errors import MissingExtra

    raise MissingExtra("protobuf", "gateway") from exc
"""
# `from envoy.config.core.v3 import base_pb2 as X` -> `from . import base_pb2 as X`
_IMPORT = re.compile(r"^from envoy(?:\.\w+)+ import (\w+_pb2)", re.MULTILINE)


def main() -> None:
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    names = [Path(s).stem + "_pb2" for s in sources]
    if len(set(names)) != len(names):
        raise SystemExit(f"two protos would generate the same module name: {names}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTOS}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                *sources,
            ],
            check=True,
        )
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir()
        (OUT / "__init__.py").write_text(INIT)
        for generated in sorted(Path(tmp).rglob("*_pb2.py*")):
            text = _IMPORT.sub(r"from . import \1", generated.read_text())
            (OUT / generated.name).write_text(text)
    print(f"wrote {len(names)} modules to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
