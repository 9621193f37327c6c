# Serving image skeleton (CPU). The deployment issue turns this into a multi-stage build with a CUDA
# target, tini, a HEALTHCHECK and a baked-in or mounted model package. No torch in the image.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
RUN useradd --create-home --uid 10001 app
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service/ service/
COPY model/__init__.py model/__init__.py
RUN pip install --no-cache-dir ".[serve]"
USER app
