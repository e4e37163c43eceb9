# The harness CLI (load generator, metrics, reports) for the compose `harness` service.
FROM python:3.11-slim
WORKDIR /work
COPY pyproject.toml README.md ./
COPY harness ./harness
COPY adapters ./adapters
RUN pip install --no-cache-dir .
