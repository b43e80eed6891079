"""Regenerates the Python modules of proto/dataservice/v1/*.proto.

The generated modules live in dataservice/v1/ and are committed, so that
installing the package needs no protoc. tests/test_generated_protos.py runs
this script into a temporary folder and fails when the committed files differ.

Usage: python proto/generate.py [OUTPUT_ROOT]   (default: the repository root)
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIR = pathlib.PurePosixPath("dataservice/v1")


def proto_files() -> list[str]:
    """The .proto files, relative to PROTO_ROOT, in a stable order."""
    return sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(output_root: pathlib.Path) -> list[pathlib.Path]:
    """Writes the generated modules under output_root and returns their paths."""
    out_dir = output_root / PACKAGE_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--python_out={output_root}",
        f"--pyi_out={output_root}",
        f"--grpc_python_out={output_root}",
        *proto_files(),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    init = out_dir / "__init__.py"
    init.write_text('"""Generated protobuf and gRPC modules (proto/generate.py writes them)."""\n')
    return sorted(p for p in out_dir.iterdir() if p.suffix in (".py", ".pyi"))


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT
    for path in generate(root):
        print(path)
