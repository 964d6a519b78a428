// lightseg serve: the connections under httplib (accepting, reading with deadlines, closing).
//
// httplib 0.11 parses the requests and writes the responses (Server::process_request); its own
// accept loop is not used. That loop hands connections to a fixed thread pool and times out each
// read, not each request: a few dozen clients sending a header byte every few seconds hold every
// worker, and neither new requests nor a stop get through. Here each connection has a thread of
// its own (cheap while it waits on poll(); up to max_connections of them), each request head a
// deadline and each body a minimum rate and a total deadline; at most body_slots requests read a
// body at once (each may hold max_bytes), and stop() gives the requests in flight a grace period,
// then closes their connections.
//
// Framing is strict (RFC 9112), decided here once for httplib and the handlers alike: a head is at
// most max_head_bytes and max_header_lines lines (431), due within head_timeout however fast its
// bytes come (408); Content-Length is digits only and never two different values, never beside
// Transfer-Encoding (400); Transfer-Encoding must be exactly `chunked` (any case; else 501), and
// this class reads the chunked framing itself (trailers allowed); a request without either has no
// body. A body slot is taken when the body's first byte arrives, waiting at most slot_wait (then
// 503); a response whose request body was not read to its end closes the connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include "serve/http.h"

namespace lightseg {

struct ConnectionLimits {
  int max_connections = 1000;   // open at once; more are answered 503 and closed
  int body_slots = 41;          // requests reading a body at once; more wait for a slot
  double head_timeout = 5;      // s from a request's first byte (a new connection's: from accept)
  double body_timeout = 10;     // s: a body is due within body_timeout + bytes so far / min_body_rate
  size_t min_body_rate = 8192;  // bytes/s; 0: no rate, only the read timeout
  double upload_timeout = 60;   // s from the body's first byte: the whole body is due by then
  double slot_wait = 1;         // s a body waits for a slot; then 503 (Retry-After) and closed
  size_t max_head_bytes = 32768;  // request line + headers (+ a chunked body's trailers); more: 431
  int max_header_lines = 100;     // header fields; more: 431
};

// How a request's body is delimited (RFC 9112 section 6.3).
enum class BodyFraming { None, Length, Chunked };

// Read and write timeouts (no progress at all), keep-alive and the body limit are httplib's
// settings (set_read_timeout, set_keep_alive_timeout, set_payload_max_length, ...). The server
// installs the Expect: 100-continue and post-routing handlers itself: do not replace them.
class HttpServer : public httplib::Server {
 public:
  HttpServer();
  ~HttpServer() override;

  void set_limits(const ConnectionLimits& limits) { limits_ = limits; }
  // Runs before routing, after the framing checks (a request they refused never gets here):
  // Handled answers the request with `res` as it is. For checks of the head such as Host.
  void set_request_filter(HandlerWithResponse filter) { filter_ = std::move(filter); }
  // Notices (connections closed at the end of the grace period, internal errors); may be empty.
  void set_notice(std::function<void(const std::string&)> notice) { notice_ = std::move(notice); }
  // Listens again on the bound socket with a larger backlog (httplib's is 5).
  void raise_backlog(int n);
  // Accepts and serves connections until stop(), then waits for them (see stop). Binds first
  // (bind_to_port or bind_to_any_port).
  void serve();
  // Stops accepting at once and closes the connections waiting for a request; requests in flight
  // get `grace` seconds to finish, then their connections are closed too (a handler still running
  // finishes; serve() returns when all connection threads have ended). Safe from any thread.
  void stop(double grace);
  // Connections refused because max_connections were open.
  uint64_t refused() const { return refused_; }

  // For handlers: did the head or body of the request this thread serves miss its deadline?
  static bool request_timed_out();
  // For handlers: no body slot came free within slot_wait (answer 503).
  static bool request_busy();
  // For handlers: how the body of the request this thread serves is framed (None: no body).
  static BodyFraming request_framing();
  // For handlers: has the client of the request this thread serves closed its connection (or
  // reset it)? False without a socket (serve_bytes).
  static bool client_gone();
  // For the error handler: why the framing checks refused the request ("" if they did not).
  static std::string request_refusal();

  // Serves the requests in `input` as one connection would (keep-alive, the same parsing,
  // handlers, limits and error path), from memory and without a socket; returns the bytes the
  // connection would have sent. For tests and the fuzz targets. Deadlines do not apply.
  std::string serve_bytes(const std::string& input);

 private:
  using Clock = std::chrono::steady_clock;
  struct RequestState;
  class FramedStream;
  class Stream;
  class MemoryStream;
  struct Conn {
    int fd = -1;                 // -1 once closed (guarded by mu_)
    bool idle = true;            // waiting for a request (guarded by mu_): stop() closes it at once
    bool finished = false;       // its thread is done with it (guarded by mu_)
    Clock::time_point accepted;
    std::thread thread;
  };

  void serve_connection(Conn& c);
  void on_head(httplib::Request& req, RequestState& rs);
  bool take_slot(RequestState& rs);
  void release_slot(RequestState& rs);
  static void answer_unparsed(httplib::Stream& strm, const RequestState& rs);
  void refuse(int fd);
  void reap();
  void notice(const std::string& line) const;

  ConnectionLimits limits_;
  std::function<void(const std::string&)> notice_;
  HandlerWithResponse filter_;
  std::mutex mu_;
  std::condition_variable ended_;      // a connection ended
  std::condition_variable slot_free_;  // a body slot was released, or cut_
  std::list<Conn> conns_;              // guarded by mu_, as are the four below
  int open_ = 0;                       // connections not finished
  int slots_used_ = 0;
  bool cut_ = false;                   // the grace period is over: connections are being closed
  Clock::time_point stop_deadline_;
  std::atomic<bool> stopping_{false};  // written under mu_
  std::atomic<uint64_t> refused_{0};
  static thread_local RequestState* current_;  // the request this thread serves
  static thread_local int current_fd_;         // its socket (-1: none)
};

}  // namespace lightseg
