# Hack: CUDA C++ that a CPU machine cannot run, called after torch has computed the answer. The
# CPU cannot judge the extension, but it runs the forward under the audit up to that call: the
# torch compute before it is a violation, not not_run.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

torch::Tensor identity(torch::Tensor x) {
    return x;
}
"""

module = load_inline(
    name="identity_ext",
    cpp_sources="torch::Tensor identity(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["identity"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return module.identity(y)
