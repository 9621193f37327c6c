"""transerve's serving side: model packages over onnxruntime, behind a LitServe HTTP API. No torch."""

__version__ = "0.1.0"
