#!/usr/bin/env python3
"""Every single-host test keeps Open MPI's TCP on loopback.

Reads the test list (`ctest --show-only=json-v1`): each test whose command
runs mpiexec/mpirun, or a script that does, must carry
OMPI_MCA_btl_tcp_if_include=lo and OMPI_MCA_oob_tcp_if_include=lo in its
environment or export them in that script. Tests labelled `multihost` run on
emulated hosts and pin TCP to those hosts' interface instead: they must pin
it to something other than loopback. Test programs that start mpiexec
themselves are listed in SPAWNERS and must set both variables in code.

usage: check_loopback_pinned.py CTEST BUILD_DIR SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys

PINS = ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include")
SPAWNERS = ("tests/reliability/cli_catalogue_test.cc",)
MPI = re.compile(r"\b(mpiexec|mpirun|orterun)\b")


def pinned_in_text(text, value):
    return all(re.search(rf"{p}[=\"', ]+{value}", text) for p in PINS)


def main():
    ctest, build, source = sys.argv[1:4]
    listing = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"],
                             check=True, capture_output=True, text=True,
                             timeout=120).stdout
    tests = json.loads(listing)["tests"]
    problems, checked = [], 0
    for t in tests:
        cmd = t.get("command") or []
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = props.get("ENVIRONMENT", [])
        labels = props.get("LABELS", [])
        scripts = [a for a in cmd if a.endswith((".sh", ".cmake"))]
        script_text = ""
        for s in scripts:
            if os.path.isfile(s):
                with open(s, encoding="utf-8") as f:
                    script_text += f.read()
        uses_mpi = any(MPI.search(os.path.basename(a)) for a in cmd) or \
            (MPI.search(script_text) is not None) or \
            any(a.startswith("-DLAUNCH=") for a in cmd)
        if not uses_mpi:
            continue
        checked += 1
        env_text = "\n".join(env)
        if "multihost" in labels:
            if pinned_in_text(env_text + script_text, "lo\\b"):
                problems.append(f"{t['name']}: a multi-host test pinned to loopback")
            continue
        if not (pinned_in_text(env_text, "lo\\b") or pinned_in_text(script_text, "lo\\b")):
            problems.append(f"{t['name']}: runs MPI without {PINS[0]}=lo and {PINS[1]}=lo")
    for path in SPAWNERS:
        with open(os.path.join(source, path), encoding="utf-8") as f:
            text = f.read()
        if not all(re.search(rf'setenv\("{p}", "lo"', text) for p in PINS):
            problems.append(f"{path}: starts mpiexec without pinning TCP to lo")
    if checked == 0:
        problems.append("no MPI test found: the listing or this check is broken")
    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"PASS: {checked} MPI tests keep Open MPI's TCP on loopback "
          f"(or on their emulated hosts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
