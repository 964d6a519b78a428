# CMake toolchain file: cross-build for 64-bit ARM (aarch64, Linux) with Debian's
# g++-aarch64-linux-gnu against an arm64 sysroot of Debian 12's packages (LibTorch, oneDNN,
# libpng, libjpeg-turbo, ...), as made by scripts/setup_arm64.sh. scripts/cross_arm64.sh uses it:
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DLIGHTSEG_ARM64_SYSROOT=/path/to/sysroot
# The sysroot is LIGHTSEG_ARM64_SYSROOT (cache variable or environment variable), by default
# .cache/sysroot-arm64 of the source tree.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT LIGHTSEG_ARM64_SYSROOT)
  if(DEFINED ENV{LIGHTSEG_ARM64_SYSROOT})
    set(LIGHTSEG_ARM64_SYSROOT "$ENV{LIGHTSEG_ARM64_SYSROOT}")
  else()
    get_filename_component(LIGHTSEG_ARM64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../.cache/sysroot-arm64" ABSOLUTE)
  endif()
endif()
# try_compile projects re-read this file without the cache: pass the sysroot on through the environment.
set(ENV{LIGHTSEG_ARM64_SYSROOT} "${LIGHTSEG_ARM64_SYSROOT}")
if(NOT EXISTS "${LIGHTSEG_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu")
  message(FATAL_ERROR "no arm64 sysroot at ${LIGHTSEG_ARM64_SYSROOT}: make it with scripts/setup_arm64.sh")
endif()

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT "${LIGHTSEG_ARM64_SYSROOT}")
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# The baseline of every 64-bit ARM CPU: ARMv8-A, whose Advanced SIMD (NEON) is mandatory, so
# the portable kernels' vector code (GCC vector extensions) and the loops GCC auto-vectorizes
# (-O3 in Release) become NEON. No -mcpu: the binary runs on any ARMv8-A board (Cortex-A53 on).
set(CMAKE_C_FLAGS_INIT "-march=armv8-a")
set(CMAKE_CXX_FLAGS_INIT "-march=armv8-a")
# Libraries that the sysroot's libraries need (libtorch_cpu's own dependencies) are found in it at link time.
set(CMAKE_EXE_LINKER_FLAGS_INIT
  "-Wl,-rpath-link,${LIGHTSEG_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${LIGHTSEG_ARM64_SYSROOT}/lib/aarch64-linux-gnu -Wl,-rpath-link,${LIGHTSEG_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/blas -Wl,-rpath-link,${LIGHTSEG_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/lapack")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${CMAKE_EXE_LINKER_FLAGS_INIT}")

# Headers, libraries and CMake packages from the sysroot only; programs (protoc, ...) from the host.
set(CMAKE_FIND_ROOT_PATH "${LIGHTSEG_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Tests and tools run through qemu-user with the sysroot's loader and libraries.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L "${LIGHTSEG_ARM64_SYSROOT}")
