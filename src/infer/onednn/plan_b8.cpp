// The onednn plans with 8-channel blocks (nChw8c): oneDNN's AVX2 and SSE4.1 kernels.
#include "lightseg/features.h"
#if LIGHTSEG_HAVE_DNNL
#define LIGHTSEG_ONEDNN_BLOCK 8
#define LIGHTSEG_ONEDNN_NS b8
#define LIGHTSEG_ONEDNN_X86_512 0
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#define LIGHTSEG_ONEDNN_X86_256 1
#else
#define LIGHTSEG_ONEDNN_X86_256 0
#endif
#include "infer/onednn/plan_impl.h"
#endif
