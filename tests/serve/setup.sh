#!/usr/bin/env bash
# Install the serve tests' npm packages (the official OpenAI client, pinned by package-lock.json)
# with `npm ci`, once per lock file: a stamp in node_modules records the lock it installed.
set -euo pipefail
cd "$(dirname "$0")"
command -v npm >/dev/null || { echo "tests/serve: npm is needed (apt-get install npm)" >&2; exit 1; }
if cmp -s package-lock.json node_modules/.kvplan-lock 2>/dev/null; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json node_modules/.kvplan-lock
