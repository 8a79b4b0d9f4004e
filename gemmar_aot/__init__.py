"""gemmar-aot: ahead-of-time compiler and artifact cache for every kernel AMD's mori compiles at run time.

mori's FlyDSL ops -- the GEMM + all-reduce (``mori.ops.gemm_ar``) and EP dispatch/combine v2's
FlyDSL backend -- on gfx950 (MI355X); mori's hipcc-JIT kernels (EP v1, collectives, shmem, IO) and
its JIT v2 kernels (EP v2's HIP backend, multi-node included) on gfx950 and gfx942 (MI355X,
MI300X). Built on a CPU-only host, served to pods that carry no compiler.

Data flows one way: manifest -> plan -> compile -> store -> package -> runtime.
The runtime side (``gemmar_aot.runtime``, ``gemmar_aot.model.codeobject``) must never
import the compiler side (``gemmar_aot.compiler``, ``gemmar_aot.toolchain``,
``gemmar_aot_kernels``), FlyDSL or MLIR.
"""

__version__ = "0.1.0"
