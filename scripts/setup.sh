#!/usr/bin/env bash
# Creates .venv and installs Folio with pinned dependencies (CPU torch 2.13.0).
# Usage: scripts/setup.sh          runtime only
#        scripts/setup.sh --test   plus the test tools (and Debian's Chromium, for the
#                                  chat-page browser test)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
extras=""
if [ "${1:-}" = "--test" ]; then
    extras="[test]"
    scripts/install-browser.sh
fi
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras}"
