"""`import vemesh` never fails for a launch problem (issue 41, item 7): the
variables are read again by the first init_device_mesh, which raises the
error naming them. Each case runs in a fresh interpreter (the launch is read
at import)."""
import os
import subprocess
import sys

import pytest

PROGRAM = """
import vemesh
print("imported", flush=True)
try:
    vemesh.init_device_mesh("cpu", (2,), timeout=5)
except Exception as e:
    print("raised", type(e).__name__, e, flush=True)
else:
    print("made a mesh", flush=True)
"""

LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
    "VEMESH_BOOTSTRAP", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK", "PMI_RANK")

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29533"}


def run(**variables):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(variables)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("variables, error", [
    (dict(TORCHRUN, RANK="x"), "ValueError env:// launch: RANK='x'"),
    (dict(TORCHRUN, MASTER_PORT="99999"), "MASTER_PORT='99999'"),
    (dict(TORCHRUN, TORCHELASTIC_USE_AGENT_STORE="True"),
     "TORCHELASTIC_USE_AGENT_STORE=True"),
    ({"VEMESH_BOOTSTRAP": "carrier-pigeon"},
     "ValueError VEMESH_BOOTSTRAP='carrier-pigeon'"),
])
def test_import_succeeds_and_init_device_mesh_reports(variables, error):
    code, text = run(**variables)
    assert code == 0, text
    assert "imported" in text, text
    assert "raised" in text and error in text, text
