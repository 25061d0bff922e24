#!/usr/bin/env bash
# Runs the main job: the oversell demo (examples/inventory-demo, instances of
# examples/inventory). Starts its own redis-server unless REDIS_URL is set; arguments go to the
# demo (try --help, --chaos). Prints a table, writes an HTML report with the timelines
# (target/oversell-demo.html, or --report PATH) and prints its path.
set -euo pipefail
# A relative --report PATH is where the command was run, not the repository.
args=()
expect_report=0
for arg in "$@"; do
  if [ "$expect_report" = 1 ] && [[ "$arg" != /* ]]; then
    arg="$PWD/$arg"
  elif [[ "$arg" == --report=* ]] && [[ "${arg#--report=}" != /* ]]; then
    arg="--report=$PWD/${arg#--report=}"
  fi
  expect_report=0
  [ "$arg" = --report ] && expect_report=1
  args+=("$arg")
done
cd "$(dirname "$0")/.."
scripts/ensure-rust.sh
if [ -z "${REDIS_URL:-}" ]; then
  scripts/ensure-redis.sh
fi
cargo run --locked --release -q -p inventory-demo -- ${args[@]+"${args[@]}"}
