#!/usr/bin/env python3
"""train_nd checkpoint/resume across meshes: save on one, resume on another.

  train_nd_resume.py --mpiexec mpirun --mpiexec-flags "A;B" --program train_nd
      --save "NP|MESH|FLAGS" --resume "NP|MESH|FLAGS" [--steps S --every K]
      [--expect-error REGEX] [--intruder "NP|MESH|FLAGS"]
      [--second-writer "NP|MESH|FLAGS" --second-writer-error REGEX]
      -- COMMON TRAIN FLAGS

Run 1 trains K*2 steps on the first mesh and saves after every K (the
latest checkpoint is at step 2K). Run 2 resumes from that directory on the
second mesh, trains to step S, and must print `resumed at step 2K from` and
PASS: its steps against the serial run of all S steps. With --expect-error,
run 2 must instead fail (non-zero) with a message matching REGEX on every
rank. With --intruder, another job (those flags, e.g. another --seed) saves
the same step into a directory of its own, and its step directory is moved
into run 1's as step-2K.1: committed, but `latest` not moved (a job killed
in that window). The resume must still read run 1's checkpoint only
(parameters and optimizer state) and PASS. With --second-writer, a fresh
job (a job of its own) that saves into run 1's directory must fail at once
on every rank with a message matching --second-writer-error; the resume
then still PASSes from run 1's checkpoints. Prints `PASS: resume` at the end;
the checkpoint directories are temporary ones, removed after.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, timeout):
    print("+ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        print(out)
        print(f"FAIL: timed out after {timeout} s")
        sys.exit(1)
    print(p.stdout, flush=True)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--mpiexec-flags", default="")
    ap.add_argument("--program", required=True)
    ap.add_argument("--save", required=True)
    ap.add_argument("--resume", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--expect-error", default="")
    ap.add_argument("--timeout", type=int, default=100)
    ap.add_argument("--intruder", default="")
    ap.add_argument("--second-writer", default="")
    ap.add_argument("--second-writer-error", default="")
    ap.add_argument("common", nargs="*")
    a = ap.parse_args()
    flags = [f for f in a.mpiexec_flags.split(";") if f]

    def launch(spec, extra):
        np_, mesh, more = (spec.split("|") + ["", ""])[:3]
        return ([a.mpiexec] + flags + ["-n", np_, a.program, "--mesh", mesh] +
                a.common + more.split() + extra)

    ckpt = tempfile.mkdtemp(prefix="vemesh_train_nd_ckpt.")
    other = tempfile.mkdtemp(prefix="vemesh_train_nd_other.")
    try:
        saved = 2 * a.every
        rc, out = run(launch(a.save, ["--steps", str(saved), "--checkpoint_dir",
                                      ckpt, "--checkpoint_every",
                                      str(a.every)]), a.timeout)
        if rc != 0 or "PASS: loss curve" not in out:
            print(f"FAIL: the saving run (exit {rc}) did not PASS")
            return 1
        if a.second_writer:
            rc, out = run(launch(a.second_writer, [
                "--steps", str(saved), "--checkpoint_dir", ckpt,
                "--checkpoint_every", str(a.every)]), a.timeout)
            np_ = int(a.second_writer.split("|")[0])
            hits = len(re.findall(a.second_writer_error, out))
            if rc == 0 or hits < np_:
                print(f"FAIL: the second job (exit {rc}) wrote into the "
                      f"first's directory, or {hits} of {np_} ranks said "
                      f"/{a.second_writer_error}/")
                return 1
            print(f"second job refused on every rank: /{a.second_writer_error}/")
        if a.intruder:
            rc, out = run(launch(a.intruder, [
                "--steps", str(saved), "--checkpoint_dir", other,
                "--checkpoint_every", str(saved)]), a.timeout)
            if rc != 0:
                print(f"FAIL: the other job (exit {rc}) failed")
                return 1
            os.rename(os.path.join(other, f"step-{saved}"),
                      os.path.join(ckpt, f"step-{saved}.1"))
            print(f"moved the other job's step-{saved} to "
                  f"{ckpt}/step-{saved}.1 (latest still names step-{saved})")
        rc, out = run(launch(a.resume, ["--steps", str(a.steps), "--resume",
                                        ckpt]), a.timeout)
        if a.expect_error:
            if rc == 0:
                print("FAIL: the resuming run succeeded; expected an error")
                return 1
            np_ = int(a.resume.split("|")[0])
            hits = len(re.findall(a.expect_error, out))
            if hits < np_:
                print(f"FAIL: {hits} of {np_} ranks said /{a.expect_error}/")
                return 1
            print(f"PASS: resume refused on every rank: /{a.expect_error}/")
            return 0
        want = f"resumed at step {saved} from {ckpt}/"
        if want not in out:
            print(f"FAIL: no line '{want}...'")
            return 1
        if rc != 0 or not re.search(
                rf"PASS: loss curve vs serial reference over steps "
                rf"{saved + 1}\.\.{a.steps} ", out):
            print(f"FAIL: the resumed run (exit {rc}) did not PASS over steps "
                  f"{saved + 1}..{a.steps}")
            return 1
        print(f"PASS: resume at step {saved} on {a.resume} from {a.save}")
        return 0
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
