# Temporary device check for the bundled suite (deleted after use).
import ast, glob, linecache, os, sys, time, types
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = os.path.join(HERE, "..", "tasks")
DEF = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
backend = sys.argv[2] if len(sys.argv) > 2 else "triton"
only = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else []
size_kinds = (sys.argv[4] if len(sys.argv) > 4 else "gpu,cpu").split(",")

def load(src, name, over):
    m = types.ModuleType(name); m.__file__ = f"<{name}>"; sys.modules[name] = m
    linecache.cache[m.__file__] = (len(src), None, src.splitlines(True), m.__file__)
    exec(compile(src, m.__file__, "exec"), m.__dict__)
    for k, v in over.items():
        assert k in m.__dict__, k
        m.__dict__[k] = v
    return m

def build(cls, task, seed):
    with torch.device(dev):
        torch.manual_seed(seed); init = list(task.get_init_inputs())
        torch.manual_seed(seed); model = cls(*init)
    return model.to(dev).eval()

def inputs(task, seed):
    with torch.device(dev):
        torch.manual_seed(seed); xs = list(task.get_inputs())
    return [x.to(dev) if isinstance(x, torch.Tensor) else x for x in xs]

def bench(fn, reps=20):
    if dev.type != "cuda":
        t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=5, rep=reps)

if os.environ.get("KR_NO_TF32") == "1":
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
print("torch", torch.__version__, "cuda", torch.version.cuda, flush=True)
if dev.type == "cuda":
    import triton
    print("triton", triton.__version__, torch.cuda.get_device_name(), "matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32,
          "cudnn.allow_tf32", torch.backends.cudnn.allow_tf32, flush=True)
npass = ntot = 0
for path in sorted(glob.glob(os.path.join(TASKS, "*.py"))):
    tid = os.path.basename(path)[:-3]
    if only and not any(tid.startswith(o) for o in only):
        continue
    sol = os.path.join(HERE, backend, tid + ".py")
    if not os.path.exists(sol):
        continue
    src = open(path).read()
    meta = [ast.literal_eval(n.value) for n in ast.parse(src).body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "KERNELRL"][0]
    for kind in size_kinds:
        over = meta["sizes"]["cpu"] if kind == "cpu" else {}
        try:
            t = load(src, f"t_{tid}_{kind}", over)
            s = load(open(sol).read(), f"s_{backend}_{tid}", {})
            ref_m = build(t.Model, t, 42); new_m = build(s.ModelNew, t, 42)
            ok = True; worst = 0.0; ratio = 0.0; worst64 = 0.0
            for seed in (7, 8):
                xs = inputs(t, seed)
                with torch.no_grad():
                    ref = ref_m(*xs); out = new_m(*xs)
                if dev.type == "cuda": torch.cuda.synchronize()
                atol, rtol = DEF.get(ref.dtype, (1e-4, 1e-4))
                atol = meta.get("atol", atol); rtol = meta.get("rtol", rtol)
                same = out.shape == ref.shape and out.dtype == ref.dtype
                good = same and bool(torch.isfinite(out.float()).all()) and torch.allclose(out, ref, atol=atol, rtol=rtol)
                ok &= good
                d = (out.double() - ref.double()).abs()
                worst = max(worst, d.max().item())
                ratio = max(ratio, (d / (atol + rtol * ref.double().abs())).max().item())
            tr = bench(lambda: ref_m(*xs)); ts = bench(lambda: new_m(*xs))
            ntot += 1; npass += ok
            print(f"{backend:6s} {kind:3s} {tid:28s} {'PASS' if ok else 'FAIL'} max|err|={worst:.2e} err/tol={ratio:.3f} "
                  f"ref={tr:.3f}ms sol={ts:.3f}ms dtype={ref.dtype} shape={tuple(ref.shape)}", flush=True)
        except Exception as e:
            ntot += 1
            print(f"{backend:6s} {kind:3s} {tid:28s} ERROR {type(e).__name__}: {str(e)[:600]}", flush=True)
print(f"SUMMARY {backend} {npass}/{ntot}", flush=True)
