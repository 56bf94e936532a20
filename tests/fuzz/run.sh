#!/bin/sh
# run.sh - run one libFuzzer harness for SECONDS over a copy of its seed
# corpus plus its regression inputs (every input that once crashed it), in a
# private temporary directory (new inputs and any crash artifact land there,
# never in the source tree; a crash input is printed and copied to
# $KT_FUZZ_KEEP if set). Prints libFuzzer's last status line (executions,
# coverage). Exit: the harness's status (0: no finding).
#   sh run.sh HARNESS CORPUS_DIR REGRESS_DIR SECONDS
set -u
H=${1:?harness} C=${2:?corpus dir} R=${3:?regression dir} S=${4:?seconds}
T=$(mktemp -d "${TMPDIR:-/tmp}/kt_fuzz.XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir "$T/corpus"
cp "$C"/* "$T/corpus/" 2>/dev/null
# Regression inputs first, each on its own: a crash there is an old finding back.
for f in "$R"/*; do
  [ -f "$f" ] || continue
  "$H" -artifact_prefix="$T/" "$f" >"$T/regress.log" 2>&1 || {
    echo "FAIL: $(basename "$H") crashes again on the regression input $f:" >&2
    tail -n 30 "$T/regress.log" >&2
    exit 1
  }
done
"$H" -max_total_time="$S" -max_len=4096 -timeout=10 -rss_limit_mb=1024 -artifact_prefix="$T/" -print_final_stats=1 \
  "$T/corpus" >"$T/log" 2>&1
rc=$?
grep -E '^#[0-9]+.*(DONE|pulse)' "$T/log" | tail -n 1
grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$T/log"
if [ $rc != 0 ]; then
  echo "FAIL: $(basename "$H") found a crash (exit $rc):" >&2
  tail -n 40 "$T/log" >&2
  for a in "$T"/crash-* "$T"/leak-* "$T"/timeout-* "$T"/oom-*; do
    [ -f "$a" ] || continue
    echo "input: $(basename "$a") (base64: $(base64 -w0 "$a"))" >&2
    [ -n "${KT_FUZZ_KEEP:-}" ] && cp "$a" "$KT_FUZZ_KEEP/"
  done
  exit 1
fi
echo "PASS $(basename "$H"): no finding in $S s"
