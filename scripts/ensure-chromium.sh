#!/usr/bin/env bash
# Installs Debian's chromium when /usr/bin/chromium is missing: the inventory demo's tests load
# its HTML report in it (headless) to check that it renders.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "/usr/bin/chromium is missing and apt-get is not available: install Chromium yourself" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "installing chromium with apt-get ..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
