"""The ``vllm`` marker: tests that start a real vLLM engine on a GPU, run only when vLLM is
installed and ``DARE_VLLM_TEST=1`` (docs/vllm.md)."""

import importlib.util
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: starts a real vLLM engine (needs vLLM, a GPU and DARE_VLLM_TEST=1)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DARE_VLLM_TEST") == "1" and importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="real-engine test: install vLLM and set DARE_VLLM_TEST=1")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
