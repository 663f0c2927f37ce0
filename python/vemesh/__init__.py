"""vemesh: one named N-D device mesh per process.

veScale's ``VESCALE_DEVICE_MESH`` and PyTorch's ``DeviceMesh`` with MPI, Gloo
and NCCL communicators on numpy arrays and DLPack tensors. The compiled part
is ``vemesh._C``; everything it defines is re-exported here, so
``vemesh.init_device_mesh`` and ``vemesh.VESCALE_DEVICE_MESH`` read as in the
README; ``vemesh.checkpoint`` saves and loads sharded state dicts; ``vemesh.elastic``
is the elastic mesh's training loop (a replicate dimension that shrinks and grows).
``vemesh.torch`` (imported on its own, it needs torch) trains
``torch.nn.Module``s on vemesh groups.
"""

from . import _C
from ._C import *  # noqa: F401,F403  (the compiled module's public names)
from ._C import _cpp_all_reduce_loop  # noqa: F401  (bench/python_overhead.py)
from . import checkpoint  # noqa: F401,E402  (vemesh.checkpoint.save / load)
from . import elastic  # noqa: F401,E402  (VESCALE_DEVICE_MESH.elastic(), the loop)

__doc__ = _C.__doc__
