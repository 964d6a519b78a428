// The fixtures of the `lightseg serve` tests (test_serve*.cpp): a server on a free port in a
// thread, a raw TCP client for bytes httplib will not send, gates, tricklers and answers' checks.
#pragma once

#include "lightseg/features.h"

#if LIGHTSEG_HAVE_SERVER

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "lightseg/engine.h"
#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "lightseg/serve.h"
#include "predictor_fixtures.h"
#include "serve/http.h"


namespace lightseg::serve_fixtures {

namespace fx = lightseg::fixtures;
namespace fs = std::filesystem;


// One predictor per pixel limit (the server's limit is its predictor's).
inline std::shared_ptr<const Predictor> test_predictor(int64_t max_pixels = 4096 * 1024) {
  static std::mutex mu;
  static std::map<int64_t, std::shared_ptr<const Predictor>> made;
  std::lock_guard<std::mutex> l(mu);
  auto& p = made[max_pixels];
  if (!p) {
    PredictorOptions po;
    po.max_pixels = max_pixels;
    p = std::make_shared<const Predictor>(fx::random_network(), ModelMeta::camvid(), po);
  }
  return p;
}

// A server on a free port, running in a thread for the test's lifetime.
class RunningServer {
 public:
  explicit RunningServer(ServerOptions o = {}, int64_t max_pixels = 4096 * 1024) {
    o.port = 0;
    server_ = std::make_unique<Server>(test_predictor(max_pixels), o);
    port_ = server_->bind();
    thread_ = std::thread([this] {
      server_->run();
      done_ = true;
    });
  }
  ~RunningServer() {
    server_->stop();
    wait();
  }
  // Waits for run() to return (after stop()).
  void wait() {
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    c.set_write_timeout(60, 0);
    return c;
  }
  Server& server() { return *server_; }
  int port() const { return port_; }
  bool done() const { return done_; }

 private:
  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> done_{false};
};

inline nlohmann::json json_of(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  return nlohmann::json::parse(r->body, nullptr, false);
}

// Expects status `code` with a JSON error message containing `needle`.
inline void expect_error(const httplib::Result& r, int code, const std::string& needle, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, code) << r->body;
  auto j = json_of(r);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_NE(j["error"].get<std::string>().find(needle), std::string::npos) << j["error"];
}

// A one-shot gate a test opens to let blocked requests proceed.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int waiting = 0;
  void wait() {
    std::unique_lock<std::mutex> l(m);
    ++waiting;
    cv.notify_all();
    cv.wait(l, [&] { return open; });
  }
  void wait_for_waiters(int n) {
    std::unique_lock<std::mutex> l(m);
    cv.wait_for(l, std::chrono::seconds(30), [&] { return waiting >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> l(m);
    open = true;
    cv.notify_all();
  }
};

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A plain TCP client for what httplib::Client cannot do: send bytes exactly as given (invalid
// UTF-8, a raw 0xFF), send slowly, or send several requests over one connection it controls.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  bool ok() const { return fd_ >= 0; }
  int local_port() const {
    sockaddr_in a{};
    socklen_t n = sizeof a;
    return ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0 ? ntohs(a.sin_port) : -1;
  }
  bool send(const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Never blocks: false when the connection is gone or its buffer is full.
  bool send_nowait(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(s.size());
  }

  struct Reply {
    int status = -1;  // -1: no complete response in time
    std::string head, body;
  };
  // Reads the next response (an interim 100 Continue counts as one) within timeout_s.
  Reply read_reply(double timeout_s) {
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    Reply r;
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill(end)) return r;
    r.head = buf_.substr(0, head_end + 4);
    size_t length = 0;
    std::string lower = r.head;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (auto at = lower.find("\r\ncontent-length:"); at != std::string::npos) length = std::stoul(lower.substr(at + 17));
    while (buf_.size() < head_end + 4 + length)
      if (!fill(end)) return r;
    r.body = buf_.substr(head_end + 4, length);
    buf_.erase(0, head_end + 4 + length);
    if (r.head.rfind("HTTP/1.", 0) == 0 && r.head.size() > 12) r.status = std::atoi(r.head.c_str() + 9);
    return r;
  }
  // Sends one request and reads its response.
  Reply exchange(const std::string& request, double timeout_s = 30) {
    if (!send(request)) return {};
    return read_reply(timeout_s);
  }
  // Reads (and keeps in received()) until the server closes the connection; false on timeout.
  bool wait_closed(double timeout_s) {
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (!eof_)
      if (!fill(end) && !eof_) return false;
    return true;
  }
  // Non-blocking: reads what has arrived; true once the server has closed the connection.
  bool poll_closed() {
    fill(Clock::now());
    return eof_;
  }
  const std::string& received() const { return buf_; }

 private:
  // Appends what arrives before `end` to buf_; false on timeout or when the peer closed (eof_).
  bool fill(Clock::time_point end) {
    if (eof_) return false;
    pollfd p{fd_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left))) <= 0) return false;
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {  // orderly close or reset: either way the server dropped the connection
      eof_ = true;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

inline nlohmann::json json_body(const RawConn::Reply& r) { return nlohmann::json::parse(r.body, nullptr, false); }

// Expects status `code` and a JSON error containing `needle` (the body must be valid UTF-8 JSON).
inline void expect_raw_error(const RawConn::Reply& r, int code, const std::string& needle, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(r.status, code) << r.head << r.body;
  auto j = json_body(r);
  ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].is_string()) << r.body;
  EXPECT_NE(j["error"].get<std::string>().find(needle), std::string::npos) << j["error"];
}

// TCP_NODELAY on the server's end of the connection from client_port (the server runs in this
// process, so its sockets are ours to inspect): 1 or 0; -1 when there is no such socket.
inline int server_side_nodelay(int server_port, int client_port) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_in self{}, peer{};
    socklen_t n = sizeof self, m = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &n) != 0 || self.sin_family != AF_INET) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &m) != 0) continue;
    if (ntohs(self.sin_port) != server_port || ntohs(peer.sin_port) != client_port) continue;
    int on = 0;
    socklen_t len = sizeof on;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len) != 0) return -1;
    return on != 0;
  }
  return -1;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Sends one byte every `period` to each connection until it is closed, stop is set or `cap` passes.
class Trickler {
 public:
  Trickler(std::vector<RawConn*> conns, std::chrono::milliseconds period, std::chrono::seconds cap)
      : thread_([this, conns, period, cap] {
          const auto end = Clock::now() + cap;
          std::vector<bool> gone(conns.size(), false);
          while (!stop_ && Clock::now() < end) {
            for (size_t i = 0; i < conns.size(); ++i)
              if (!gone[i] && !conns[i]->send_nowait("a")) gone[i] = true;
            std::this_thread::sleep_for(period);
          }
        }) {}
  ~Trickler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};


// The status lines of every response in `out` (a connection's bytes).
inline std::vector<int> statuses_of(const std::string& out) {
  std::vector<int> st;
  for (size_t p = out.find("HTTP/1.1 "); p != std::string::npos; p = out.find("HTTP/1.1 ", p + 1))
    if (p == 0 || out.compare(p - 2, 2, "\r\n") == 0 || out[p - 1] == '}') st.push_back(std::atoi(out.c_str() + p + 9));
  return st;
}

const std::string kSmuggled = "GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";


}  // namespace lightseg::serve_fixtures

#endif  // LIGHTSEG_HAVE_SERVER
