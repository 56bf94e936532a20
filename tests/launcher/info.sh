#!/bin/sh
# info.sh - `kaitian info` and the front door: version, build, CPU features,
# transports, hostname, every KAITIAN_* parameter with its current value (the
# secret hidden); --version, --help, unknown commands. Args: KAITIAN_CLI PARAMS_DEF
. "$(dirname "$0")/lib.sh" "$@"
DEF=${2:?path of src/core/params.def}

KAITIAN_TIMEOUT=1234 KAITIAN_JOB_SECRET=do-not-print-me "$KT" info >"$TMP/a.out" 2>"$TMP/a.err"
expect_rc 0 $? "kaitian info"
ver=$(sed -n 's/^#define KT_VERSION_MAJOR \([0-9]*\)/\1/p' "$(dirname "$DEF")/../../include/kaitian.h")
expect_grep "^kaitian $ver\\.[0-9]+\\.[0-9]+\$" "$TMP/a.out" "version line"
expect_grep '^build: +[^ ]' "$TMP/a.out" "build line"
expect_grep '^cpu: ' "$TMP/a.out" "cpu line"
expect_grep '^reduce: +(scalar|avx2|avx512|neon)' "$TMP/a.out" "reduce kernel line"
expect_grep '^transports: +shm \(ranks of one host\), tcp \(between hosts\)$' "$TMP/a.out" "transports line"
KAITIAN_TRANSPORT=tcp "$KT" info >"$TMP/tcp.out" 2>"$TMP/tcp.err"
expect_grep '^transports: +tcp \(KAITIAN_TRANSPORT=tcp' "$TMP/tcp.out" "transports line with KAITIAN_TRANSPORT=tcp"
expect_grep "^hostname: +$(uname -n)\$" "$TMP/a.out" "hostname line"
expect_grep '^  KAITIAN_TIMEOUT +1234 +\(default: 1800000\)$' "$TMP/a.out" "current value of KAITIAN_TIMEOUT"
grep -q 'do-not-print-me' "$TMP/a.out" && fail "kaitian info printed the job secret"
# Every parameter of params.def is listed.
for name in $(sed -n 's/^KT_PARAM(\([A-Z0-9_]*\),.*/\1/p' "$DEF"); do
  grep -q "^  KAITIAN_$name " "$TMP/a.out" || fail "KAITIAN_$name missing from kaitian info"
done

# The key file in force and what is there, never its contents (issue 41: it
# said "(set, not shown)" when neither the variable nor the file existed).
mkdir -p "$TMP/home"
HOME="$TMP/home" "$KT" info >"$TMP/s.out" 2>&1
expect_grep "^  KAITIAN_SECRET_FILE +~/\.kaitian/secret = $TMP/home/\.kaitian/secret: absent" "$TMP/s.out" \
  "default key file, absent"
mkdir -p "$TMP/home/.kaitian" && echo do-not-print-this-key >"$TMP/home/.kaitian/secret" && chmod 600 "$TMP/home/.kaitian/secret"
HOME="$TMP/home" "$KT" info >"$TMP/s.out" 2>&1
expect_grep "^  KAITIAN_SECRET_FILE +~/\.kaitian/secret = $TMP/home/\.kaitian/secret: present, mode 600" "$TMP/s.out" \
  "default key file, present"
chmod 644 "$TMP/home/.kaitian/secret"
KAITIAN_SECRET_FILE="$TMP/home/.kaitian/secret" "$KT" info >"$TMP/s.out" 2>&1
expect_grep "^  KAITIAN_SECRET_FILE +$TMP/home/\.kaitian/secret: present but readable by others \(mode 644\): chmod 600 it" \
  "$TMP/s.out" "key file readable by others"
KAITIAN_SECRET_FILE="$TMP/none" "$KT" info >"$TMP/s.out" 2>&1
expect_grep "^  KAITIAN_SECRET_FILE +$TMP/none: cannot be read: No such file" "$TMP/s.out" "missing key file named"
grep -q 'do-not-print-this-key' "$TMP"/*.out && fail "kaitian info printed the key file's contents"

# The Python side: the interpreter kaitian run would use, its torch, the
# torch_kaitian it imports and the library that loads.
PYTHON="$TMP/no-python" "$KT" info >"$TMP/p.out" 2>&1
expect_grep "^python: +$TMP/no-python \(\\\$PYTHON\): cannot execute" "$TMP/p.out" "missing \$PYTHON named"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  REPO=$(cd "$(dirname "$DEF")/../.." && pwd)
  env -u PYTHON PYTHONPATH="$REPO/python" "$KT" info >"$TMP/p.out" 2>&1
  expect_grep '^python: +/usr/bin/python3 \([0-9.]+; \$PYTHON unset' "$TMP/p.out" "default python"
  expect_grep '^torch: +[0-9]+\.[0-9]+.* in /' "$TMP/p.out" "torch version and place"
  if grep -q '^package: +torch_kaitian not importable' "$TMP/p.out"; then
    # Only where the tree has no loadable library (a lone sanitizer build).
    expect_grep '^package: .*cannot load libkaitian' "$TMP/p.out" "why the package cannot be imported"
  else
    expect_grep "^package: +torch_kaitian in $REPO/python/torch_kaitian\$" "$TMP/p.out" "package place"
    expect_grep "^library: +/.*libkaitian\.so.* \($ver\.[0-9]+\.[0-9]+\)\$" "$TMP/p.out" "library path and versionX"
  fi
fi

"$KT" --version >"$TMP/v.out"
expect_rc 0 $? "kaitian --version"
[ "$(cat "$TMP/v.out")" = "$(head -n 1 "$TMP/a.out")" ] || fail "--version differs from info: $(cat "$TMP/v.out")"
"$KT" --help >"$TMP/h.out"
expect_rc 0 $? "kaitian --help"
for c in run bench info; do expect_grep "^  $c " "$TMP/h.out" "help lists $c"; done
"$KT" frobnicate >"$TMP/u.out" 2>"$TMP/u.err"
expect_rc 2 $? "unknown command"
expect_grep "unknown command 'frobnicate'" "$TMP/u.err" "unknown command message"
"$KT" run --bogus true >"$TMP/o.out" 2>"$TMP/o.err"
expect_rc 2 $? "unknown run option"
expect_grep "unknown option '--bogus'" "$TMP/o.err" "unknown option message"
"$KT" run -n 0 true >"$TMP/o.out" 2>"$TMP/o.err"
expect_rc 2 $? "-n 0"
expect_grep "bad value '0' for -n \(a number of ranks, 1\.\.4096\)$" "$TMP/o.err" "-n 0 names the range"
"$KT" run --grace -1 true >"$TMP/o.out" 2>"$TMP/o.err"
expect_rc 2 $? "--grace -1"
expect_grep "bad value '-1' for --grace \(seconds, 0\.\.86400\)$" "$TMP/o.err" "--grace names the range"
"$KT" run --nnodes 2 true >"$TMP/o.out" 2>"$TMP/o.err"
expect_rc 2 $? "--nnodes without --master"
expect_grep 'needs --master' "$TMP/o.err" "--master message"
echo "PASS info"
