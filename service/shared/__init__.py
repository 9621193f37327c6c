"""What the training side, the service and the SDK share: the model package format (`package`), the
searches and their options (`search`), and the HTTP API's wire schemas (`schemas`).

Only the standard library, numpy and pydantic here: no torch, onnxruntime or litserve, so `model/` and
the client SDK import this and nothing else of `service/` (docs/architecture.md; tests/test_architecture.py).
"""
