"""Leaves SysV IPC objects behind: a shared memory segment (attached and written), a semaphore
set and a message queue (with a message in it), all under one key, none removed. Reports what
it made through its error message. The test replaces KEY with a key of its own."""

import ctypes
import json

import torch.nn as nn

KEY = 0x6B726C00
IPC_CREAT = 0o1000

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p


class ModelNew(nn.Module):
    def forward(self, x):
        made = {}
        shmid = libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
        made["shm"] = shmid if shmid >= 0 else -ctypes.get_errno()
        if shmid >= 0:
            address = libc.shmat(shmid, None, 0)
            ctypes.memmove(address, b"left behind", 11)
        semid = libc.semget(KEY, 1, IPC_CREAT | 0o666)
        made["sem"] = semid if semid >= 0 else -ctypes.get_errno()
        msqid = libc.msgget(KEY, IPC_CREAT | 0o666)
        made["msg"] = msqid if msqid >= 0 else -ctypes.get_errno()
        if msqid >= 0:
            message = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 16)
            ctypes.c_long.from_buffer(message).value = 1
            libc.msgsnd(msqid, message, 16, 0)
        raise RuntimeError("PROBE" + json.dumps(made) + "PROBE")
