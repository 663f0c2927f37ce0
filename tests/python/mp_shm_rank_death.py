"""A rank that dies while its same-host group waits on shared memory
(issue 46): every survivor's all_reduce fails naming the dead rank within
seconds, not at the group's timeout, as it did when a reset TCP connection
told them.

  run_mp.sh torchrun 120 4 python3 mp_shm_rank_death.py [p2p|large]

The last rank exits (os._exit: no destructor runs, nothing leaves the group
politely; exit code 0 so that torchrun lets the others finish) while the
others are inside an all_reduce of 16 float32, which rides on the group's
shared memory. With `p2p`, the survivors wait in a receive from the last
rank instead, which rides on the group's shared-memory pairs. With
`large`, every rank runs an all_reduce of 32 MiB (the segment's chunked
rounds, hundreds of them) and the last rank exits a few milliseconds into
its own: mid-operation. Each
survivor checks the error and the time it took and
exits 0; any other outcome exits 1 and fails the launch.
"""
import os
import sys
import threading
import time

import numpy as np

import vemesh

p2p = sys.argv[1:] == ["p2p"]
large = sys.argv[1:] == ["large"]
world = int(os.environ["WORLD_SIZE"])
# Names this process's segments would have. One may be there already: a
# process killed while its group set up shared memory leaves its segment,
# and pids are reused (pid_max is 32768 here), so only new ones count.
prefix = f"vemesh-{os.getpid()}-"
stale = {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
mesh = vemesh.init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
g = mesh.get_group()
g.set_timeout(120)  # far above the bound checked below
me = g.rank()
data = np.ones(16, np.float32)
for _ in range(20):  # the group is set up (on shared memory) and in step
    g.all_reduce(data)
    data[:] = 1
if me == 0:  # rank 0 named the segment after its pid, and unlinked it
    mine = [n for n in os.listdir("/dev/shm")
            if n.startswith(prefix) and n not in stale]
    assert not mine, f"segment names left in /dev/shm: {mine}"
if large:
    data = np.ones(8 << 20, np.float32)
if me == world - 1:
    if large:  # dies inside its own all_reduce (the binding frees the GIL)
        threading.Thread(target=g.all_reduce, args=(data,), daemon=True).start()
        time.sleep(0.003)
    else:
        time.sleep(0.5)  # the others are waiting for this rank
    os._exit(0)
start = time.monotonic()
try:
    if p2p:
        g.recv(data, world - 1)
    else:
        g.all_reduce(data)
except Exception as e:  # noqa: BLE001 - any vemesh error type
    took = time.monotonic() - start
    text = str(e)
    ok = f"rank {world - 1}" in text and took < 10
    if p2p or large:  # seen by the segment's liveness check, not TCP's reset
        ok = ok and "(shared memory)" in text and "of the group exited" in text
    print(f"rank {me}: failed after {took:.2f} s: {text}", flush=True)
    sys.exit(0 if ok else 1)
print(f"rank {me}: the {'recv' if p2p else 'all_reduce'} with a dead rank "
      "returned", flush=True)
sys.exit(1)
