// lightseg serve: the text of requests and answers (internal; server.cpp's helpers): base64,
// UTF-8 checks and quoting for logs and messages, JSON error answers and their statuses, and
// the host names of Host and Origin headers.
#pragma once

#include <chrono>
#include <string>

#include "serve/http.h"  // httplib

#include "lightseg/image_io.h"

namespace lightseg::serve_text {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b);

std::string base64(const std::string& in);

// `s` with every byte that is not part of well-formed UTF-8 (stray continuation bytes, overlong
// forms, surrogates, past U+10FFFF, cut-off sequences) replaced by U+FFFD. Paths and parameters
// are whatever bytes the client sent, and nlohmann::json refuses to dump invalid UTF-8.
std::string valid_utf8(const std::string& s);

// 5 → "5", 2.5 → "2.5".
std::string seconds_text(double s);

// A line for the log: valid UTF-8 without control characters (a path may hold CR or LF).
std::string loggable(const std::string& s);

// A value from the request, quoted in a message: valid UTF-8, at most about 200 bytes of it.
std::string shown(const std::string& s);

// Never throws: it runs in handlers' catch blocks and in httplib's error path, where an exception
// would end the process.
void send_error(httplib::Response& res, int status, const std::string& message) noexcept;

int status_for(InputError::Kind k);

// Thrown inside a handler for a 4xx answer.
struct HttpError {
  int status;
  std::string message;
};

std::string lowercase(std::string s);

// The host of a Host header or an origin's authority ("name:port", "[v6]:port"), lowercase.
std::string host_part(const std::string& authority);

bool is_ip_literal(const std::string& host);

}  // namespace lightseg::serve_text
