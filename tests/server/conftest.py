"""Fixtures for the built-in server tests: registers the tiny FCFS test policy and gives an
aiohttp client session."""

from __future__ import annotations

import aiohttp
import pytest
import server_testlib  # noqa: F401  (registers the test policy)


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s
