"""C++ and Python read each other's checkpoints: examples/train_nd saves on
one mesh, Python (torch_ckpt_reshard.py, 2 ranks) loads that checkpoint into
torch parameters and AdamW state held as row and column blocks and saves it
again, and train_nd resumes from Python's checkpoint on another mesh: its
steps must match the serial run of the whole training (train_nd's own
check), and Python's checkpoint holds the same bytes as train_nd's.

  ckpt_train_nd.py --program build/release/examples/train_nd/train_nd \\
      --python python3
Prints `PASS: train_nd -> Python -> train_nd` at the end.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = ["--batch", "32", "--micro_batches", "2", "--optimizer", "adam",
          "--lr", "0.01"]


def run(cmd, timeout=60):
    print("+ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(out)
        print(f"FAIL: timed out after {timeout} s")
        sys.exit(1)
    print(p.stdout, flush=True)
    if p.returncode != 0:
        print(f"FAIL: exit {p.returncode}")
        sys.exit(1)
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", required=True)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    if subprocess.run([a.python, "-c", "import torch, numpy"]).returncode != 0:
        print("SKIPPED: the Python lacks torch or numpy")
        return 77
    mpi = ["mpiexec", "--oversubscribe", "--bind-to", "none", "-n", "2"]
    tmp = tempfile.mkdtemp(prefix="vemesh_ckpt_train_nd.")
    try:
        cpp, py = os.path.join(tmp, "cpp"), os.path.join(tmp, "py")
        out = run(mpi + [a.program, "--mesh", "DP=2", "--steps", "2",
                         "--checkpoint_dir", cpp, "--checkpoint_every", "2",
                         "--checkpoint_async=false"] + COMMON)
        if "PASS: loss curve" not in out:
            print("FAIL: the saving run did not PASS")
            return 1
        out = run(mpi + [a.python, os.path.join(HERE, "torch_ckpt_reshard.py"),
                         cpp, py])
        if out.count("bit-identical") != 2:
            print("FAIL: Python did not reshard on both ranks")
            return 1
        out = run(mpi + [a.program, "--mesh", "TP=2", "--steps", "4",
                         "--resume", py] + COMMON)
        if f"resumed at step 2 from {py}/" not in out or not re.search(
                r"PASS: loss curve vs serial reference over steps 3\.\.4 ", out):
            print("FAIL: train_nd did not resume from Python's checkpoint and "
                  "PASS over steps 3..4")
            return 1
        print("PASS: train_nd -> Python -> train_nd")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
