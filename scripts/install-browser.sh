#!/usr/bin/env bash
# Installs Debian's Chromium and its WebDriver for the chat-page test (tests/frontend/http/test_chat_page.py).
# Does nothing when /usr/bin/chromium and /usr/bin/chromedriver are already there. Needs apt
# and root (or sudo); scripts/setup.sh --test calls it. apt's output is shown only on failure.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
       $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
           chromium chromium-driver; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-browser.sh: could not install chromium and chromium-driver" >&2
    exit 1
fi
