#!/usr/bin/env bash
# Lines of each top-level C function whose name matches a pattern (default: the CLI commands,
# kv_cmd_*), from its signature to its closing brace at column 0, longest first.
# Usage: scripts/func-lines.sh [NAME_REGEX] [FILES...]   e.g. scripts/func-lines.sh '.*' cli/*.c
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pat=${1:-kv_cmd_[a-z_]+}
shift || true
if [ $# -eq 0 ]; then set -- "$root"/cli/*.c; fi
awk -v pat="$pat" '
  FNR == 1 { fn = "" }
  fn == "" && /^[a-zA-Z_].*[ *][a-zA-Z_][a-zA-Z0-9_]*\(/ && !/;[[:space:]]*$/ {
    name = $0; sub(/\(.*/, "", name); sub(/.*[ *]/, "", name)
    if (name ~ ("^(" pat ")$")) {
      fn = name; start = FNR; body = /\{/; file = FILENAME; sub(/.*\//, "", file)
      if (body && /}[[:space:]]*$/) { printf "%5d  %s  (%s:%d)\n", 1, fn, file, start; fn = "" }
      next
    }
  }
  # a prototype over several lines ends in ";" before any "{": not a definition
  fn != "" && !body && /\{/ { body = 1 }
  fn != "" && !body && /;[[:space:]]*(\/\*.*)?$/ { fn = ""; next }
  fn != "" && /^}/ { printf "%5d  %s  (%s:%d)\n", FNR - start + 1, fn, file, start; fn = "" }
' "$@" | sort -rn
