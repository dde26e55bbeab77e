"""What a solution may not reach: the deny-lists of the static checks, as data.

Modules, APIs, builtins and attributes that give a solution threads, processes, raw memory, I/O,
timers, introspection, another compiler or a side stream. Torch *compute* is not listed here: it
is judged by the allow-list in ``vocabulary`` (anything not glue is compute).
"""

from __future__ import annotations

import re

OTHER_COMPILER_PREFIXES = (
    "torch.compile",
    "torch.jit",
    "torch._dynamo",
    "torch._inductor",
    "torch.export",
    "torch.fx",
    "torch.cuda.jiterator",
    "torch._C._jit",
)
OTHER_COMPILER_MODULES = frozenset(
    [
        "numba",
        "cupy",
        "jax",
        "jaxlib",
        "tvm",
        "tensorflow",
        "pycuda",
        "taichi",
        "tilelang",
        "tensorrt",
        "torch_tensorrt",
        "onnxruntime",
        "iree",
        "hidet",
        "cuda",
        "cutlass",
        "thunder",
        "mlir",
        "nvrtc",
    ]
)
FORBIDDEN_MODULES = frozenset(
    [
        "threading",
        "_thread",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "ctypes",
        "cffi",
        "socket",
        "ssl",
        "http",
        "urllib",
        "urllib3",
        "requests",
        "httpx",
        "aiohttp",
        "ftplib",
        "smtplib",
        "asyncio",
        "signal",
        "gc",
        "inspect",
        "sys",
        "shutil",
        "tempfile",
        "pickle",
        "dill",
        "cloudpickle",
        "marshal",
        "shelve",
        "importlib",
        "builtins",
        "time",
        "timeit",
        "resource",
        "mmap",
        "faulthandler",
        "atexit",
        "traceback",
        "pty",
        "select",
        "selectors",
        "sqlite3",
        "kernelrl",
        "pathlib",
        "glob",
        "fcntl",
        "psutil",
        "code",
        "pdb",
        "runpy",
        "io",
        "posix",
        "types",
        "weakref",
        "tracemalloc",
        "linecache",
        "dis",
        "site",
        "sysconfig",
        "pkgutil",
        "zipimport",
        "imp",
        "_ctypes",
        "_posixsubprocess",
        "nt",
        "copyreg",
    ]
)
# Module names that are forbidden when reached as an attribute of another module (torch and
# numpy re-export ``os``, ``sys``, ``ctypes``...; ``torch._C`` and triton's driver reach raw
# CUDA and the process).
REEXPORTED_FORBIDDEN = FORBIDDEN_MODULES | {"os", "ctypeslib", "_C", "driver"}
FORBIDDEN_TORCH_APIS = (
    "torch.profiler",
    "torch.autograd.profiler",
    "torch.cuda.profiler",
    "torch._C",
    "torch.multiprocessing",
    "torch.save",
    "torch.load",
    "torch.hub",
    "torch.utils.data",
    "numpy.save",
    "numpy.load",
    "numpy.fromfile",
)
OS_ALLOWED = frozenset({"os.environ", "os.getenv"})
FORBIDDEN_BUILTINS = frozenset(
    [
        "open",
        "exec",
        "eval",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "exit",
        "quit",
    ]
)
# Dunder attributes a solution may touch; every other dunder is introspection.
ALLOWED_DUNDERS = frozenset(
    ["__init__", "__name__", "__qualname__", "__doc__", "__class__", "__call__", "__len__"]
    + ["__enter__", "__exit__", "__version__", "__module__"]
)
INTROSPECTION_ATTRIBUTES = frozenset(
    [
        "f_builtins",
        "f_trace",
        "f_lasti",
        "tb_next",
        "tb_lasti",
        "gi_code",
        "gi_yieldfrom",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "co_consts",
        "co_names",
        "co_code",
        "__traceback__",
        "__dict__",
        "__globals__",
        "__code__",
        "__closure__",
        "__subclasses__",
        "__bases__",
        "__mro__",
        "__builtins__",
        "__getattribute__",
        "__loader__",
        "__spec__",
        "f_back",
        "f_globals",
        "f_locals",
        "f_code",
        "gi_frame",
        "cr_frame",
        "tb_frame",
        "__self__",
        "__func__",
        "__wrapped__",
    ]
)
NAME_TAKING_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
DYNAMIC_LOOKUP_CALLS = frozenset({"operator.attrgetter", "operator.methodcaller"})
SIDE_STREAM_CALLS = frozenset(
    {
        "torch.cuda.Stream",
        "torch.cuda.stream",
        "torch.cuda.set_stream",
        "torch.cuda.ExternalStream",
        "torch.cuda.StreamContext",
        "torch.cuda.streams.Stream",
        "torch.Stream",
        "torch.cuda.Stream.wait_stream",
    }
)
SIDE_STREAM_CUDA = re.compile(
    r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|getStreamFromPool|cudaStreamPerThread"
    r"|cudaStreamNonBlocking|setCurrentCUDAStream)\b"
)
DISPATCH_HOOKS = frozenset({"__torch_function__", "__torch_dispatch__"})
DISPATCH_MODULES = ("torch.overrides", "torch.utils._python_dispatch", "torch._subclasses")
MEMO_DECORATORS = frozenset({"functools.cache", "functools.lru_cache", "functools.cached_property"})

# Host code reaching device data, in a CUDA C++ source: the work copied to the host and done
# there, out of every kernel's and profile's view. Copies whose direction reads the device from
# the host (or is left to the runtime: ``cudaMemcpyDefault``), memory the host and the GPU
# share (pinned, mapped, managed), CPU tensors and their accessors, and names looked up at run
# time or pasted together (``dlsym``, ``##``), which hide which of these is called.
HOST_ACCESS_CUDA = re.compile(
    r"\b(\w*(?:DeviceToHost|DtoH|AtoH|ToHost)\w*|cudaMemcpyDefault|cudaMemcpy\w*FromSymbol\w*"
    r"|cudaMemcpy\w*FromArray\w*|cuMemcpy(?:Async)?|cuMemcpy[23]D\w*|cudaMemcpy3D\w*"
    r"|cudaMallocHost|cudaHostAlloc|cudaHostRegister|cudaHostGetDevicePointer|cudaMallocManaged"
    r"|cuMemHostAlloc|cuMemAllocHost\w*|cuMemAllocManaged|cuMemHostRegister\w*"
    r"|cuMemHostGetDevicePointer\w*|__managed__|cudaMemPrefetchAsync|cudaMemAdvise\w*"
    r"|host_vector|pinned_memory|pin_memory|kCPU|accessor|dlsym|dlopen"
    r"|cudaGetDriverEntryPoint\w*|cuGetProcAddress\w*)\b"
    r'|\.\s*cpu\s*\(|DeviceType\s*::\s*CPU\b|"cpu(?::\d+)?"|##'
)
# A memory copy's runtime call: its direction must be named in the call (``cudaMemcpyHostToDevice``
# or ``cudaMemcpyDeviceToDevice``), not passed as a number or a variable.
CUDA_COPY_CALL = re.compile(r"\b(cudaMemcpy(?:Async|2D|2DAsync)?)\s*\(")
CUDA_COPY_DIRECTIONS = ("HostToDevice", "DeviceToDevice")
