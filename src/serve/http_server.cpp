// lightseg serve: the connections under httplib. See http_server.h.
#include "serve/http_server.h"

#include "serve/http_framing.h"

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

thread_local HttpServer::RequestState* HttpServer::current_ = nullptr;
thread_local int HttpServer::current_fd_ = -1;


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
  stop_deadline_ = Clock::now() + http_detail::seconds(std::max(0.0, grace));
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
    rs.head_deadline = (first ? c.accepted : Clock::now()) + http_detail::seconds(limits_.head_timeout);
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
    rs.head_deadline = Clock::now() + http_detail::seconds(limits_.head_timeout);
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
    if (!http_detail::is_token(name)) return refuse(400, "malformed header field name");
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
    if (n_te > 1 || http_detail::lower(http_detail::trimmed(req.get_header_value("Transfer-Encoding"))) != "chunked")
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
  if (req.has_header("Content-Encoding") && http_detail::lower(http_detail::trimmed(req.get_header_value("Content-Encoding"))) != "identity")
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
  const bool got = slot_free_.wait_for(l, http_detail::seconds(limits_.slot_wait),
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
