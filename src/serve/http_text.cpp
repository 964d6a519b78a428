#include "serve/http_text.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace lightseg::serve_text {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string base64(const std::string& in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += tbl[(v >> 6) & 63];
    out += tbl[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += i + 1 < in.size() ? tbl[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// `s` with every byte that is not part of well-formed UTF-8 (stray continuation bytes, overlong
// forms, surrogates, past U+10FFFF, cut-off sequences) replaced by U+FFFD. Paths and parameters
// are whatever bytes the client sent, and nlohmann::json refuses to dump invalid UTF-8.
std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) n = 1;
    else if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      ok = k == 1 ? d >= lo && d <= hi : d >= 0x80 && d <= 0xBF;
    }
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

// 5 → "5", 2.5 → "2.5".
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// A line for the log: valid UTF-8 without control characters (a path may hold CR or LF).
std::string loggable(const std::string& s) {
  std::string out = valid_utf8(s);
  for (auto& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

// A value from the request, quoted in a message: valid UTF-8, at most about 200 bytes of it.
std::string shown(const std::string& s) { return valid_utf8(s.size() > 200 ? s.substr(0, 200) + "…" : s); }

// Never throws: it runs in handlers' catch blocks and in httplib's error path, where an exception
// would end the process.
void send_error(httplib::Response& res, int status, const std::string& message) noexcept {
  res.status = status;
  try {
    res.set_content(nlohmann::json{{"error", valid_utf8(message)}, {"status", status}}.dump(), "application/json");
  } catch (...) {
    res.body = R"({"error":"internal error","status":500})";
    res.status = 500;
    res.set_header("Content-Type", "application/json");
  }
}

int status_for(InputError::Kind k) {
  switch (k) {
    case InputError::Kind::Empty: return 400;
    case InputError::Kind::Corrupt: return 400;
    case InputError::Kind::NotAnImage: return 415;
    case InputError::Kind::Unsupported: return 415;
    case InputError::Kind::TooLarge: return 413;
  }
  return 400;
}


std::string lowercase(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The host of a Host header or an origin's authority ("name:port", "[v6]:port"), lowercase.
std::string host_part(const std::string& authority) {
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    return close == std::string::npos ? authority : lowercase(authority.substr(0, close + 1));
  }
  return lowercase(authority.substr(0, authority.find(':')));
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[16];
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    return ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1;
}

}  // namespace lightseg::serve_text
