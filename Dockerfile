# One image for the three Folio roles: `folio scheduler`, `folio executor`, `folio frontend`.
#
#   GPU (default):  docker build -t folio .
#                   BASE: a CUDA PyTorch image; its torch and triton stay (no constraints).
#   CPU:            docker build --target cpu -t folio:cpu .
#                   python:3.11-slim with the exact pins of constraints.txt and CPU torch.
#
# No model is baked in: mount a checkpoint directory (compose.yaml mounts it at /models).
# The only weights inside are the 16 MB demo model that is part of the folio package.

ARG BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
ARG CPU_BASE=python:3.11-slim

# ---- the source both targets install (one list of what goes in) ------------------------
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY folio /src/folio
COPY frontend /src/frontend
COPY scheduler /src/scheduler
COPY executor /src/executor
COPY kernels /src/kernels
COPY shared /src/shared

# ---- CPU: pinned dependencies, torch from the CPU wheel index -----------------------------
FROM ${CPU_BASE} AS cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin folio \
    && install -d -o folio -g folio -m 0700 /keys
WORKDIR /opt/folio
COPY constraints.txt ./
RUN grep -E '^torch==' constraints.txt > torch-pin.txt \
    && pip install --index-url "${TORCH_INDEX_URL}" -r torch-pin.txt
# Built from a folder of its own, then removed: a step run where a source tree lies would
# import that tree's bare `folio/` folder, not the installed package.
COPY --from=source /src /tmp/folio-src
RUN pip install -c constraints.txt /tmp/folio-src && rm -rf /tmp/folio-src \
    && folio --help > /dev/null
# The C++ CPU attention operator, built portable (the image may run on another CPU); the
# compiler is removed again in the same layer.
ENV FOLIO_CPU_OPS_DIR=/opt/folio/cpu-ops
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && python -m folio.kernels.cpu_attention --build --variant portable \
    && apt-get purge -y --auto-remove g++ && rm -rf /var/lib/apt/lists/*
USER 10001:10001
WORKDIR /home/folio
EXPOSE 8000 5555
ENTRYPOINT ["folio"]
CMD ["--help"]

# ---- GPU (default target): the base image's CUDA torch, Folio on top --------------------
FROM ${BASE} AS gpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin folio \
    && install -d -o folio -g folio -m 0700 /keys
WORKDIR /opt/folio
# Built from a folder of its own, then removed: a step run where a source tree lies would
# import that tree's bare `folio/` folder, not the installed package.
COPY --from=source /src /tmp/folio-src
# No constraints file here: pip keeps the base image's torch (and triton) when they satisfy
# pyproject.toml, instead of replacing them with the CPU pins.
RUN pip install /tmp/folio-src && rm -rf /tmp/folio-src \
    && python -c "import torch; print('torch', torch.__version__)" \
    && folio --help > /dev/null
# The CPU attention operator too, if the base image has a compiler (only --device cpu uses it).
ENV FOLIO_CPU_OPS_DIR=/opt/folio/cpu-ops
RUN if command -v c++ > /dev/null; then python -m folio.kernels.cpu_attention --build --variant portable; \
    else echo "no C++ compiler: CPU attention will use the torch reference"; fi
USER 10001:10001
WORKDIR /home/folio
EXPOSE 8000 5555
ENTRYPOINT ["folio"]
CMD ["--help"]
