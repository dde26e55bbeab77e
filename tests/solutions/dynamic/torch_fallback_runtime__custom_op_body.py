# Hack: torch compute inside the body of the solution's own custom op, registered in __init__
# (where construction is exempt from the static forward path) and reached through self.op; the
# kernel launched only touches the output. The body runs under the audit like forward does.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

        def body(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x)

        self.op = torch.library.custom_op("rt_dyn::relu", mutates_args=())(body)

    def forward(self, x):
        out = self.op(x)
        touch_kernel[(1,)](out, 1, BLOCK=16)
        return out
