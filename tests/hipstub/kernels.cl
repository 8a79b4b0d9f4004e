// Two tiny OpenCL kernels compiled for the HIP test double's own tests
// (tests/test_hipstub.py): real gfx950 code objects from clang, in well under a
// second, so the double and the real HipDriver are exercised without FlyDSL.
// fill: a reqd_work_group_size kernel; axpy: pointer, pointer, float, int.
// -DONLY_FILL leaves one kernel (what the runtime's code-object checks expect).
__attribute__((reqd_work_group_size(64, 1, 1)))
kernel void fill(global int* out, int value, long n) {
  long i = __builtin_amdgcn_workitem_id_x() + __builtin_amdgcn_workgroup_id_x() * 64;
  if (i < n) out[i] = value;
}

#ifndef ONLY_FILL
kernel void axpy(global float* y, global const float* x, float a, int n) {
  int i = __builtin_amdgcn_workitem_id_x();
  if (i < n) y[i] += a * x[i];
}
#endif

#ifdef HIDDEN_ARGS
// sized: reads its workgroup size, which the runtime passes in the hidden arguments it fills
// itself, so its kernarg segment runs past its explicit arguments (out, value: 12 bytes).
kernel void sized(global int* out, int value) {
  out[__builtin_amdgcn_workitem_id_x()] = value * __builtin_amdgcn_workgroup_size_x();
}
#endif
