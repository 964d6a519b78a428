// lightseg serve: the connections under httplib. See http_server.h.
#include "serve/http_server.h"

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
#include <system_error>

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

thread_local HttpServer::RequestState* HttpServer::current_ = nullptr;
thread_local int HttpServer::current_fd_ = -1;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
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

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// RFC 9110 token characters (a field name).
bool is_token(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c))) return false;
  return true;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

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
          if (const int d = hex_digit(c); d >= 0) {
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

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // Waits up to `timeout` s for the next request's first byte (or the peer's close, or stop()'s).
  bool wait_request(double timeout) const {
    if (off_ < len_) return true;
    pollfd p{fd_, POLLIN, 0};
    const auto end = Clock::now() + seconds(timeout);
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
    rs_.upload_deadline = now + seconds(server_.limits_.upload_timeout);
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
    auto end = Clock::now() + (in ? seconds(server_.read_timeout_sec_ + server_.read_timeout_usec_ * 1e-6)
                                  : seconds(server_.write_timeout_sec_ + server_.write_timeout_usec_ * 1e-6));
    if (in && !rs_.in_body) {
      end = std::min(end, rs_.head_deadline);
    } else if (in) {
      if (server_.limits_.min_body_rate > 0)
        end = std::min(end, rs_.body_start + seconds(server_.limits_.body_timeout +
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

HttpServer::HttpServer() {
  // An over-limit body, or a request the framing checks refused, is answered before the client
  // sends its body, not after "100 Continue".
  set_expect_100_continue_handler([](const httplib::Request&, httplib::Response& res) {
    if (current_ && current_->refusal) {
      res.status = current_->refusal;
      return current_->refusal;
    }
    if (current_ && current_->refuse_body) {
      res.status = 413;
      return 413;
    }
    return 100;
  });
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (current_ && current_->refusal) {
      res.status = current_->refusal;
      return HandlerResponse::Handled;  // the error handler writes the message
    }
    return filter_ ? filter_(req, res) : HandlerResponse::Unhandled;
  });
  // Every response decides whether the connection stays open: after a failed, cut-short or
  // refused read, or a body left unread, the rest of the request is still on the wire; after
  // stop() no next request is read.
  set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    RequestState* rs = current_;
    const bool close = stopping_ || (rs && (rs->refuse_body || rs->timed_out || rs->refusal || rs->busy ||
                                            rs->head_too_large || !rs->body_complete()));
    if (close && res.get_header_value("Connection") != "close") res.set_header("Connection", "close");
    if (res.get_header_value("Connection") == "close") {
      res.headers.erase("Keep-Alive");
      if (rs) rs->close = true;
    }
  });
}

HttpServer::~HttpServer() {
  if (svr_sock_ != INVALID_SOCKET) ::close(svr_sock_);  // bound, never served
}

bool HttpServer::request_timed_out() { return current_ && current_->timed_out; }
bool HttpServer::request_busy() { return current_ && current_->busy; }
BodyFraming HttpServer::request_framing() { return current_ ? current_->framing : BodyFraming::None; }
std::string HttpServer::request_refusal() {
  if (!current_) return "";
  if (current_->head_too_large) return "the request head is too large";
  return current_->refusal_message;
}

bool HttpServer::client_gone() {
  if (current_fd_ < 0) return false;
  pollfd p{current_fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR)) return true;
  if (!(p.revents & (POLLIN | POLLRDHUP))) return false;
  char c;
  const ssize_t n = ::recv(current_fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void HttpServer::raise_backlog(int n) {
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, n);
}

void HttpServer::notice(const std::string& line) const {
  if (notice_) notice_(line);
}

void HttpServer::serve() {
  const socket_t listener = svr_sock_;
  bool told_fds = false;
  while (listener != INVALID_SOCKET && !stopping_) {
    pollfd p{listener, POLLIN, 0};
    const int r = ::poll(&p, 1, 1000);  // at least once a second: join the threads that ended
    reap();
    if (r <= 0 || stopping_) continue;
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        if (!told_fds) notice("out of file descriptors: connections wait in the backlog (raise ulimit -n)");
        told_fds = true;
      }
      if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // Responses go out as a head and a body: with Nagle on, the body of each answer on a reused
    // connection waits for the client's delayed ACK (40 ms on Linux).
    int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) {
      ::close(fd);
      break;
    }
    if (open_ >= limits_.max_connections) {
      l.unlock();
      refuse(fd);
      continue;
    }
    Conn& c = conns_.emplace_back();
    c.fd = fd;
    c.accepted = Clock::now();
    ++open_;
    try {
      c.thread = std::thread(&HttpServer::serve_connection, this, std::ref(c));
    } catch (const std::system_error&) {  // out of threads
      --open_;
      conns_.pop_back();
      l.unlock();
      refuse(fd);
    }
  }

  // Stopped: the listening socket goes, the requests in flight get the grace period.
  std::unique_lock<std::mutex> l(mu_);
  if (!stopping_) {  // not bound, or the socket failed
    stopping_ = true;
    stop_deadline_ = Clock::now();
  }
  if (svr_sock_ != INVALID_SOCKET) {
    ::close(svr_sock_);
    svr_sock_ = INVALID_SOCKET;
  }
  ended_.wait_until(l, stop_deadline_, [&] { return open_ == 0; });
  if (open_ > 0) {
    notice("closing " + std::to_string(open_) + " connection(s) still open at the end of the grace period");
    cut_ = true;
    for (auto& c : conns_)
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);  // wakes their reads and writes: they fail
    slot_free_.notify_all();
  }
  l.unlock();
  for (auto& c : conns_) c.thread.join();
  conns_.clear();
}

