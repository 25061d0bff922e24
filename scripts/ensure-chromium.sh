#!/usr/bin/env bash
# Installs Debian's chromium when /usr/bin/chromium is missing: the inventory demo's tests load
# its HTML report in it (headless) to check that it renders.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
"$(dirname "$0")/apt-install.sh" /usr/bin/chromium chromium
