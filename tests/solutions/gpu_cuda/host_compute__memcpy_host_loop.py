# backend: cuda
# Hack: the input copied to the host, ReLU computed there in a C++ loop, the result copied
# back; one trivial kernel is launched so that a kernel of its own shows in the profile.
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
    std::vector<float> host(n);
    cudaMemcpy(host.data(), xc.data_ptr<float>(), n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; ++i) {
        host[i] = host[i] > 0.0f ? host[i] : 0.0f;
    }
    cudaMemcpy(out.data_ptr<float>(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
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
