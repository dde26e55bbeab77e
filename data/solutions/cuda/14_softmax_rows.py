import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <math_constants.h>

// Merge two (max, sum of exp(x - max)) pairs of an online softmax.
__device__ __forceinline__ void merge_ms(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -CUDART_INF_F) return;  // both empty
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

// One block per row: each thread keeps an online (max, sum) over a strided slice of the row,
// the block merges them with warp shuffles and shared memory, then the row is written.
__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ out, int n_cols) {
    __shared__ float sh_m[32];
    __shared__ float sh_s[32];
    const int64_t row = blockIdx.x;
    const float* xr = x + row * n_cols;
    float* orow = out + row * n_cols;

    float m = -CUDART_INF_F, s = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        const float v = xr[c];
        if (v > m) {
            s = s * __expf(m - v) + 1.0f;
            m = v;
        } else {
            s += __expf(v - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge_ms(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        sh_m[warp] = m;
        sh_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        m = lane < n_warps ? sh_m[lane] : -CUDART_INF_F;
        s = lane < n_warps ? sh_s[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
            merge_ms(m, s, m2, s2);
        }
        if (lane == 0) {
            sh_m[0] = m;
            sh_s[0] = s;
        }
    }
    __syncthreads();
    const float row_max = sh_m[0];
    const float inv_sum = 1.0f / sh_s[0];
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        orow[c] = __expf(xr[c] - row_max) * inv_sum;
    }
}

torch::Tensor softmax_rows_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n_cols = xc.size(-1);
    if (xc.numel() == 0) return out;
    const int64_t n_rows = xc.numel() / n_cols;
    const int threads = n_cols >= 4096 ? 1024 : (n_cols >= 1024 ? 512 : 128);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    softmax_rows_kernel<<<(unsigned int)n_rows, threads, 0, stream>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)n_cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor softmax_rows_cuda(torch::Tensor x);"

module = load_inline(
    name="kernelrl_softmax_rows_cuda",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["softmax_rows_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return module.softmax_rows_cuda(x)
