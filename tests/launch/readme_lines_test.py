#!/usr/bin/env python3
"""The launch lines of README.md and docs/USER_GUIDE.md, run as written.

    readme_lines_test.py SCENARIO REPO_ROOT FIRST_PROGRAM TRAIN_ND

Each scenario reads its command from the documents (so the test fails when
they drift), puts the built program where they say ./train or
build/release/..., runs it bounded in time, and checks what happened:

  torchrun_no_orted   README's `torchrun ... ./train` with examples/first_program
                      (whose code the guide's start-up snippet must hold):
                      every rank answers, none started MPI, and no process of
                      this job's tree (walked from the torchrun PID) is an
                      orted / prted
  torchrun_main_job   README's `# = torchrun ... train_nd --mesh PP=2,DP=2,TP=2`
  mpirun              USER_GUIDE's `mpirun -n 8 ./train`: every rank, MPI started
  init_timeout        VEMESH_INIT_TIMEOUT=3, one of two env:// ranks missing:
                      DeadlineExceeded within 3..15 s
  init_timeout_bad    VEMESH_INIT_TIMEOUT=abc: refused at once, naming it
  elastic             README's elastic block: Redis, three replicas, a kill of
                      one replica's mpirun by the PID the loop printed, the
                      relaunch line; DP goes 3 -> 2 -> 3 and every survivor
                      passes

Every process started here is ended by its PID (its process group), also on
failure. Prints "PASS [scenario]" on success.
"""
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

scenario, root, first_program, train_nd = sys.argv[1:5]
started = []  # Popen objects, each the leader of its own process group


def fail(message):
    print(f"FAIL [{scenario}]: {message}")
    sys.exit(1)


def end_all():
    for p in started:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def launch(command, cwd, env=None, **kw):
    p = subprocess.Popen(command, cwd=cwd, env=env, shell=isinstance(command, str),
                         executable="/bin/bash" if isinstance(command, str) else None,
                         start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, **kw)
    started.append(p)
    return p


def children(pid):
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out = [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree(pid):
    """PIDs and names of `pid` and every descendant, now."""
    seen, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/comm") as f:
                seen[p] = f.read().strip()
        except OSError:
            continue
        todo.extend(children(p))
    return seen


def readme():
    with open(os.path.join(root, "README.md")) as f:
        return f.read()


def base_env():
    env = dict(os.environ)
    for v in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "PMI_RANK", "RANK",
              "WORLD_SIZE", "VEMESH_INIT_TIMEOUT"):
        env.pop(v, None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def wait_bounded(p, limit, what):
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        end_all()
        fail(f"{what} still running after {limit} s")
    return out


def torchrun_line(text, program):
    """The first `torchrun ...` command of the text, program substituted."""
    m = re.search(r"torchrun --no_python --standalone [^`\n]*?\./train", text)
    if not m:
        fail("README.md has no `torchrun --no_python --standalone ... ./train` line")
    return m.group(0).replace("./train", program)


def run_first_program_under(command, expect_mpi, count, watch_tree=False):
    with tempfile.TemporaryDirectory() as work:
        p = launch(command, work, env=base_env())
        names = {}
        deadline = time.time() + 150
        while p.poll() is None and time.time() < deadline:
            if watch_tree:
                names.update(tree(p.pid))
            time.sleep(0.05)
        out = wait_bounded(p, max(1, deadline - time.time()), command)
    if p.returncode != 0:
        fail(f"`{command}` exited {p.returncode}:\n{out[-3000:]}")
    lines = re.findall(r"rank (\d+) of (\d+): .* MPI started: (yes|no)", out)
    if sorted(int(r) for r, _, _ in lines) != list(range(count)):
        fail(f"expected one line from each of {count} ranks:\n{out[-3000:]}")
    if any(m != ("yes" if expect_mpi else "no") for _, _, m in lines):
        fail(f"MPI started should be {'yes' if expect_mpi else 'no'}:\n{out[-3000:]}")
    if watch_tree:
        daemons = sorted({n for n in names.values() if n in ("orted", "prted", "prte")})
        if daemons:
            fail(f"this job started {daemons} (an MPI singleton): {names}")
        if len(names) < count + 1:
            fail(f"the process tree was not seen ({len(names)} processes: {names})")
    return out


def check_guide_is_the_program():
    """The guide's start-up snippet is examples/first_program's code."""
    with open(os.path.join(root, "docs", "USER_GUIDE.md")) as f:
        guide = re.search(r"```cpp\n(.*?)```", f.read(), re.S).group(1)
    with open(os.path.join(root, "examples", "first_program", "main.cc")) as f:
        program = f.read()
    body = program[program.index("section 1 begins"):program.index("section 1 ends")]
    flat = lambda t: " ".join(t.split())
    for line in body.splitlines()[1:-1]:
        if line.strip() and flat(line) not in flat(guide):
            fail(f"docs/USER_GUIDE.md's start-up snippet lacks `{line.strip()}` "
                 "(examples/first_program/main.cc)")


if scenario == "torchrun_no_orted":
    check_guide_is_the_program()
    command = torchrun_line(readme(), first_program)
    run_first_program_under(command, expect_mpi=False, count=8, watch_tree=True)

elif scenario == "torchrun_main_job":
    m = re.search(r"^# = (torchrun .*train_nd.*)$", readme(), re.M)
    if not m:
        fail("README.md has no `# = torchrun ... train_nd` line")
    command = m.group(1).replace("build/release/examples/train_nd/train_nd", train_nd)
    with tempfile.TemporaryDirectory() as work:
        p = launch(command, work, env=base_env())
        out = wait_bounded(p, 170, command)
    if p.returncode != 0 or "PASS: loss curve" not in out:
        fail(f"`{command}` exited {p.returncode}:\n{out[-3000:]}")

elif scenario == "mpirun":
    with open(os.path.join(root, "docs", "USER_GUIDE.md")) as f:
        m = re.search(r"^(mpirun -n 8 \./train)\b", f.read(), re.M)
    if not m:
        fail("docs/USER_GUIDE.md has no `mpirun -n 8 ./train` line")
    run_first_program_under(m.group(1).replace("./train", first_program),
                            expect_mpi=True, count=8)

elif scenario in ("init_timeout", "init_timeout_bad"):
    env = base_env()
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    env.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port.getsockname()[1]))
    port.close()
    env["VEMESH_INIT_TIMEOUT"] = "3" if scenario == "init_timeout" else "abc"
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        p = launch([first_program], work, env=env)
        out = wait_bounded(p, 60, "rank 0 alone")
    took = time.time() - t0
    if p.returncode == 0:
        fail(f"rank 0 alone succeeded:\n{out}")
    if scenario == "init_timeout":
        if "DEADLINE_EXCEEDED" not in out or "never arrived" not in out:
            fail(f"expected DeadlineExceeded naming the missing rank:\n{out}")
        if not 2.5 <= took <= 15:
            fail(f"took {took:.1f} s with VEMESH_INIT_TIMEOUT=3 (expected 3..15)")
    else:
        if "VEMESH_INIT_TIMEOUT='abc': expected a positive number of seconds" not in out:
            fail(f"expected the variable named:\n{out}")
        if took > 5:
            fail(f"a bad VEMESH_INIT_TIMEOUT took {took:.1f} s to refuse")

