// Numbers read from JSON a user or a file supplied (configs, weights headers, checkpoints).
// nlohmann's get<int>() casts whatever it finds: 1e20 becomes undefined behaviour, 2^40 wraps
// to some other int, 3.7 becomes 3. These refuse all of that, naming the key.
#pragma once

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace lightseg {

// An integral T: an integer within T's range (or a float with an integral value within it);
// a floating T: any finite number T can hold. Throws std::invalid_argument naming `what`.
template <class T>
T json_number(const nlohmann::json& v, const std::string& what) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  auto bad = [&](const char* expect) {
    return std::invalid_argument(what + " must be " + expect + ", got " + v.dump().substr(0, 60));
  };
  if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw bad("a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || std::fabs(x) > double(std::numeric_limits<T>::max())) throw bad("a finite number");
    return static_cast<T>(x);
  } else {
    using L = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
      const auto x = v.get<uint64_t>();
      if (x > static_cast<uint64_t>(L::max())) throw bad("an integer in range");
      return static_cast<T>(x);
    }
    if (v.is_number_integer()) {
      const auto x = v.get<int64_t>();
      if ((std::is_unsigned_v<T> && x < 0) ||
          (!std::is_unsigned_v<T> && (x < int64_t(L::min()) || (sizeof(T) < 8 && x > int64_t(L::max())))))
        throw bad("an integer in range");
      return static_cast<T>(x);
    }
    if (v.is_number_float()) {
      const double x = v.get<double>();
      // 2^63 / 2^64 are exactly representable bounds: x must lie below them
      if (!std::isfinite(x) || std::trunc(x) != x || x < double(L::min()) || x >= std::ldexp(1.0, L::digits))
        throw bad("an integer in range");
      return static_cast<T>(x);
    }
    throw bad("an integer");
  }
}

template <class T>
std::vector<T> json_numbers(const nlohmann::json& v, const std::string& what) {
  if (!v.is_array()) throw std::invalid_argument(what + " must be an array of numbers");
  std::vector<T> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(json_number<T>(v[i], what + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace lightseg
