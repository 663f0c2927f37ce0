#!/usr/bin/env python3
"""A safetensors reader in plain Python (struct, json, array; no vemesh, no
numpy): opens what `vemesh checkpoint export` wrote and checks its tensors.

  read_export_test.py driver OUT.safetensors
      the export of checkpoint_driver's `save DIR 3 2 8`: w [8, 256] F32,
      b [256] F32, ids [16] I64 with the driver's values, exactly
  read_export_test.py compare A.safetensors B.safetensors [RTOL]
      the same tensor names, dtypes and shapes in both, and every value
      within RTOL relative (default 1e-10) of the other's

safetensors: 8 bytes of little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}, then the raw little-endian data (offsets from the header's end).
"""

import array
import json
import os
import struct
import sys

TYPECODES = {"F64": "d", "F32": "f", "I64": "q", "I32": "i", "U8": "B"}


def read_safetensors(path):
    """({name: (dtype, shape, values)}, metadata) of the file at `path`."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        # Bounded before anything is allocated, as safetensors does.
        assert n <= min(size - 8, 100 << 20), f"header length {n} too large"
        header = json.loads(f.read(n))
        metadata = header.pop("__metadata__", {})
        tensors = {}
        end_of_data = 0
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            assert 0 <= begin <= end <= size - 8 - n, (name, begin, end)
            values = array.array(TYPECODES[entry["dtype"]])
            count = 1
            for s in entry["shape"]:
                count *= s
            assert end - begin == count * values.itemsize, name
            f.seek(8 + n + begin)
            values.frombytes(f.read(end - begin))
            if sys.byteorder == "big":
                values.byteswap()
            tensors[name] = (entry["dtype"], entry["shape"], values)
            end_of_data = max(end_of_data, end)
        assert end_of_data == size - 8 - n, "bytes after the last tensor"
    return tensors, metadata


def check_driver(path):
    tensors, metadata = read_safetensors(path)
    step = 3
    assert metadata["vemesh.step"] == str(step), metadata
    assert sorted(tensors) == ["b", "ids", "w"], sorted(tensors)
    dtype, shape, w = tensors["w"]
    assert (dtype, shape) == ("F32", [8, 256]), (dtype, shape)
    expected = [float((3 * i + 1009 * step) % (1 << 23)) for i in range(8 * 256)]
    assert list(w) == expected, "w differs"
    dtype, shape, b = tensors["b"]
    assert (dtype, shape) == ("F32", [256])
    assert list(b) == [float((3 * i + 1009 * step) % (1 << 23)) + 1
                       for i in range(256)], "b differs"
    dtype, shape, ids = tensors["ids"]
    assert (dtype, shape) == ("I64", [16])
    assert list(ids) == [100 * step + i for i in range(16)], "ids differ"
    print("PASS: plain-Python reader matched w [8, 256] (saved as 2 row "
          "shards), b [256] and ids [16] exactly")


def check_compare(path_a, path_b, rtol):
    a, meta_a = read_safetensors(path_a)
    b, meta_b = read_safetensors(path_b)
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
    worst, where = 0.0, None
    for name in sorted(a):
        da, sa, va = a[name]
        db, sb, vb = b[name]
        assert (da, sa) == (db, sb), (name, da, sa, db, sb)
        for x, y in zip(va, vb):
            rel = abs(x - y) / max(abs(x), abs(y), 1e-300)
            if not rel <= worst:
                worst, where = rel, name
    assert worst <= rtol, f"{where}: relative difference {worst:.3g} > {rtol}"
    print(f"PASS: {len(a)} tensors equal in names, dtypes and shapes; values "
          f"within {worst:.3g} relative (<= {rtol}); mesh "
          f"{meta_a.get('vemesh.mesh')!r} vs {meta_b.get('vemesh.mesh')!r}")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "driver":
        check_driver(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        check_compare(sys.argv[2], sys.argv[3],
                      float(sys.argv[4]) if len(sys.argv) > 4 else 1e-10)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
