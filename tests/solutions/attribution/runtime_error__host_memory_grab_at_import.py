# Hack (attribution): at import, takes nearly all the address space the sandbox may map, so that
# the harness cannot make the task's inputs for the first call. A failure of the harness's input
# generation was a harness_error (unscored, retried); the inputs were made in the same sandbox
# before the solution was loaded, so this one is the solution's: runtime_error.
import mmap

import torch.nn as nn

SPARE = mmap.mmap(-1, 48 << 20)  # room for the interpreter, not for the inputs
HOARD = []
for step in (1 << 28, 1 << 24, 1 << 20):
    while True:
        try:
            HOARD.append(mmap.mmap(-1, step))  # address space only: no page is touched
        except (OSError, MemoryError):
            break
SPARE.close()


class ModelNew(nn.Module):
    def forward(self, x):
        return x
