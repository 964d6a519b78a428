// The onednn plans with 16-channel blocks (nChw16c): oneDNN's AVX-512 kernels, bf16 plans on AVX512-BF16/AMX.
#include "lightseg/features.h"
#if LIGHTSEG_HAVE_DNNL
#define LIGHTSEG_ONEDNN_BLOCK 16
#define LIGHTSEG_ONEDNN_NS b16
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#define LIGHTSEG_ONEDNN_X86_512 1
#define LIGHTSEG_ONEDNN_X86_256 0
#else
#define LIGHTSEG_ONEDNN_X86_512 0
#define LIGHTSEG_ONEDNN_X86_256 0
#endif
#include "infer/onednn/plan_impl.h"
#endif
