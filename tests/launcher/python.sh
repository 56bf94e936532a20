#!/bin/sh
# python.sh - a .py program runs under $PYTHON (else /usr/bin/python3); a
# program that cannot be executed is named in a clear error and gives 127.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

cat >"$TMP/fakepy" <<'PY'
#!/bin/sh
echo "fakepy rank=$RANK args=$*"
PY
chmod +x "$TMP/fakepy"
echo 'print("never run by fakepy")' >"$TMP/train.py"

PYTHON="$TMP/fakepy" "$KT" run -n 2 "$TMP/train.py" --lr 0.1 >"$TMP/a.out" 2>"$TMP/a.err"
expect_rc 0 $? "run train.py under PYTHON"
for r in 0 1; do
  expect_grep "^\\[$r\\] fakepy rank=$r args=$TMP/train.py --lr 0.1\$" "$TMP/a.out" "rank $r under PYTHON"
done

# Default interpreter: /usr/bin/python3 when it exists.
if [ -x /usr/bin/python3 ]; then
  printf 'import os, sys\nprint("py", sys.executable, os.environ["RANK"], sys.argv[1:])\n' >"$TMP/who.py"
  env -u PYTHON "$KT" run -n 1 "$TMP/who.py" x >"$TMP/b.out" 2>"$TMP/b.err"
  expect_rc 0 $? "run who.py under /usr/bin/python3"
  expect_grep "^\\[0\\] py /usr/bin/python3 0 \\['x'\\]\$" "$TMP/b.out" "default interpreter"
fi

# Things that cannot run: exit 127, the message names them.
PYTHON="$TMP/no-such-python" "$KT" run -n 2 "$TMP/train.py" >"$TMP/c.out" 2>"$TMP/c.err"
expect_rc 127 $? "missing PYTHON interpreter"
expect_grep "no-such-python" "$TMP/c.err" "message names the interpreter"
"$KT" run -n 2 "$TMP/missing.py" >"$TMP/d.out" 2>"$TMP/d.err"
expect_rc 127 $? "missing script"
expect_grep "missing\\.py" "$TMP/d.err" "message names the script"
"$KT" run -n 2 kt-no-such-command-$$ >"$TMP/e.out" 2>"$TMP/e.err"
expect_rc 127 $? "missing command"
expect_grep "cannot execute 'kt-no-such-command-$$'" "$TMP/e.err" "message names the command"
printf '\177ELF garbage' >"$TMP/badexe"; chmod +x "$TMP/badexe"
"$KT" run -n 2 "$TMP/badexe" >"$TMP/f.out" 2>"$TMP/f.err"
expect_rc 127 $? "file that execve rejects"
expect_grep "cannot execute '$TMP/badexe'.*rank 0" "$TMP/f.err" "message names the program"
grep -q '^kaitian run: rank' "$TMP/f.err" && fail "exec failure also reported as a rank failure"
echo 'not executable' >"$TMP/plain"
"$KT" run -n 1 "$TMP/plain" >"$TMP/g.out" 2>"$TMP/g.err"
expect_rc 127 $? "file without execute permission"
expect_grep "cannot execute '$TMP/plain'" "$TMP/g.err" "message names the file"
echo "PASS python"
