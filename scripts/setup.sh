#!/usr/bin/env bash
# Creates .venv and installs Folio with pinned dependencies (CPU torch 2.13.0).
# Usage: scripts/setup.sh          runtime only
#        scripts/setup.sh --test   plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras}"
