#!/usr/bin/env bash
# `vemesh checkpoint export` and `inspect` on checkpoint_driver's checkpoint
# (w [8, 256] in 2 row shards, b and ids replicated):
#   1. inspect lists it and verifies every chunk (exit 0);
#   2. export writes one safetensors file that a plain-Python reader
#      (read_export_test.py, no vemesh) finds exactly the saved values in;
#   3. one flipped byte in w's second piece: inspect exits 1 naming the bad
#      chunk (tensor, piece, file, byte range), and export fails leaving no
#      output file.
#   export_inspect.sh VEMESH_CLI CHECKPOINT_DRIVER PYTHON READER
set -u
cli=$1 driver=$2 py=$3 reader=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$driver" save "$dir/ck" 3 2 8 >/dev/null || fail "driver save"
"$cli" checkpoint inspect "$dir/ck" >"$dir/inspect.txt" 2>&1 || {
  cat "$dir/inspect.txt"; fail "inspect of a good checkpoint"; }
cat "$dir/inspect.txt"
grep -q "w  F32 \[8, 256\]  2 pieces" "$dir/inspect.txt" || fail "no line for w"
grep -q "every CRC32C matches" "$dir/inspect.txt" || fail "not verified"
"$cli" checkpoint export "$dir/ck" "$dir/model.safetensors" || fail "export"
"$py" "$reader" driver "$dir/model.safetensors" || fail "reader"
# Flip one byte of w's piece in shard-1 (rows 4..7): 100 bytes into it.
at=$("$py" -c "import json,sys; m=json.load(open(sys.argv[1])); print(next(p['offset'] for p in m['tensors']['w']['pieces'] if p['file']=='shard-1.safetensors'))" "$dir/ck/step-3/manifest.json")
"$py" -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2]) + 100); c = f.read(1); f.seek(int(sys.argv[2]) + 100)
    f.write(bytes([c[0] ^ 0x10]))" "$dir/ck/step-3/shard-1.safetensors" "$at"
"$cli" checkpoint inspect "$dir/ck" >"$dir/bad.txt" 2>&1
rc=$?
cat "$dir/bad.txt"
[ $rc = 1 ] || fail "inspect of a corrupted checkpoint exited $rc, expected 1"
grep -q "BAD chunk: tensor 'w' piece \[4:8, 0:256\] in 'shard-1.safetensors' bytes \[$at, +4096)" "$dir/bad.txt" ||
  fail "inspect did not name the bad chunk"
rm -f "$dir/model.safetensors"
"$cli" checkpoint export "$dir/ck" "$dir/model.safetensors" >"$dir/export.txt" 2>&1
rc=$?
cat "$dir/export.txt"
[ $rc = 1 ] || fail "export of a corrupted checkpoint exited $rc"
grep -q "checksum mismatch" "$dir/export.txt" || fail "export did not say why"
[ ! -e "$dir/model.safetensors" ] && [ ! -e "$dir/model.safetensors.tmp" ] ||
  fail "export left a file behind"
echo "PASS: checkpoint export and inspect"
