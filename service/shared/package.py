"""The model package: the one contract between the training side (model/export.py writes it) and the
service (service/inference/engine.py serves it). A directory with model.json, the ONNX graphs and the tokenizer
files; model.json names its format, task, directions, precision and config, and every file's sha256 and
size, so a package that was changed or cut short is refused naming the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PACKAGE_FORMAT = "transerve-model/1"
# int8 packages the engine serves (model/quantize.py): activations quantized per row at run time, or with
# one calibrated scale per tensor; either way a row's answer is its own, whatever its batch-mates
INT8_ROWS = "int8-rows"
INT8_STATIC = "int8-static"
INT8_SCHEMES = (INT8_STATIC, INT8_ROWS)
CACHE_BY_POSITION = "by-position"   # a generation package's cache layout (model/export.py, LMDecoderGraph)
# Bits of an int8 package's weights (model.json "weight_bits"; packages without it have 8): 7 keeps x86's
# uint8 x int8 instruction without VNNI exact (model/quantize.py)
INT8_WEIGHT_BITS = (8, 7)
INT8_DEFAULT_WEIGHT_BITS = 8


class PackageError(RuntimeError):
    """A model package that cannot be served; the message names the file."""


@dataclass
class ModelPackage:
    path: Path
    meta: dict

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def config(self) -> dict:
        return self.meta["config"]

    def file(self, name: str) -> Path:
        return self.path / name


def load_package(path: str | Path, *, verify: bool = True) -> ModelPackage:
    """Reads and checks a model package directory (see model/export.py for its layout)."""
    path = Path(path)
    meta_file = path / "model.json"
    if not meta_file.is_file():
        raise PackageError(f"{meta_file}: missing (is {path} a model package written by model.export?)")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PackageError(f"{meta_file}: not readable JSON ({e})") from None
    if meta.get("format") != PACKAGE_FORMAT:
        raise PackageError(f"{meta_file}: format is {meta.get('format')!r}, expected {PACKAGE_FORMAT!r}")
    files = meta.get("files", {})
    # Before any file is read: an absolute name or one through ".." would be read and hashed wherever it points, and
    # an error would quote it (a path a client of model control chose, or one of the server's)
    if isinstance(files, dict) and not all(map(inside_package, files)):
        raise PackageError("model.json: a file entry is not a relative path inside the package")
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            raise PackageError(f"{f}: missing from the model package")
        if f.stat().st_size != info["bytes"]:
            raise PackageError(f"{f}: {f.stat().st_size} bytes, model.json says {info['bytes']} (corrupt or truncated)")
        if verify and sha256(f) != info["sha256"]:
            raise PackageError(f"{f}: sha256 does not match model.json (corrupt or modified)")
    return ModelPackage(path, meta)


def weight_bits(package: ModelPackage) -> int:
    """Bits of an int8 package's weights: model.json's "weight_bits", 8 where it has none (and for fp32 and fp16,
    where none are int8)."""
    int8 = package.meta.get("precision") == "int8"
    bits = package.meta.get("weight_bits", INT8_DEFAULT_WEIGHT_BITS) if int8 else INT8_DEFAULT_WEIGHT_BITS
    if bits not in INT8_WEIGHT_BITS:
        raise PackageError(f"{package.path / 'model.json'}: weight_bits is {bits!r}, expected one of "
                           f"{INT8_WEIGHT_BITS}")
    return bits


def inside_package(name) -> bool:
    """Whether a model.json "files" name is a relative path that stays inside the package, in printable text."""
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    return bool(parts) and name.isprintable() and not PurePosixPath(name).is_absolute() and ".." not in parts


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entries(out: Path, names: list[str]) -> dict[str, dict]:
    """model.json's "files": each file's sha256 and size, as load_package checks them."""
    return {name: {"sha256": sha256(out / name), "bytes": (out / name).stat().st_size} for name in names}
