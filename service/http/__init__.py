"""The HTTP core, which knows no API flavour: checks, admission, keys, middleware, uvicorn's protocol."""
