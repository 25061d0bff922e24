#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration (against real redis-server processes
# the tests start on free loopback ports), trybuild UI tests and doctests. Installs what they
# need when missing: redis-server, and Chromium (the demo report's browser test).
#
# Where Chromium cannot be installed (no apt package, no apt-get), every other test still runs
# and the browser test is skipped, said plainly here and in its output; `CHROMIUM=/path/to/it`
# names a browser of your own. CI (.ci/run) installs Chromium first and never skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-rust.sh
scripts/ensure-redis.sh
if [ -n "${CHROMIUM:-}" ]; then
  if [ ! -x "$CHROMIUM" ]; then
    echo "CHROMIUM=$CHROMIUM is not an executable file" >&2
    exit 1
  fi
elif ! scripts/ensure-chromium.sh; then
  echo "NOTE: Chromium could not be installed here, so the demo report's browser test is" >&2
  echo "      SKIPPED (LOCK_TEST_SKIP_BROWSER=1); every other test runs. Set CHROMIUM to a" >&2
  echo "      Chromium binary to run it." >&2
  export LOCK_TEST_SKIP_BROWSER=1
fi
# Most integration tests wait (on leases, failovers, the soak's 60 s) rather than compute: four
# test threads in each binary instead of cargo's one per core (two on CI's machine) take the
# run from 9 to about 7 minutes there. RUST_TEST_THREADS=N chooses another number.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo test --workspace --locked --no-fail-fast "$@"
