/*
 * The build host's stand-in for libamdhip64.so.7: what mori's JIT v2 libraries (libmori_jit.so,
 * libmori_ops_v2.so) need of the HIP runtime to load and make their plans on a host with no GPU.
 *
 * Not a test double and not a runtime: it runs nothing. A build drives mori's own plan creation
 * (render, key, compile through $MORI_JIT_HIPCC, publish), which ends by loading the published code
 * object; here that load checks only that the file is there and is an ELF image. There is no
 * device: the arch comes from $MORI_JIT_ARCH (hipGetDevicePropertiesR0600 refuses), and a launch
 * is refused. Symbols at the version nodes mori imports (hip_4.2, hip_6.0), soname
 * libamdhip64.so.7. Standard C only: no HIP header is needed for these few types.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorNoDevice = 100, hipErrorInvalidImage = 200,
       hipErrorFileNotFound = 301, hipErrorNotSupported = 801 };

struct standin_module { char path[4096]; };
struct standin_function { struct standin_module *module; };

const char *hipGetErrorString(hipError_t e) {
  switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorNoDevice: return "no GPU on this build host (gemmar-aot's stand-in HIP runtime: set MORI_JIT_ARCH)";
    case hipErrorInvalidImage: return "not an ELF code object (gemmar-aot's stand-in HIP runtime)";
    case hipErrorFileNotFound: return "code object file not found";
    case hipErrorNotSupported: return "a build host launches nothing (gemmar-aot's stand-in HIP runtime)";
    default: return "unknown error";
  }
}

hipError_t hipGetDevice(int *device) {
  if (!device) return hipErrorInvalidValue;
  *device = 0;
  return hipSuccess;
}

hipError_t hipGetDevicePropertiesR0600(void *prop, int device) {
  (void)prop; (void)device;
  return hipErrorNoDevice;
}

hipError_t hipModuleLoad(void **module, const char *fname) {
  if (!module || !fname) return hipErrorInvalidValue;
  FILE *f = fopen(fname, "rb");
  if (!f) return hipErrorFileNotFound;
  unsigned char magic[4] = {0};
  size_t n = fread(magic, 1, 4, f);
  fclose(f);
  if (n != 4 || memcmp(magic, "\177ELF", 4) != 0) return hipErrorInvalidImage;
  struct standin_module *m = calloc(1, sizeof *m);
  if (!m) return hipErrorInvalidValue;
  strncpy(m->path, fname, sizeof m->path - 1);
  *module = m;
  return hipSuccess;
}

hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
  if (!function || !module || !name) return hipErrorInvalidValue;
  struct standin_function *fn = calloc(1, sizeof *fn);
  if (!fn) return hipErrorInvalidValue;
  fn->module = module;
  *function = fn;
  return hipSuccess;
}

hipError_t hipModuleUnload(void *module) {
  free(module);
  return hipSuccess;
}

hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream;
  (void)params; (void)extra;
  return hipErrorNotSupported;
}
