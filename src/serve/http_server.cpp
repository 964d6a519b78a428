// lightseg serve: the connections under httplib. See http_server.h.
#include "serve/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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
  size_t body_bytes = 0;          // handed to httplib since body_start
  bool timed_out = false;         // a read missed its deadline: the request fails
  bool refuse_body = false;       // Content-Length over the limit: none of the body is read
  bool close = false;             // the response says Connection: close
  bool slot = false;              // holds a body slot
};

thread_local HttpServer::RequestState* HttpServer::current_ = nullptr;

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

}  // namespace

// httplib's Stream over one connection, reading through a buffer (httplib reads a head byte by
// byte). Every wait is a poll() bounded by the request's deadline: the head's, or the body's,
// which moves on with each byte that arrives; and by the read/write timeout.
class HttpServer::Stream : public httplib::Stream {
 public:
  Stream(const HttpServer& server, int fd, RequestState& rs) : server_(server), fd_(fd), rs_(rs) {}

  bool is_readable() const override { return off_ < len_ || wait(POLLIN); }
  bool is_writable() const override { return wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    if (rs_.in_body && rs_.refuse_body) return -1;  // httplib would read and drop it all
    if (off_ == len_) {
      const ssize_t n = fill();
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    if (rs_.in_body) rs_.body_bytes += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
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
    } else if (in && server_.limits_.min_body_rate > 0) {
      end = std::min(end, rs_.body_start + seconds(server_.limits_.body_timeout +
                                                   double(rs_.body_bytes) / double(server_.limits_.min_body_rate)));
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

  const HttpServer& server_;
  int fd_;
  RequestState& rs_;
  char buf_[16384];
  size_t off_ = 0, len_ = 0;
};

// httplib's Stream over bytes in memory (serve_bytes): reads `in`, appends what is written to `out`.
class HttpServer::MemoryStream : public httplib::Stream {
 public:
  MemoryStream(const std::string& in, std::string& out, RequestState& rs) : in_(in), out_(out), rs_(rs) {}

  bool is_readable() const override { return off_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    if (rs_.in_body && rs_.refuse_body) return -1;
    const size_t n = std::min(size, in_.size() - off_);
    if (n == 0) return 0;
    std::memcpy(ptr, in_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
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

 private:
  const std::string& in_;
  std::string& out_;
  RequestState& rs_;
  size_t off_ = 0;
};

HttpServer::HttpServer() {
  // An over-limit body is refused before the client sends it, not after "100 Continue".
  set_expect_100_continue_handler([](const httplib::Request&, httplib::Response& res) {
    if (current_ && current_->refuse_body) {
      res.status = 413;
      return 413;
    }
    return 100;
  });
  // Every response decides whether the connection stays open: after a failed or cut-short read
  // the rest of the request is still on the wire, and after stop() no next request is read.
  set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    RequestState* rs = current_;
    const bool close = stopping_ || (rs && (rs->refuse_body || rs->timed_out));
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
  current_ = &rs;
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
    if (!ok || closed || last || rs.close || rs.timed_out || rs.refuse_body) break;
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) break;
    c.idle = true;
  }
  current_ = nullptr;
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
  MemoryStream strm(input, out, rs);
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
    if (!ok || closed || last || rs.close || rs.refuse_body) break;
  }
  current_ = outer;
  return out;
}

// The head is parsed: the body's turn. A body over the limit is not read at all; one within it
// waits for a slot (the bound on request bodies in memory), and its deadline starts then.
void HttpServer::on_head(const httplib::Request& req, RequestState& rs) {
  rs.in_body = true;
  rs.body_start = Clock::now();
  const bool has_length = req.has_header("Content-Length");
  const uint64_t length = has_length ? std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) : 0;
  const bool chunked = req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
  if (has_length && length > payload_max_length_) {
    rs.refuse_body = true;
    return;
  }
  if (length == 0 && !chunked) return;
  std::unique_lock<std::mutex> l(mu_);
  slot_free_.wait(l, [&] { return slots_used_ < limits_.body_slots || cut_; });
  if (cut_) return;  // closing: the reads fail anyway
  ++slots_used_;
  rs.slot = true;
  rs.body_start = Clock::now();
}

void HttpServer::release_slot(RequestState& rs) {
  if (!rs.slot) return;
  rs.slot = false;
  std::lock_guard<std::mutex> l(mu_);
  --slots_used_;
  slot_free_.notify_one();
}

}  // namespace lightseg
