#!/bin/sh
# env_docs.sh - docs/env.md must be exactly what `kaitian info --env-markdown`
# prints, so the documentation of KAITIAN_* variables cannot drift from
# src/core/params.def. Args: KAITIAN_CLI DOCS_ENV_MD
set -u
KT=${1:?kaitian command}
DOC=${2:?path of docs/env.md}
tmp=$(mktemp "${TMPDIR:-/tmp}/kt_env_md.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# Values in the environment must not change the table (it shows defaults).
KAITIAN_DEBUG=TRACE KAITIAN_TIMEOUT=5 "$KT" info --env-markdown >"$tmp" || { echo "FAIL: kaitian info --env-markdown failed" >&2; exit 1; }
grep -q '^| `KAITIAN_DEBUG` |' "$tmp" || { echo "FAIL: no KAITIAN_DEBUG row in the generated table" >&2; exit 1; }
if ! diff -u "$DOC" "$tmp"; then
  echo "FAIL: docs/env.md differs from the parameter table in src/core/params.def" >&2
  echo "regenerate with: kaitian info --env-markdown > docs/env.md" >&2
  exit 1
fi
echo "PASS env_docs"
