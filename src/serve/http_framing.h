// lightseg serve: the HTTP framing under httplib (internal; http_server.cpp's rooms): what a
// connection's thread knows about its request (RequestState), and httplib's Stream with this
// server's framing: the head counted against its caps and deadline (431, 408), Content-Length
// digits only, Transfer-Encoding chunked decoded here (anything else 501), the body's slot
// taken at its first byte. Over a socket (Stream) or bytes in memory (MemoryStream).
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#include "serve/http_server.h"

namespace lightseg {

// What the connection's thread knows about the request it serves now.
struct HttpServer::RequestState {
  bool in_body = false;           // the head is parsed (httplib called setup_request)
  Clock::time_point head_deadline;
  Clock::time_point body_start;   // when the body may start to arrive (a slot is held)
  Clock::time_point upload_deadline = Clock::time_point::max();  // the whole body is due by then
  size_t body_bytes = 0;          // handed to httplib since body_start
  size_t head_bytes = 0;          // of the head so far (request line, headers; then trailers)
  int head_lines = 0;
  bool head_too_large = false;    // over max_head_bytes or max_header_lines: 431
  bool timed_out = false;         // a read missed its deadline: the request fails
  bool refuse_body = false;       // Content-Length over the limit: none of the body is read
  int refusal = 0;                // the framing checks refused the request with this status
  std::string refusal_message;
  bool busy = false;              // no body slot within slot_wait
  bool close = false;             // the response says Connection: close
  bool slot = false;              // holds a body slot
  bool body_started = false;      // the first body read happened (slot taken or not needed)
  bool wrote = false;             // some of a response was written
  BodyFraming framing = BodyFraming::None;
  uint64_t length = 0;            // Content-Length
  uint64_t body_read = 0;         // payload bytes handed to httplib
  // The chunked decoder.
  enum class Chunk { Size, Ext, SizeLf, Data, DataCr, DataLf, Trailer, TrailerLf, Done, Bad } chunk = Chunk::Size;
  uint64_t chunk_left = 0;
  int chunk_digits = 0;
  size_t trailer_line = 0;        // bytes of the trailer line so far

  bool body_complete() const {
    switch (framing) {
      case BodyFraming::None: return true;
      case BodyFraming::Length: return body_read == length;
      case BodyFraming::Chunked: return chunk == Chunk::Done;
    }
    return true;
  }
};

namespace http_detail {

inline std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

inline void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  if ((peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n)) != 0)
    return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), n, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// RFC 9110 token characters (a field name).
inline bool is_token(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c))) return false;
  return true;
}

inline int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace http_detail

// httplib's Stream with this server's framing: the head counted against its caps and deadline,
// the body delimited by BodyFraming (chunked decoded here), its slot taken at its first byte.
// raw_read/before_body come from the transport (a socket, or bytes in memory).
class HttpServer::FramedStream : public httplib::Stream {
 public:
  FramedStream(const HttpServer& server, RequestState& rs, bool deadlines)
      : server_(server), rs_(rs), deadlines_(deadlines) {}

  ssize_t read(char* ptr, size_t size) override {
    if (!rs_.in_body) return read_head(ptr, size);
    if (rs_.refuse_body || rs_.refusal) return -1;  // httplib would read and drop it all
    if (rs_.framing == BodyFraming::None) return 0;
    if (!rs_.body_started) {
      rs_.body_started = true;
      if (!before_body()) return -1;
    }
    if (deadlines_ && Clock::now() >= rs_.upload_deadline) {
      rs_.timed_out = true;
      return -1;
    }
    if (rs_.framing == BodyFraming::Length) {
      const uint64_t left = rs_.length - rs_.body_read;
      if (left == 0) return 0;
      const ssize_t n = raw_read(ptr, static_cast<size_t>(std::min<uint64_t>(size, left)));
      if (n > 0) {
        rs_.body_read += static_cast<uint64_t>(n);
        rs_.body_bytes += static_cast<size_t>(n);
      }
      return n;
    }
    return read_chunked(ptr, size);
  }

 protected:
  virtual ssize_t raw_read(char* ptr, size_t size) = 0;
  // Before the first byte of a body: the body slot. False fails the read.
  virtual bool before_body() = 0;

