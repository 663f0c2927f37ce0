#!/usr/bin/env python3
"""A safetensors reader with json, struct and numpy only: opens the shards
checkpoint_driver wrote (`save DIR 3 2 8`) and finds the values it saved.

  python3 read_shard_test.py DIR
"""

import json
import os
import struct
import sys

try:
  import numpy as np
except ImportError:
  print("SKIP: this python3 has no numpy", file=sys.stderr)
  sys.exit(77)

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64,
          "I32": np.int32, "U8": np.uint8}


def read_tensor(path, key):
  """Tensor `key` of the safetensors file at `path`."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    assert n <= os.path.getsize(path) - 8, "header length beyond the file"
    header = json.loads(f.read(n))
    entry = header[key]
    begin, end = entry["data_offsets"]
    f.seek(8 + n + begin)
    data = f.read(end - begin)
  return np.frombuffer(data, dtype=np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<")
                       ).reshape(entry["shape"]), header


def main():
  root = sys.argv[1]
  step_dir = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
  manifest = json.load(open(os.path.join(step_dir, "manifest.json")))
  step = manifest["step"]
  assert step == 3, step
  # w [8, 256] in row shards over 2 ranks: assemble it from its pieces.
  w_info = manifest["tensors"]["w"]
  w = np.zeros(w_info["shape"], dtype=np.float32)
  for piece in w_info["pieces"]:
    part, header = read_tensor(os.path.join(step_dir, piece["file"]), piece["key"])
    assert header["__metadata__"]["step"] == "3"
    # The manifest's byte offset is the header's data offset, absolute.
    (n,) = struct.unpack("<Q", open(os.path.join(step_dir, piece["file"]), "rb").read(8))
    assert 8 + n + header[piece["key"]]["data_offsets"][0] == piece["offset"]
    (r0, c0), (nr, nc) = piece["offsets"], piece["lengths"]
    w[r0:r0 + nr, c0:c0 + nc] = part
  flat = np.arange(w.size, dtype=np.int64)
  expected = ((3 * flat + 1009 * step) % (1 << 23)).astype(np.float32).reshape(w.shape)
  assert np.array_equal(w, expected), "w differs"
  # ids [16] I64, replicated: written once.
  (piece,) = manifest["tensors"]["ids"]["pieces"]
  ids, _ = read_tensor(os.path.join(step_dir, piece["file"]), piece["key"])
  assert np.array_equal(ids, 100 * step + np.arange(16)), ids
  print("PASS: python reader matched w [8, 256] (2 shards) and ids [16]")


if __name__ == "__main__":
  main()
