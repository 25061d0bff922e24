#!/usr/bin/env bash
# Installs Debian/Ubuntu packages with apt-get (with sudo when not root), for the ensure-*.sh
# scripts: `apt-install.sh <what is missing> <package>...`. Fails with a message naming what is
# missing when apt-get is not available.
set -euo pipefail
missing="$1"
shift
if ! command -v apt-get >/dev/null 2>&1; then
  echo "$missing is missing and apt-get is not available: install it yourself" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "installing $* with apt-get ..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
