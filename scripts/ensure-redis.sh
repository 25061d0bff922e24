#!/usr/bin/env bash
# Installs redis-server and redis-cli from Debian/Ubuntu packages when they are missing.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "redis-server is missing and apt-get is not available: install Redis 7 yourself" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "installing redis-server and redis-tools with apt-get ..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
# Tests and the demo start their own servers on free ports; the packaged service is not needed.
if command -v systemctl >/dev/null 2>&1; then
  $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