  const HttpServer& server_;
  RequestState& rs_;

 private:
  ssize_t read_head(char* ptr, size_t size) {
    if (rs_.head_too_large) return -1;
    if (deadlines_ && Clock::now() >= rs_.head_deadline) {  // every read, not only when poll waits
      rs_.timed_out = true;
      return -1;
    }
    const ssize_t n = raw_read(ptr, size);
    if (n <= 0) return n;
    rs_.head_bytes += static_cast<size_t>(n);
    rs_.head_lines += static_cast<int>(std::count(ptr, ptr + n, '\n'));
    // + 2: the request line and the empty line that ends the head
    if (rs_.head_bytes > server_.limits_.max_head_bytes || rs_.head_lines > server_.limits_.max_header_lines + 2) {
      rs_.head_too_large = true;
      return -1;
    }
    return n;
  }

  bool raw_byte(char& c) {
    const ssize_t n = raw_read(&c, 1);
    if (n == 1) {
      rs_.body_bytes += 1;
      return true;
    }
    return false;
  }

  // Decodes the chunked framing (RFC 9112 section 7.1): strict CRLFs, hex sizes of at most 15
  // digits, extensions skipped, trailers read and dropped (counted against the head's caps).
  ssize_t read_chunked(char* ptr, size_t size) {
    using C = RequestState::Chunk;
    auto bad = [&] {
      rs_.chunk = C::Bad;
      return ssize_t(-1);
    };
    for (;;) {
      char c = 0;
      switch (rs_.chunk) {
        case C::Done: return 0;
        case C::Bad: return -1;
        case C::Data: {
          const ssize_t n = raw_read(ptr, static_cast<size_t>(std::min<uint64_t>(size, rs_.chunk_left)));
          if (n <= 0) return n < 0 ? -1 : bad();
          rs_.chunk_left -= static_cast<uint64_t>(n);
          rs_.body_read += static_cast<uint64_t>(n);
          rs_.body_bytes += static_cast<size_t>(n);
          if (rs_.chunk_left == 0) rs_.chunk = C::DataCr;
          return n;
        }
        default: break;
      }
      if (!raw_byte(c)) return bad();
      switch (rs_.chunk) {
        case C::Size:
          if (const int d = http_detail::hex_digit(c); d >= 0) {
            if (++rs_.chunk_digits > 15) return bad();
            rs_.chunk_left = rs_.chunk_left * 16 + static_cast<uint64_t>(d);
          } else if (rs_.chunk_digits == 0) {
            return bad();
          } else if (c == ';' || c == ' ' || c == '\t') {
            rs_.chunk = C::Ext;
          } else if (c == '\r') {
            rs_.chunk = C::SizeLf;
          } else {
            return bad();
          }
          break;
        case C::Ext:  // chunk extensions: ignored, bounded like a header line
          if (++rs_.trailer_line > 4096) return bad();
          if (c == '\r') rs_.chunk = C::SizeLf;
          else if (c == '\n') return bad();
          break;
        case C::SizeLf:
          if (c != '\n') return bad();
          rs_.chunk_digits = 0;
          rs_.trailer_line = 0;
          rs_.chunk = rs_.chunk_left == 0 ? C::Trailer : C::Data;
          break;
        case C::DataCr:
          if (c != '\r') return bad();
          rs_.chunk = C::DataLf;
          break;
        case C::DataLf:
          if (c != '\n') return bad();
          rs_.chunk = C::Size;
          break;
        case C::Trailer:  // trailer fields until an empty line
          if (++rs_.head_bytes > server_.limits_.max_head_bytes) return bad();
          if (c == '\r') {
            rs_.chunk = C::TrailerLf;
          } else if (c == '\n') {
            return bad();
          } else {
            ++rs_.trailer_line;
          }
          break;
        case C::TrailerLf:
          if (c != '\n') return bad();
          if (rs_.trailer_line == 0) {
            rs_.chunk = C::Done;
            return 0;
          }
          if (++rs_.head_lines > server_.limits_.max_header_lines + 2) return bad();
          rs_.trailer_line = 0;
          rs_.chunk = C::Trailer;
          break;
        default: return bad();
      }
    }
  }

  bool deadlines_;
};

