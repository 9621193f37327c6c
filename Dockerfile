# transerve serving image, CPU or GPU from one recipe on one base: the two differ only in ORT_EXTRA, so
# what CI builds and tests on CPU is what runs on the GPU nodes. No torch in either (the build fails if
# anything pulls it in). See deploy/README.md.
#
#   CPU: docker build -t transerve:cpu .
#   GPU: docker build -t transerve:gpu --build-arg ORT_EXTRA=gpu .
#        CUDA 13 and cuDNN 9 come from PyPI as nvidia-* wheels, which onnxruntime-gpu's own cuda and cudnn
#        extras name, pinned with hashes in the GPU lock like every other dependency; onnxruntime's
#        preload_dlls() (service/inference/engine.py) loads them from the venv. No nvidia/cuda base image: the driver
#        (libcuda.so.1) is the host's, mounted by the NVIDIA container toolkit, and a CUDA base would only
#        add a second copy of the libraries. tests/test_gpu_image.py holds the lock's nvidia-* pins to
#        what the locked onnxruntime-gpu's CUDA provider needs (deploy/docker/onnxruntime-gpu-needs.yaml).
#   Model baked in (default: none, mount a package at /models/de-en):
#        --build-arg MODEL_DIR=models/de-en
#   Model-only image for the Kubernetes init container (deploy/k8s):
#        docker build --target model --build-arg MODEL_DIR=models/de-en -t transerve-model:de-en-1 .

# Ubuntu 24.04's CPython 3.12 is the Python the locks are compiled for (scripts/lock.sh).
ARG BASE_IMAGE=ubuntu:24.04
# The model image only needs `sh` and `cp` for the init container.
ARG MODEL_BASE_IMAGE=busybox:1.36.1
# A directory in the build context holding a model package (encoder.onnx, decoder.onnx, spm.model,
# model.json). The default holds only a README, so an image built without a model says so at start.
ARG MODEL_DIR=deploy/docker/no-model

# --- os: the runtime's operating system layer, shared by build and final stages -------------------
FROM ${BASE_IMAGE} AS os
# Versions come from the base image's release; pinning them would tie this file to one distribution.
# tini runs as PID 1: it forwards SIGTERM to the server (whose drain needs it) and reaps zombies.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv tini \
 && rm -rf /var/lib/apt/lists/*

# --- build: the virtual environment with transerve and its serving dependencies ---------------------
FROM os AS build
# serve = onnxruntime (CPU), gpu = onnxruntime-gpu with CUDA and cuDNN (nvidia-* wheels, ~3 GB unpacked);
# every other dependency is the same.
ARG ORT_EXTRA=serve
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependencies first, every one pinned with its hashes (scripts/lock.sh writes the locks): a
# changed or substituted wheel fails the build. Then transerve itself, which adds nothing (its build
# backend, setuptools, is fetched into pip's isolated build environment and stays out of the image).
COPY deploy/docker/requirements-${ORT_EXTRA}.lock /tmp/requirements.lock
RUN /opt/venv/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/requirements.lock
# Only what the serving package needs: model/ (training, torch) stays out of the image.
COPY pyproject.toml README.md ./
COPY service/ service/
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -c "import importlib.util as u, sys; sys.exit('torch must not be in the serving image' if u.find_spec('torch') else 0)" \
 && /opt/venv/bin/python -c "import service.server, onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"

# --- model: a model package alone, copied into pods by deploy/k8s's init container ---------------
FROM ${MODEL_BASE_IMAGE} AS model
ARG MODEL_DIR
COPY ${MODEL_DIR}/ /model/

# --- runtime (default target): the server ---------------------------------------------------------
FROM os AS runtime
ARG MODEL_DIR
# Settings as TRANSERVE_* variables rather than flags in CMD: flags win over the environment, so
# flags here would make Kubernetes ConfigMaps and `docker run -e` unable to change them.
# PROMETHEUS_MULTIPROC_DIR under /tmp: the one place a read-only-root pod can write (an emptyDir).
# NVIDIA_DRIVER_CAPABILITIES: the container toolkit mounts the driver's CUDA library (libcuda.so.1) only
# for "compute", and defaults to "utility" alone where the image does not ask (nvidia/cuda images set
# it; this base does not). Inert without the toolkit, so the CPU image carries it too. GPUs are chosen by
# the runtime (--gpus, the device plugin's NVIDIA_VISIBLE_DEVICES), never by the image.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TRANSERVE_HOST=0.0.0.0 \
    TRANSERVE_PORT=8000 \
    TRANSERVE_MODELS=/models/de-en \
    PROMETHEUS_MULTIPROC_DIR=/tmp/transerve-metrics \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it and runAsUser can match it.
RUN groupadd --system --gid 10001 transerve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin transerve
COPY --from=build /opt/venv /opt/venv
# Owned by root and read-only to the server: a compromised process cannot alter the model.
COPY ${MODEL_DIR}/ /models/de-en/
# An empty, read-only working directory: `python -m` puts the working directory on sys.path.
WORKDIR /opt/transerve
USER 10001:10001
EXPOSE 8000
# Healthy = ready to translate (models loaded and warmed, not draining). The start period covers
# model loading; compose waits on this, Kubernetes ignores it and uses its own probes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=180s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('TRANSERVE_PORT', '8000'), timeout=2)"]
# tini without -g: SIGTERM goes to the server only, which drains and then stops its own workers;
# signalling the whole group would kill the workers under requests still in flight.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3", "-m", "service"]
