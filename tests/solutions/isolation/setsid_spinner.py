"""On its first forward call, starts a process that leaves the sandbox's session and process
group (fork, setsid, fork, setsid), tries to leave its cgroup (into the hierarchy's root) and
counts forever, 100 times a second, into the file ``counter`` of the scratch directory, as
``python -c ... MARKER``. Its outputs are correct. The test replaces MARKER with a string of
its own, to find the process on the host."""

import os
import sys

import torch
import torch.nn as nn

MARKER = "kernelrl-spinner-marker"

COUNT = """
import os, sys, time
for line in open("/proc/self/mountinfo"):
    if " - cgroup2 " in line:
        try:
            with open(line.split()[4] + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
n = 0
while True:
    n += 1
    with open("counter.tmp", "w") as f:
        f.write(str(n))
    os.replace("counter.tmp", "counter")
    time.sleep(0.01)
"""

STARTED = False


def start_counter():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-c", COUNT, MARKER])
        os._exit(0)
    os.waitpid(pid, 0)


class ModelNew(nn.Module):
    def forward(self, x):
        global STARTED
        if not STARTED:
            STARTED = True
            start_counter()
        return torch.relu(x)
