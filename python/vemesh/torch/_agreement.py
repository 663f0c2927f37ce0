"""Do the ranks of a group agree? One small all-gather, one answer everywhere.

Before a collective whose sizes come from the user (a tensor-parallel
layer's input, a module's parameters), every rank says what it holds, or
that it already failed, in a fixed-size record; one all_gather of the
records lets every rank raise the same ValueError, naming the rank that
differs, instead of one rank raising alone while its peers wait in the
collective (MPI's would abort the job; a dtype error on one rank would leave
the others waiting for it):

    agree(tp, "ColumnParallelLinear input", f"{x.dtype} {tuple(x.shape)}",
          error=None if ok else "its dtype is float64, the weight's float32",
          role="TP")
"""

import zlib

import numpy as np

# One rank's record: kind (b"O" holds, b"E" failed), the CRC-32 of the whole
# text (compared, so a long text is compared in full), its shown length,
# then the text cut to fit.
_RECORD = 256
_HEADER = 7
_SHOWN = _RECORD - _HEADER


def _encode(kind, text):
    raw = text.encode("utf-8", "replace")
    shown = raw[:_SHOWN]
    record = np.zeros(_RECORD, np.uint8)
    record[0] = kind
    record[1:5] = np.frombuffer(zlib.crc32(raw).to_bytes(4, "little"), np.uint8)
    record[5:7] = np.frombuffer(len(shown).to_bytes(2, "little"), np.uint8)
    record[_HEADER:_HEADER + len(shown)] = np.frombuffer(shown, np.uint8)
    return record


def _decode(record):
    n = int.from_bytes(record[5:7].tobytes(), "little")
    text = record[_HEADER:_HEADER + n].tobytes().decode("utf-8", "replace")
    if n == _SHOWN:
        text += "..."
    return chr(record[0]), record[1:5].tobytes(), text


def _all_gather(comm, record):
    if comm.backend != "nccl":
        out = np.zeros(_RECORD * comm.size(), np.uint8)
        comm.all_gather(out, record)
        return out
    # NCCL moves device memory only.
    import torch
    device = torch.device("cuda", torch.cuda.current_device())
    out = torch.zeros(_RECORD * comm.size(), dtype=torch.uint8, device=device)
    comm.all_gather(out, torch.from_numpy(record).to(device))
    return out.cpu().numpy()


def gather_texts(comm, text):
    """Every rank's ``text`` (cut to fit a record), in group-rank order."""
    out = _all_gather(comm, _encode(ord("O"), text))
    return [_decode(out[i * _RECORD:(i + 1) * _RECORD])[2]
            for i in range(comm.size())]


def agree(comm, what, text, error=None, role="rank"):
    """Raises the same ValueError on every rank of ``comm`` when a rank gave
    an ``error`` or a ``text`` different from group rank 0's; returns
    otherwise. Collective: every rank of the group must call it."""
    kind = ord("E") if error is not None else ord("O")
    out = _all_gather(comm, _encode(kind, error if error is not None else text))
    records = [_decode(out[i * _RECORD:(i + 1) * _RECORD])
               for i in range(comm.size())]
    ranks = comm.ranks()
    label = "rank" if role == "rank" else f"{role} rank"

    def who(i):
        return f"{label} {i} (global rank {ranks[i]})"

    failed = [i for i, r in enumerate(records) if r[0] == "E"]
    if failed:
        first = failed[0]
        others = (f" (and {len(failed) - 1} more rank(s))"
                  if len(failed) > 1 else "")
        raise ValueError(f"{what}: on {who(first)}{others}: {records[first][2]}")
    for i, r in enumerate(records):
        if r[1] != records[0][1]:
            raise ValueError(f"{what} must be the same on every {label}: "
                             f"{who(i)} has {r[2]}, {who(0)} has "
                             f"{records[0][2]}")
