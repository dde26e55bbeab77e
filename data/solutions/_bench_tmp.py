# Temporary: compare linear-kernel variants on the GPU (deleted after use).
import torch, triton, triton.language as tl
from triton.testing import do_bench

@triton.jit
def lin_a(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TRANS: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM); tiles_n = tl.cdiv(N, BN)
    band = pid // (GROUP_M * tiles_n); first_m = band * GROUP_M
    band_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % band_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // band_rows
    rows = pid_m * BM + tl.arange(0, BM); cols = pid_n * BN + tl.arange(0, BN); ks = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + ks
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        if TRANS:
            w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + k[None, :], mask=(cols[:, None] < N) & (k[None, :] < K), other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            w = tl.load(w_ptr + cols.to(tl.int64)[None, :] * K + k[:, None], mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc = tl.dot(x, w, acc, input_precision="ieee")
    acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0)[None, :]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))

M, K, N = 2048, 4096, 4096
x = torch.randn(M, K, device="cuda"); lin = torch.nn.Linear(K, N, device="cuda")
ref = lin(x).detach()
print("cublas", do_bench(lambda: lin(x)))
for (bm, bn, bk, nw, trans, g, ns) in [(64, 64, 32, 4, False, 1, 3), (64, 64, 32, 4, True, 1, 3), (64, 64, 32, 4, False, 8, 3),
                                        (128, 64, 32, 8, False, 8, 3), (128, 128, 32, 8, False, 8, 3), (128, 128, 16, 8, False, 8, 3),
                                        (64, 128, 32, 4, False, 8, 3), (128, 64, 16, 4, False, 8, 2), (64, 64, 16, 4, False, 8, 4)]:
    y = torch.empty(M, N, device="cuda")
    f = lambda: lin_a[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](x, lin.weight, lin.bias, y, M, N, K, BM=bm, BN=bn, BK=bk, TRANS=trans, GROUP_M=g, num_warps=nw, num_stages=ns)
    try:
        f(); torch.cuda.synchronize()
        print(bm, bn, bk, nw, trans, g, ns, "err", (y - ref).abs().max().item(), "ms", do_bench(f))
    except Exception as e:
        print(bm, bn, bk, nw, trans, g, ns, "ERR", str(e)[:200])
