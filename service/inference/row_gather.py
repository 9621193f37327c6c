"""Rows of the engine's blocks copied where the model runs (service/inference/device_memory.py): a 5-d tensor's
rows gathered along its second axis, its fourth axis (the columns) cut or zero-padded to a width, by a graph of
three onnxruntime operators (Gather, Slice, Pad) run on the blocks' device with both ends bound by address.

Why: on CUDA a reorder of the self-attention cache (every beam-search step: beams change places) went through
the host, the whole cache copied down, gathered by numpy and copied up again. With this graph it stays on the
device. On the CPU numpy's one `np.take` does the same in place; the graph runs there only where the blocks
are onnxruntime's own (`BlockPool(..., host_blocks=False)`: tests/test_row_gather.py runs the device path so,
against numpy).

The graph is written here as ONNX's protobuf bytes, the few fields it needs (onnx.proto: ModelProto,
GraphProto, NodeProto, AttributeProto, ValueInfoProto), so that serving needs no `onnx` package."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .onnxruntime_bridge import Binder

ONNX_FLOAT, ONNX_INT64, ONNX_FLOAT16 = 1, 7, 10     # TensorProto.DataType
ELEMENT_TYPES = {np.dtype(np.float32): ONNX_FLOAT, np.dtype(np.float16): ONNX_FLOAT16}
OPSET = 17


# --- the protobuf wire format: varints and length-delimited fields -------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, s: str) -> bytes:
    return _bytes(field, s.encode())


def _value_info(name: str, element_type: int, dims: list[str]) -> bytes:
    """ValueInfoProto: a tensor of `element_type` with named (symbolic) dimensions."""
    shape = b"".join(_bytes(1, _str(2, d)) for d in dims)                  # TensorShapeProto.dim.dim_param
    tensor = _int(1, element_type) + _bytes(2, shape)                      # TypeProto.Tensor
    return _str(1, name) + _bytes(2, _bytes(1, tensor))                    # name, type.tensor_type


def _node(op_type: str, inputs: list[str], outputs: list[str], **ints: int) -> bytes:
    """NodeProto with integer attributes (AttributeProto type 2: INT)."""
    attributes = b"".join(_bytes(5, _str(1, k) + _int(3, v) + _int(20, 2)) for k, v in ints.items())
    return (b"".join(_str(1, i) for i in inputs) + b"".join(_str(2, o) for o in outputs)
            + _str(4, op_type) + attributes)


def gather_graph(element_type: int) -> bytes:
    """out = Pad(Slice(Gather(src, rows, axis=1), starts, ends, axes), pads): src (L, R, h, W, d_k) ->
    out (L, M, h, width, d_k), the columns past min(W, width) zeros."""
    nodes = [_node("Gather", ["src", "rows"], ["gathered"], axis=1),
             _node("Slice", ["gathered", "starts", "ends", "axes"], ["cut"]),
             _node("Pad", ["cut", "pads"], ["out"])]
    inputs = [_value_info("src", element_type, ["L", "R", "h", "W", "d_k"]),
              _value_info("rows", ONNX_INT64, ["M"]),
              *(_value_info(name, ONNX_INT64, ["one"]) for name in ("starts", "ends", "axes")),
              _value_info("pads", ONNX_INT64, ["ten"])]
    graph = (b"".join(_bytes(1, n) for n in nodes) + _str(2, "gather_rows")
             + b"".join(_bytes(11, i) for i in inputs)
             + _bytes(12, _value_info("out", element_type, ["L", "M", "h", "width", "d_k"])))
    return _int(1, 8) + _bytes(8, _int(2, OPSET)) + _bytes(7, graph)    # ir_version 8, opset_import, graph


class RowGather:
    """The gather graph's session for one device and element type; call it with two blocks' addresses."""

    def __init__(self, device: str, dtype: np.dtype):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1          # a copy: one thread, none spinning beside the model's
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(gather_graph(ELEMENT_TYPES[np.dtype(dtype)]), so, providers=providers)
        self.dtype, self.bind, self.host = np.dtype(dtype), Binder(device), Binder("cpu")
        self._starts, self._axes = np.zeros(1, dtype=np.int64), np.array([3], dtype=np.int64)

    def __call__(self, src: int, shape: tuple[int, int, int, int, int], rows: np.ndarray, width: int,
                 dst: int) -> None:
        """Writes src's rows `rows` (-1: any row, for a new one) at `width` columns to address `dst`:
        (L, len(rows), h, width, d_k). `src`: the address of an (L, R, h, W, d_k) tensor; the two must not
        overlap."""
        L, R, h, W, d_k = shape
        rows = np.clip(np.asarray(rows, dtype=np.int64), 0, R - 1)
        kept = min(W, width)
        ends = np.array([kept], dtype=np.int64)
        pads = np.array([0, 0, 0, 0, 0, 0, 0, 0, width - kept, 0], dtype=np.int64)
        io = self.session.io_binding()
        self.bind.input(io, "src", self.dtype, shape, src)
        for name, a in (("rows", rows), ("starts", self._starts), ("ends", ends), ("axes", self._axes),
                        ("pads", pads)):
            self.host.input(io, name, a.dtype, a.shape, a.ctypes.data)
        self.bind.output(io, "out", self.dtype, (L, len(rows), h, width, d_k), dst)
        self.session.run_with_iobinding(io)
