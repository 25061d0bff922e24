#!/usr/bin/env bash
# Checks for a Rust toolchain (cargo 1.85 or newer).
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
