# The harness CLI (load generator, metrics, reports) for the compose `harness` service.
FROM python:3.11-slim
WORKDIR /work
COPY pyproject.toml setup.py README.md ./
COPY harness ./harness
COPY adapters ./adapters
# gcc only for the optional C scanner of SSE streams (harness/loadgen/_sse_scan.c), removed
# after the build; without it the install still succeeds and uses the Python scanner.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/*
