"""transerve's serving side: model packages over onnxruntime, behind a LitServe HTTP API. No torch."""

import os

__version__ = "0.1.0"

# onnxruntime 1.31's Linux wheels send telemetry to Microsoft by default (1DS: process, session, model and error
# events, a device id kept in ~/.cache/Microsoft, a session file in the temporary directory; onnxruntime PR 27379).
# A server's operator did not ask for that: off unless the environment says otherwise, set before any process of
# ours imports onnxruntime (spawned workers inherit it). The variable's later name is set too (onnxruntime PR 29843).
for _name in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"):
    os.environ.setdefault(_name, "1")
