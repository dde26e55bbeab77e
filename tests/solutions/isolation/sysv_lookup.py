"""Looks for the SysV IPC objects another evaluation left under KEY; reports, through its
error message, the id found or the errno of the failed lookup. The test replaces KEY."""

import ctypes
import json

import torch.nn as nn

KEY = 0x6B726C00

libc = ctypes.CDLL(None, use_errno=True)


class ModelNew(nn.Module):
    def forward(self, x):
        found = {}
        for kind, lookup in (
            ("shm", lambda: libc.shmget(KEY, 0, 0)),
            ("sem", lambda: libc.semget(KEY, 0, 0)),
            ("msg", lambda: libc.msgget(KEY, 0)),
        ):
            ident = lookup()
            found[kind] = ident if ident >= 0 else -ctypes.get_errno()
        raise RuntimeError("PROBE" + json.dumps(found) + "PROBE")