elif scenario == "elastic":
    text = readme()
    section = text[text.index("## Losing a replica"):text.index("## Planning a job")]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    if len(blocks) != 2:
        fail(f"expected two sh blocks in the elastic section, found {len(blocks)}")
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = str(port.getsockname()[1])
    port.close()

    def adapt(block):
        return (block.replace("build/release/examples/train_nd/train_nd", train_nd)
                .replace("6379", free))

    start, relaunch = adapt(blocks[0]), adapt(blocks[1])
    # The relaunch is typed in the same shell: it sees the block's variables.
    relaunch = "\n".join(l for l in start.splitlines()
                         if re.match(r"^[A-Za-z_]+=", l)) + "\n" + relaunch
    env = base_env()
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    with tempfile.TemporaryDirectory() as work:
        log = lambda k: open(os.path.join(work, k)).read() if os.path.exists(
            os.path.join(work, k)) else ""

        def wait_for(files, regex, limit):
            deadline = time.time() + limit
            while time.time() < deadline:
                if all(re.search(regex, log(f), re.M) for f in files):
                    return
                time.sleep(0.2)
            fail(f"{files} never printed /{regex}/ within {limit} s:\n" +
                 "\n".join(f"--- {f}\n{log(f)[-1500:]}" for f in files))

        # The README's start block, then its lines' background jobs kept: the
        # shell waits for them, so it lives as long as the job does.
        shell = launch(start + "\nwait\n", work, env=env)
        pids = {}
        deadline = time.time() + 30
        while len(pids) < 3 and time.time() < deadline:
            line = shell.stdout.readline()
            m = re.match(r"replica (\d): kill (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
        if len(pids) != 3:
            end_all()
            fail(f"the loop did not print three `replica K: kill PID` lines: {pids}")
        try:
            replicas = ["replica0.log", "replica1.log", "replica2.log"]
            wait_for(replicas, r"^membership: epoch 1, DP=3", 60)
            time.sleep(1)
            victim = pids[1]
            os.kill(victim, signal.SIGTERM)  # the README's `kill PID`
            wait_for(["replica0.log", "replica2.log"],
                     r"^membership: epoch 2, DP=2", 40)
            launch(relaunch + "\nwait\n", work, env=env)
            wait_for(["replica0.log", "replica2.log", "replica1b.log"],
                     r"^membership: epoch 3, DP=3", 60)
            # Redis runs on after the replicas end (as the README leaves it):
            # the replicas' PASS lines say the job is done.
            wait_for(["replica0.log", "replica2.log", "replica1b.log"],
                     r"^PASS: replica .*identical across DP=3", 150)
            if re.search(r"^PASS", log("replica1.log"), re.M):
                fail("the killed replica printed PASS")
        finally:
            end_all()
else:
    fail(f"unknown scenario (expected one of torchrun_no_orted torchrun_main_job "
         f"mpirun init_timeout init_timeout_bad elastic)")

end_all()
print(f"PASS [{scenario}]")
