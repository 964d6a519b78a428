// cpp-httplib, declared as the library we link was built. Debian's libcpp-httplib is a
// compiled library built with OpenSSL, zlib and brotli support, and those options change
// the layout of its classes: every translation unit must see the same ones.
#pragma once

#include "lightseg/features.h"

#if LIGHTSEG_HTTPLIB_COMPILED
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#endif

#include <httplib.h>
