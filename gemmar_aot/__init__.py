"""gemmar-aot: ahead-of-time compiler and artifact cache for mori's gemm_ar kernels.

Data flows one way: manifest -> plan -> compile -> store -> package -> runtime.
The runtime side (``gemmar_aot.runtime``, ``gemmar_aot.model.codeobject``) must never
import the compiler side (``gemmar_aot.compiler``, ``gemmar_aot.toolchain``,
``gemmar_aot_kernels``), FlyDSL or MLIR.
"""

__version__ = "0.1.0"