void HttpServer::stop(double grace) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return;
  stopping_ = true;
  stop_deadline_ = Clock::now() + seconds(std::max(0.0, grace));
  // Shutting the listening socket down wakes serve() and refuses new connections at once.
  if (svr_sock_ != INVALID_SOCKET) ::shutdown(svr_sock_, SHUT_RDWR);
  for (auto& c : conns_)
    if (c.idle && c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
}

void HttpServer::reap() {
  std::list<Conn> ended;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (it->finished) ended.splice(ended.end(), conns_, it);
      it = next;
    }
  }
  for (auto& c : ended) c.thread.join();
}

// Over max_connections: a short 503 (if the socket takes it at once), then close.
void HttpServer::refuse(int fd) {
  static const std::string body =
      R"({"error":"busy: too many open connections; retry later","status":503})";
  static const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                   "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] ssize_t n = ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
  refused_++;
}

void HttpServer::serve_connection(Conn& c) {
  RequestState rs;
  bool linger = false;
  current_ = &rs;
  current_fd_ = c.fd;
  Stream strm(*this, c.fd, rs);
  for (size_t n = 1;; ++n) {
    // A new connection's first request is due within the head timeout; later ones within the
    // keep-alive timeout, their heads within the head timeout from their first byte.
    const bool first = n == 1;
    if (!strm.wait_request(first ? limits_.head_timeout : double(keep_alive_timeout_sec_))) break;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) break;
      c.idle = false;
    }
    rs = RequestState{};
    rs.head_deadline = (first ? c.accepted : Clock::now()) + seconds(limits_.head_timeout);
    const bool last = n >= keep_alive_max_count_;
    bool closed = false, ok = false;
    try {
      ok = process_request(strm, last, closed, [this, &rs](httplib::Request& req) { on_head(req, rs); });
    } catch (const std::exception& e) {  // httplib's own error path threw (error handler, logger)
      notice(std::string("internal error outside a handler, connection closed: ") + e.what());
    } catch (...) {
      notice("internal error outside a handler, connection closed");
    }
    release_slot(rs);
    if (!ok && !rs.wrote) answer_unparsed(strm, rs);
    // Closing with the client possibly still sending (a refused head or body): linger, so that
    // the answer is read rather than lost to the reset a close with unread bytes causes.
    linger = rs.head_too_large || rs.refusal || rs.refuse_body || rs.busy || !rs.body_complete();
    if (!ok || closed || last || rs.close || rs.timed_out || rs.refuse_body || !rs.body_complete()) break;
    linger = false;
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) break;
    c.idle = true;
  }
  current_ = nullptr;
  current_fd_ = -1;
  if (linger && !stopping_) {  // at most 1 s and 1 MiB
    ::shutdown(c.fd, SHUT_WR);
    char scratch[16384];
    size_t drained = 0;
    const auto end = Clock::now() + std::chrono::seconds(1);
    for (pollfd p{c.fd, POLLIN, 0}; drained < (1u << 20);) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(c.fd, scratch, sizeof scratch, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  int fd;
  {
    std::lock_guard<std::mutex> l(mu_);
    fd = c.fd;
    c.fd = -1;
    c.finished = true;
    --open_;
    ended_.notify_all();
  }
  ::close(fd);
}

std::string HttpServer::serve_bytes(const std::string& input) {
  std::string out;
  RequestState rs;
  RequestState* const outer = current_;
  current_ = &rs;
  MemoryStream strm(*this, input, out, rs);
  for (size_t n = 1; !strm.done(); ++n) {
    rs = RequestState{};
    rs.head_deadline = Clock::now() + seconds(limits_.head_timeout);
    const bool last = n >= keep_alive_max_count_;
    bool closed = false, ok = false;
    try {
      ok = process_request(strm, last, closed, [this, &rs](httplib::Request& req) { on_head(req, rs); });
    } catch (const std::exception& e) {
      notice(std::string("internal error outside a handler, connection closed: ") + e.what());
    } catch (...) {
      notice("internal error outside a handler, connection closed");
    }
    release_slot(rs);
    if (!ok && !rs.wrote) answer_unparsed(strm, rs);
    if (!ok || closed || last || rs.close || rs.refuse_body || !rs.body_complete()) break;
  }
  current_ = outer;
  return out;
}

// A request line that never ended within the head's caps or deadline: httplib gives up without
// an answer; this one says why (then the connection closes).
void HttpServer::answer_unparsed(httplib::Stream& strm, const RequestState& rs) {
  std::string status, body;
  if (rs.head_too_large) {
    status = "431 Request Header Fields Too Large";
    body = R"({"error":"the request head is too large","status":431})";
  } else if (rs.timed_out && !rs.in_body) {
    status = "408 Request Timeout";
    body = R"({"error":"the request head did not arrive in time","status":408})";
  } else {
    return;  // the client closed, or its head was cut short: no one to answer
  }
  const std::string reply = "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\n"
                            "X-Content-Type-Options: nosniff\r\nConnection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
  strm.write(reply.data(), reply.size());
}

// The head is parsed: the framing checks (RFC 9112 section 6), then the body's turn. A request
// they refuse is answered at once (pre-routing, or instead of "100 Continue") and its connection
// closed; a body over the limit is not read at all.
void HttpServer::on_head(httplib::Request& req, RequestState& rs) {
  rs.in_body = true;
  rs.body_start = Clock::now();
  auto refuse = [&](int status, std::string message) {
    rs.refusal = status;
    rs.refusal_message = std::move(message);
  };
  for (const auto& [name, value] : req.headers) {
    if (!is_token(name)) return refuse(400, "malformed header field name");
  }
  if (req.headers.count("Host") > 1) return refuse(400, "more than one Host header");
  // Content-Length: digits only; repeated only with the same value.
  const auto lengths = req.headers.equal_range("Content-Length");
  bool has_length = false;
  uint64_t length = 0;
  for (auto it = lengths.first; it != lengths.second; ++it) {
    const std::string& v = it->second;
    if (v.empty() || v.size() > 18 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return refuse(400, "Content-Length must be a decimal number of at most 18 digits");
    const uint64_t n = std::strtoull(v.c_str(), nullptr, 10);
    if (has_length && n != length) return refuse(400, "two different Content-Length values");
    has_length = true;
    length = n;
  }
  // Transfer-Encoding: only `chunked` (a list of codings ending in it would need the others too).
  const size_t n_te = req.headers.count("Transfer-Encoding");
  if (n_te > 0) {
    std::string codings;
    for (auto [it, end] = req.headers.equal_range("Transfer-Encoding"); it != end; ++it)
      codings += (codings.empty() ? "" : ", ") + it->second;
    if (n_te > 1 || lower(trimmed(req.get_header_value("Transfer-Encoding"))) != "chunked")
      return refuse(501, "Transfer-Encoding '" + codings.substr(0, 100) + "' is not supported (only chunked)");
    if (has_length) return refuse(400, "both Transfer-Encoding and Content-Length");
    rs.framing = BodyFraming::Chunked;
    // This stream decodes the chunks: httplib reads the body as one running to its end.
    req.headers.erase("Transfer-Encoding");
  } else if (has_length) {
    rs.framing = length > 0 ? BodyFraming::Length : BodyFraming::None;
    rs.length = length;
  }
  // httplib would decompress a body (gzip, deflate, br) into more bytes than were sent.
  if (req.has_header("Content-Encoding") && lower(trimmed(req.get_header_value("Content-Encoding"))) != "identity")
    return refuse(415, "Content-Encoding '" + req.get_header_value("Content-Encoding").substr(0, 100) +
                           "' is not supported (send the image as it is)");
  // Ranges of a reply that cost a full request to make are not served.
  if (req.method != "GET" && req.method != "HEAD") req.ranges.clear();
  if (rs.framing == BodyFraming::Length && length > payload_max_length_) rs.refuse_body = true;
}

// Waits up to slot_wait for a body slot (the bound on request bodies in memory); false: none
// came free (busy) or the server is closing.
bool HttpServer::take_slot(RequestState& rs) {
  std::unique_lock<std::mutex> l(mu_);
  const bool got = slot_free_.wait_for(l, seconds(limits_.slot_wait),
                                       [&] { return slots_used_ < limits_.body_slots || cut_; });
  if (cut_) return false;  // closing: the reads fail anyway
  if (!got) {
    rs.busy = true;
    return false;
  }
  ++slots_used_;
  rs.slot = true;
  return true;
}

void HttpServer::release_slot(RequestState& rs) {
  if (!rs.slot) return;
  rs.slot = false;
  std::lock_guard<std::mutex> l(mu_);
  --slots_used_;
  slot_free_.notify_one();
}

}  // namespace lightseg
