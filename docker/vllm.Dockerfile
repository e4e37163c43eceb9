# vLLM's OpenAI image plus what the harness policies import inside the engine-core process.
# The project itself is mounted at /opt/harness (docker-compose.yml), so code edits need no
# rebuild; only these dependencies are baked in.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}
RUN python3 -m pip install --no-cache-dir "pandas>=2.1,<3" "pyarrow>=15,<24" "scipy>=1.11,<2" "pyyaml>=6,<7"
ENV PYTHONPATH=/opt/harness
