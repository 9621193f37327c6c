"""transerve's training side: the Transformer, its data, training, evaluation and export."""

import os

# onnxruntime's telemetry off, as on the serving side (service/__init__.py says why): export, calibration and
# evaluation run onnxruntime too.
for _name in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"):
    os.environ.setdefault(_name, "1")
