#!/usr/bin/env python3
"""Every shell command in README.md and docs/*.md, checked as written.

    doc_commands_test.py REPO_ROOT BUILD_DIR

Reads every ```sh block of README.md and docs/*.md (a line ending in a
backslash joins the next; comments and blank lines are dropped) and looks
each command up in CHECKS below. A command with no entry fails the test, so
a command added to the documents needs a way to be proven here; an entry
whose command left the documents fails too, so the table cannot rot.

How an entry is proven:
  run        run as written by bash, in a scratch folder where build/release
             is this build and ./train is examples/first_program; commands
             of one block share the folder, in order (a checkpoint saved by
             one line is resumed by the next); bounded in time; exit 0, and
             the output matches the entry's pattern when it has one
  gpu        run as written; without a GPU it must fail saying so (CUDA / GPU
             named in the output), never hang or crash
  ctest      proven by the named ctest entries of this build (they run the
             same command, or its program with the same arguments, with
             what it needs: Redis, emulated hosts, Slurm); the entries must
             exist here
  ci         what `bash .ci/run` itself does (scripts/test.sh: set-up,
             every preset, the main job after the presets)
  configure  the preset is configured here, into a scratch folder
  label      the label selects tests in this build
  manual     not run: a benchmark run by hand (the reason is printed)

docs/PLANNER.md's `$ vemesh plan ...` transcripts are run too: the exit status
and the first line printed must be the document's.

Prints "PASS doc commands: N commands, ..." on success.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

root, build = sys.argv[1:3]

# command -> (how, argument): for run/gpu an output pattern (or None), for
# ctest a regex of entry names, for ci what proves it.
CHECKS = {
    # README.md
    "bash scripts/main_job.sh": ("ci", "scripts/test.sh runs it last, as written"),
    "bash scripts/test.sh": ("ci", ".ci/run is this command"),
    "cmake --preset install": ("ctest", r"^consumer\.(static|shared)$"),
    "cmake --build --preset install": ("ctest", r"^consumer\.(static|shared)$"),
    "cmake --install build/install --prefix /opt/vemesh":
        ("ctest", r"^consumer\.(static|shared)$"),
    "VEMESH_LAUNCHER=torchrun bash scripts/main_job.sh":
        ("ctest", r"^launch\.readme\.torchrun_main_job$"),
    "PYTHONPATH=build/release/python torchrun --standalone --nproc_per_node=4 "
    "--redirects 1 --tee 1 train.py": ("run", r"vemesh README python: rank 3 of 4"),
    "mpirun -n 8 build/release/examples/train_nd/train_nd --mesh PP=2,DP=2,TP=2 "
    "--steps 4 --checkpoint_dir ckpt --checkpoint_every 2": ("run", r"PASS: loss curve"),
    "mpirun -n 8 build/release/examples/train_nd/train_nd --mesh "
    "DP_REPLICATE=2,DP_SHARD=2,TP=2 --steps 8 --resume ckpt":
        ("run", r"resumed at step 4 from ckpt/step-4.*\n(.*\n)*.*PASS: loss curve"),
    'redis-server --port 6379 --bind 127.0.0.1 --save "" > redis.log &':
        ("ctest", r"^launch\.readme\.elastic$"),
    'train="build/release/examples/train_nd/train_nd --mesh PP=1,DP=3,TP=2 --batch 24 '
    '--micro_batches 2 --steps 300 --pace_ms 100 --elastic redis://127.0.0.1:6379"':
        ("ctest", r"^launch\.readme\.elastic$"),
    'for k in 0 1 2; do mpirun -n 2 $train --replica $k > replica$k.log 2>&1 & '
    'echo "replica $k: kill $!"; done': ("ctest", r"^launch\.readme\.elastic$"),
    "mpirun -n 2 $train --replica 1 > replica1b.log 2>&1 &":
        ("ctest", r"^launch\.readme\.elastic$"),
    "./build/release/tools/vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 "
    "--format svg --output plan.svg": ("run", None),
    "bash scripts/setup.sh --test": ("ci", "scripts/test.sh starts with it"),
    "cmake --preset release && cmake --build --preset release && ctest --preset release":
        ("ci", "scripts/test.sh runs the release preset this way"),
    "cmake --preset dev && cmake --build --preset dev":
        ("configure", "dev: configured here into a scratch folder (the build is "
                      "the release preset's, with less)"),
    "ctest --preset dev -L elastic":
        ("label", "elastic: the label selects tests in this build"),
    # docs/MULTIHOST.md
    "ctest --preset release -L multihost": ("ctest", r"^multihost\."),
    "source tests/multihost/hosts.sh; mh_up 4; mh_exec node2 hostname":
        ("ctest", r"^multihost\.mpirun\.probe\.4x2$"),
    "bench/multihost_init.sh build/release 21 2x2x2,2x4":
        ("manual", "a benchmark for bench/RESULTS.md, by hand (root, emulated hosts, "
                   "minutes); its hosts are tests/multihost's, which ctest runs"),
    # docs/STRATEGIES.md
    "bash scripts/main_job.sh PP=2,DP=2,TP=2 --experts 8":
        ("ctest", r"^train_nd\.moe_2x2x2$"),
    "mpirun --oversubscribe -n 8 build/release/examples/train_nd/train_nd "
    "--mesh PP=4,TP=2 --layers 5 --schedule gpipe --steps 20": ("run", r"PASS: loss curve"),
    "mpirun --oversubscribe -n 8 build/release/examples/hsdp/hsdp": ("run", None),
    "mpirun --oversubscribe -n 8 build/release/examples/hsdp/hsdp --mesh "
    "replicate=4,shard=2 --optimizer sgd": ("run", None),
    "torchrun --no_python --standalone --redirects 1 --tee 1 --nproc_per_node=8 "
    "build/release/examples/hsdp/hsdp": ("ctest", r"^launch\.hsdp\.torchrun\.2x4$"),
    "build/release/examples/hsdp/hsdp --device cuda --mesh replicate=1,shard=1":
        ("gpu", None),
    # docs/USER_GUIDE.md
    "mpirun -n 8 ./train": ("ctest", r"^launch\.readme\.mpirun$"),
    "srun -n 8 --mpi=pmix ./train": ("ctest", r"^multihost\.srun\.probe\."),
    "torchrun --no_python --standalone --nproc_per_node=8 --redirects 1 --tee 1 ./train":
        ("ctest", r"^launch\.readme\.torchrun_no_orted$"),
    "RANK=3 WORLD_SIZE=8 MASTER_ADDR=node0 MASTER_PORT=29500 ./train":
        ("ctest", r"^multihost\.env\.probe\."),
    "mpirun -n 8 train_nd --mesh PP=2,DP=2,TP=2 --steps 4 --checkpoint_dir ckpt "
    "--checkpoint_every 2": ("run", r"PASS: loss curve"),
    "mpirun -n 8 train_nd --mesh DP_REPLICATE=2,DP_SHARD=2,TP=2 --steps 8 --resume ckpt":
        ("run", r"PASS: loss curve"),
}

# docs/PLANNER.md's transcripts (`$ vemesh plan ...` in plain ``` blocks,
# the output below): run with the built tool as `vemesh`, and the first line
# shown must be the first line printed (and "(exit N)" the exit status).
# Those that read a file the document does not give are proven by the gtest
# cases that feed the same text.
TRANSCRIPT_FILES = {
    "vemesh plan --mesh TP=4 --placement hostfile:hosts.txt":
        r"^Hostfile\.BadLinesNameFileLineTextAndExpectation$",
    "vemesh plan --mesh TP=8 --placement hostfile:uneven.txt":
        r"^Hostfile\.TooFewSlotsNamesBothNumbers$",
    "vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 --check placement.json":
        r"^PlacementCheck\.CyclicJobAgainstBlockPlanSaysWhatAndHow$",
}

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL: {message}", flush=True)


def fenced(path):
    """(info string, [line, ...]) for every fenced block of a document,
    fences paired in order (an opening fence may carry a language)."""
    info, body = None, []
    for line in open(path, encoding="utf-8").read().splitlines():
        if info is None:
            m = re.match(r"^```(\S*)\s*$", line)
            if m:
                info, body = m.group(1), []
        elif line.startswith("```"):
            yield info, body
            info = None
        else:
            body.append(line)


def documents():
    return [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md")))


def blocks():
    """(document, [command, ...]) for every ```sh block, in order."""
    for path in documents():
        for info, body in fenced(path):
            if info not in ("sh", "bash"):
                continue
            commands, pending = [], ""
            for line in body:
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1].strip() + " "
                    continue
                line = pending + line.strip()
                pending = ""
                # A trailing comment explains; the command is before it.
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                if line and not line.startswith("#"):
                    commands.append(line)
            yield os.path.relpath(path, root), commands


def readme_python():
    """README's ```python block, the train.py its torchrun line launches,
    with one line that says which rank ran it."""
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    m = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
    if not m:
        fail("README.md has no ```python block for train.py")
        return ""
    return (m.group(1) + "import os\nprint(f'vemesh README python: rank "
            "{VESCALE_DEVICE_MESH.get_rank()} of {os.environ[\"WORLD_SIZE\"]}', "
            "flush=True)\n")


def transcripts():
    """(document, command, first output line, exit status) for every `$ `
    line of a plain ``` block."""
    for path in documents():
        for info, lines in fenced(path):
            if info != "":
                continue
            for i, line in enumerate(lines):
                if not line.startswith("$ "):
                    continue
                shown = lines[i + 1] if i + 1 < len(lines) else ""
                status = 0
                code = re.search(r"\(exit (\d+)\)\s*$", shown)
                if code:
                    status = int(code.group(1))
                    shown = shown[:code.start()].rstrip()
                yield os.path.relpath(path, root), line[2:].strip(), shown, status


def check_transcript(doc, command, shown, status, names, cwd):
    if command in TRANSCRIPT_FILES:
        pattern = TRANSCRIPT_FILES[command]
        if any(re.search(pattern, n) for n in names):
            print(f"ok (ctest {pattern}): {command}")
        else:
            fail(f"{doc}: `{command}` is proven by /{pattern}/, which names no ctest "
                 "entry of this build")
        return
    env = dict(os.environ)
    env["PATH"] = os.path.join(build, "tools") + ":" + env["PATH"]
    p = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=60)
    first = (p.stdout + p.stderr).splitlines()[:1]
    if p.returncode != status:
        fail(f"{doc}: `{command}` exited {p.returncode}, the document says {status}:\n"
             f"{(p.stdout + p.stderr)[-2000:]}")
    elif shown and shown != "..." and first != [shown]:
        fail(f"{doc}: `{command}` printed first {first!r}, the document shows "
             f"{shown!r}")
    else:
        print(f"ok (transcript, exit {status}): {command}")


def ctest_names():
    out = subprocess.run(["ctest", "-N"], cwd=build, capture_output=True, text=True,
                         timeout=120).stdout
    return re.findall(r"Test +#\d+: (\S+)", out)


def scratch_for(doc):
    d = tempfile.mkdtemp(prefix="vemesh_doc_")
    os.makedirs(os.path.join(d, "build"))
    os.symlink(build, os.path.join(d, "build", "release"))
    os.symlink(os.path.join(build, "examples", "first_program", "first_program"),
               os.path.join(d, "train"))
    with open(os.path.join(d, "train.py"), "w") as f:
        f.write(readme_python())
    return d


def run(command, cwd, pattern, expect_gpu_refusal=False, timeout=240):
    env = dict(os.environ)
    # The bare `train_nd` of USER_GUIDE's lines: found on PATH, as the guide
    # says (its build folder).
    env["PATH"] = os.path.join(build, "examples", "train_nd") + ":" + env["PATH"]
    p = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        fail(f"`{command}` did not end within {timeout} s:\n{out[-3000:]}")
        return
    if expect_gpu_refusal:
        if p.returncode == 0:
            print(f"ok (a GPU is here): {command}")
        elif re.search(r"CUDA|cuda|GPU", out) and p.returncode > 0:
            print(f"ok (refused without a GPU, exit {p.returncode}): {command}")
        else:
            fail(f"`{command}` without a GPU: exit {p.returncode}, output does not "
                 f"name CUDA or a GPU:\n{out[-3000:]}")
        return
    if p.returncode != 0:
        fail(f"`{command}` exited {p.returncode}:\n{out[-3000:]}")
    elif pattern and not re.search(pattern, out):
        fail(f"`{command}`: output lacks /{pattern}/:\n{out[-3000:]}")
    else:
        print(f"ok (ran): {command}", flush=True)


def main():
    names = ctest_names()
    presets = json.load(open(os.path.join(root, "CMakePresets.json")))
    configure = {p["name"] for p in presets["configurePresets"]}
    seen = set()
    counts = {}
    for doc, commands in blocks():
        scratch = None
        for command in commands:
            seen.add(command)
            if command not in CHECKS:
                fail(f"{doc}: `{command}` has no check in tests/docs/"
                     "doc_commands_test.py (add one: run, ctest, gpu or ci)")
                continue
            how, arg = CHECKS[command]
            counts[how] = counts.get(how, 0) + 1
            if how in ("run", "gpu"):
                scratch = scratch or scratch_for(doc)
                run(command, scratch, arg, expect_gpu_refusal=how == "gpu")
            elif how == "configure":
                preset = re.search(r"--preset (\w+)", command).group(1)
                out = tempfile.mkdtemp(prefix="vemesh_doc_preset_")
                p = subprocess.run(["cmake", "--preset", preset, "-B", out],
                                   cwd=root, capture_output=True, text=True,
                                   timeout=300)
                shutil.rmtree(out, ignore_errors=True)
                if p.returncode != 0:
                    fail(f"{doc}: `{command}`: `cmake --preset {preset}` failed:\n"
                         f"{(p.stdout + p.stderr)[-3000:]}")
                else:
                    print(f"ok (configured preset {preset}): {command}")
            elif how == "manual":
                print(f"not run ({arg}): {command}")
            elif how == "ctest":
                hits = [n for n in names if re.search(arg, n)]
                if not hits:
                    fail(f"{doc}: `{command}` is proven by /{arg}/, which names no "
                         "ctest entry of this build")
                else:
                    print(f"ok (ctest {hits[0]}{' ...' if len(hits) > 1 else ''}): "
                          f"{command}")
            else:  # ci, label
                for preset in re.findall(r"--preset (\w+)", command):
                    if preset not in configure:
                        fail(f"{doc}: `{command}` names preset '{preset}', which "
                             "CMakePresets.json lacks")
                label = re.search(r"-L (\w+)", command)
                if label:
                    listed = subprocess.run(["ctest", "-N", "-L", label.group(1)],
                                            cwd=build, capture_output=True,
                                            text=True, timeout=120).stdout
                    if not re.search(r"Total Tests: [1-9]", listed):
                        fail(f"{doc}: `{command}`: label '{label.group(1)}' "
                             "selects no test")
                print(f"ok (ci: {arg}): {command}")
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    scratch = scratch_for("transcripts")
    for doc, command, shown, status in transcripts():
        counts["transcript"] = counts.get("transcript", 0) + 1
        check_transcript(doc, command, shown, status, names, scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    for command in CHECKS:
        if command not in seen:
            fail(f"CHECKS lists `{command}`, which no document has any more")
    if failures:
        print(f"FAIL doc commands: {len(failures)} failure(s)")
        sys.exit(1)
    print(f"PASS doc commands: {len(seen)} commands, "
          + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))


main()
