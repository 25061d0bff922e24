#!/usr/bin/env bash
# Installs redis-server and redis-cli from Debian/Ubuntu packages when they are missing, and
# checks the version: the tests need Redis 7.0 or newer (semaphores use `PEXPIRE .. GT`; the
# kit refuses a server below 6.2 outright). Debian 12 and Ubuntu 24.04 ship 7.0 or newer;
# Debian 11 and Ubuntu 22.04 ship 6.0, which the kit refuses.
set -euo pipefail
MIN_VERSION=7.0
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  "$(dirname "$0")/apt-install.sh" "redis-server (Redis $MIN_VERSION or newer)" redis-server redis-tools
  # Tests and the demo start their own servers on free ports; the packaged service is not needed.
  if command -v systemctl >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
      SUDO="sudo"
    fi
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  fi
fi
have="$(redis-server --version | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')"
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$MIN_VERSION" "$have" | sort -V | head -n1)" != "$MIN_VERSION" ]; then
  echo "redis-server ${have:-of unknown version} ($(command -v redis-server)) is older than Redis $MIN_VERSION," >&2
  echo "which the tests need (the kit refuses servers below 6.2). Install a newer one, e.g. from" >&2
  echo "the Redis APT repository (packages.redis.io) or your distribution's backports, so that" >&2
  echo "'redis-server' on PATH is it." >&2
  exit 1
fi
