#include "core/isa.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "lightseg/runtime.h"

namespace lightseg {

IsaLevel max_isa_level() {
  const char* v = std::getenv("LIGHTSEG_MAX_ISA");
  const std::string s = v ? v : "";
  if (s.empty() || s == "avx512_bf16") return IsaLevel::Avx512Bf16;
  if (s == "avx512") return IsaLevel::Avx512;
  if (s == "avx2") return IsaLevel::Avx2;
  if (s == "generic") return IsaLevel::Generic;
  throw std::invalid_argument("LIGHTSEG_MAX_ISA must be generic, avx2, avx512 or avx512_bf16, got '" + s + "'");
}

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::Generic: return "generic";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::Avx512: return "avx512";
    case IsaLevel::Avx512Bf16: return "avx512_bf16";
  }
  return "?";
}

IsaLevel cpu_isa_level() {
  static const IsaLevel cpu = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return IsaLevel::Generic;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl"))
      return IsaLevel::Avx2;
    return __builtin_cpu_supports("avx512bf16") ? IsaLevel::Avx512Bf16 : IsaLevel::Avx512;
#else
    return IsaLevel::Generic;
#endif
  }();
  return std::min(cpu, max_isa_level());
}

bool cpu_has_native_bf16() { return cpu_isa_level() >= IsaLevel::Avx512Bf16; }

void apply_isa_cap_to_onednn() {
  const IsaLevel level = max_isa_level();
  if (level == IsaLevel::Avx512Bf16 || std::getenv("ONEDNN_MAX_CPU_ISA")) return;
  const char* onednn = level == IsaLevel::Avx512 ? "AVX512_CORE" : level == IsaLevel::Avx2 ? "AVX2" : "SSE41";
  ::setenv("ONEDNN_MAX_CPU_ISA", onednn, 0);
}

}  // namespace lightseg
