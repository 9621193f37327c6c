"""The API flavours, one module each (routes, request/response models, error shape), over the Gateway."""
