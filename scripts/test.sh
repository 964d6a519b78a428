#!/usr/bin/env bash
# Runs the whole test suite (expects scripts/setup.sh to have built build/).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
