"""Reports what of the host it can reach, through its error message: whether it connects to
Unix socket files planted on the host, reads files there, or writes anywhere (a file named
after the marker, left for the test to look for); and every mount of its view with whether it
is writable. The test replaces TARGETS with the paths to try."""

import json
import os
import socket
import stat

import torch.nn as nn

TARGETS = {"sockets": [], "read": [], "write": [], "marker": "kernelrl-probe-written"}


def connect(path):
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(2)
    try:
        client.connect(path)
        return "connected"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        client.close()


def read(path):
    try:
        with open(path) as f:
            return "read: " + f.read(64)
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def write(folder):
    try:
        with open(os.path.join(folder, TARGETS["marker"]), "w") as f:
            f.write("x")
        return "ok"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def writable_mounts():
    """[point, root, fstype, is a character device] of every mount it may write."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if "rw" not in fields[5].split(","):
                continue
            point = fields[4].replace("\\040", " ")
            try:
                char_device = stat.S_ISCHR(os.stat(point).st_mode)
            except OSError:
                char_device = False
            found.append([point, fields[3], fields[fields.index("-") + 1], char_device])
    return found


class ModelNew(nn.Module):
    def forward(self, x):
        top = sorted(os.listdir("/"))
        seen = {
            "uid": os.geteuid(),
            "cwd": os.getcwd(),
            "top": top,
            "sockets": [connect(path) for path in TARGETS["sockets"]],
            "read": [read(path) for path in TARGETS["read"]],
            "wrote": [p for p in TARGETS["write"] + ["/" + t for t in top] if write(p) == "ok"],
            "mounts": writable_mounts(),
        }
        raise RuntimeError("PROBE" + json.dumps(seen) + "PROBE")