// Over one connection, reading through a buffer (httplib reads a head byte by byte). Every wait
// is a poll() bounded by the request's deadline: the head's, or the body's, which moves on with
// each byte that arrives (and never past the upload deadline); and by the read/write timeout.
class HttpServer::Stream : public FramedStream {
 public:
  Stream(HttpServer& server, int fd, RequestState& rs) : FramedStream(server, rs, true), owner_(server), fd_(fd) {}

  bool is_readable() const override { return off_ < len_ || wait(POLLIN); }
  bool is_writable() const override { return wait(POLLOUT); }

  ssize_t write(const char* ptr, size_t size) override {
    rs_.wrote = true;
    for (;;) {
      if (!wait(POLLOUT)) return -1;
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { http_detail::address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { http_detail::address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // Waits up to `timeout` s for the next request's first byte (or the peer's close, or stop()'s).
  bool wait_request(double timeout) const {
    if (off_ < len_) return true;
    pollfd p{fd_, POLLIN, 0};
    const auto end = Clock::now() + http_detail::seconds(timeout);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count() + 1;
      const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
      if (r == 0 && Clock::now() >= end) return false;
    }
  }

  // Bytes of the next request already read (pipelined): the peer has not gone, whatever it did.
  bool buffered() const { return off_ < len_; }

 protected:
  ssize_t raw_read(char* ptr, size_t size) override {
    if (off_ == len_) {
      const ssize_t n = fill();
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  // The slot is taken when the first byte of the body is here: a client that sends a head and
  // then nothing holds no slot; one that waits longer than slot_wait for a slot gets a 503.
  bool before_body() override {
    if (off_ == len_ && !wait(POLLIN)) return false;
    if (!owner_.take_slot(rs_)) return false;
    const auto now = Clock::now();
    rs_.body_start = now;
    rs_.upload_deadline = now + http_detail::seconds(server_.limits_.upload_timeout);
    return true;
  }

 private:
  ssize_t fill() {
    off_ = len_ = 0;
    for (;;) {
      if (!wait(POLLIN)) return -1;
      const ssize_t n = ::recv(fd_, buf_, sizeof buf_, MSG_DONTWAIT);
      if (n >= 0) {
        len_ = static_cast<size_t>(n);
        return n;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    }
  }

  // Waits for the socket to be ready (or hung up: the read or write then says so). False when a
  // deadline or the timeout passed first; a missed read deadline fails the request (timed_out).
  bool wait(short events) const {
    const bool in = events == POLLIN;
    auto end = Clock::now() + (in ? http_detail::seconds(server_.read_timeout_sec_ + server_.read_timeout_usec_ * 1e-6)
                                  : http_detail::seconds(server_.write_timeout_sec_ + server_.write_timeout_usec_ * 1e-6));
    if (in && !rs_.in_body) {
      end = std::min(end, rs_.head_deadline);
    } else if (in) {
      if (server_.limits_.min_body_rate > 0)
        end = std::min(end, rs_.body_start + http_detail::seconds(server_.limits_.body_timeout +
                                                     double(rs_.body_bytes) / double(server_.limits_.min_body_rate)));
      end = std::min(end, rs_.upload_deadline);
    }
    pollfd p{fd_, events, 0};
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count() + 1;
      const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
      if (r == 0 && Clock::now() >= end) break;
    }
    if (in) rs_.timed_out = true;
    return false;
  }

  HttpServer& owner_;
  int fd_;
  char buf_[16384];
  size_t off_ = 0, len_ = 0;
};

// Over bytes in memory (serve_bytes): reads `in`, appends what is written to `out`.
class HttpServer::MemoryStream : public FramedStream {
 public:
  MemoryStream(const HttpServer& server, const std::string& in, std::string& out, RequestState& rs)
      : FramedStream(server, rs, false), in_(in), out_(out) {}

  bool is_readable() const override { return off_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t write(const char* ptr, size_t size) override {
    rs_.wrote = true;
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 2;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  bool done() const { return off_ >= in_.size(); }

 protected:
  ssize_t raw_read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - off_);
    if (n == 0) return 0;
    std::memcpy(ptr, in_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }
  bool before_body() override { return true; }  // one connection, no other to wait for

 private:
  const std::string& in_;
  std::string& out_;
  size_t off_ = 0;
};

}  // namespace lightseg
