#!/usr/bin/env bash
# Runs the main job: the oversell demo. Starts its own redis-server unless REDIS_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-rust.sh
if [ -z "${REDIS_URL:-}" ]; then
  scripts/ensure-redis.sh
fi
cargo run --locked --release -q -p lock-core --example quickstart -- "$@"
