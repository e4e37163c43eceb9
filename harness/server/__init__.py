"""The built-in OpenAI-compatible engine server: the engine core run in wall-clock time.

``config`` (what it takes), ``host`` (the wall-clock engine loop), ``app`` (HTTP routes),
``embed`` (in-loop or child-process embedding), ``protocol`` (request parsing and the SSE
wire format), ``metrics`` (Prometheus, vLLM names), ``faults`` (fault injection),
``fidelity`` (simulate-vs-serve comparison).
"""

from harness.engine.costmodel import DEFAULT_COST_MODEL
from harness.server.app import app_of, create_app, serve_forever, start_server
from harness.server.cluster_host import check_config, make_config
from harness.server.config import DEFAULT_MODEL, ServerConfig
from harness.server.embed import embedded
from harness.server.host import EngineHost

__all__ = [
    "DEFAULT_COST_MODEL",
    "DEFAULT_MODEL",
    "EngineHost",
    "ServerConfig",
    "app_of",
    "check_config",
    "create_app",
    "embedded",
    "make_config",
    "serve_forever",
    "start_server",
]
