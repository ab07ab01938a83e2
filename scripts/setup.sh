#!/usr/bin/env bash
# Creates .venv and installs Folio with pinned dependencies (CPU torch 2.13.0).
# Usage: scripts/setup.sh          runtime only
#        scripts/setup.sh --test   plus the test tools, the benchmarks' plotting (their
#                                  tests draw the PNGs) and Debian's Chromium (chat page)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
extras=""
if [ "${1:-}" = "--test" ]; then
    extras="[test,bench]"
    scripts/install-browser.sh
fi
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras}"
# The C++ CPU attention operator, compiled for this machine into .folio-cache/cpu-ops/. Without
# it (no compiler) the executor runs the torch reference and says so in its log.
.venv/bin/python -m folio.kernels.cpu_attention --build \
    || echo "setup.sh: the CPU attention operator did not build; the torch reference will run" >&2
