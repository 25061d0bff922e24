#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration (against real redis-server processes
# the tests start on free loopback ports), trybuild UI tests and doctests. Installs what they
# need when missing: redis-server, and Chromium (the demo report's browser test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-rust.sh
scripts/ensure-redis.sh
scripts/ensure-chromium.sh
cargo test --workspace --locked --no-fail-fast "$@"
