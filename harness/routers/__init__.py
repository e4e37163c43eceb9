"""Routers: which engine of a cluster serves a call (contract in :mod:`harness.routers.base`)."""
