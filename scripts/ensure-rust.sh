#!/usr/bin/env bash
# Checks for a Rust toolchain new enough for the workspace (its `rust-version`, 1.88).
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
need="$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' "$(dirname "$0")/../Cargo.toml" | head -n1)"
have="$(cargo --version | sed -n 's/^cargo \([0-9]*\.[0-9]*\).*/\1/p')"
if [ -n "$need" ] && [ -n "$have" ] \
  && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "cargo $have is older than the workspace needs ($need): run 'rustup update stable'" >&2
  exit 1
fi
