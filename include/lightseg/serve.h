// lightseg: the HTTP service (claim 8's receiving unit on the network) and its web page.
//
// Basic usage:
//   auto predictor = std::make_shared<lightseg::Predictor>(opts);
//   lightseg::Server server(predictor, {});            // ServerOptions: host, port, limits
//   int port = server.bind();                          // port 0 picks a free one
//   std::thread t([&] { server.run(); });              // blocks until stop()
//   server.stop();                                     // in-flight requests get stop_grace s, then run() returns
//
// Endpoints:
//   POST /v1/segment   body: a PNG/JPEG (raw, or multipart/form-data with any file field)
//                      ?format=ids (default; 8-bit label-id PNG at the input's size)
//                             |color|overlay (PNG) |json (size, classes with pixel shares, latency)
//                      &alpha=A (overlay opacity, default 0.5); json also takes &image=overlay|color
//                      (adds the picture as a data: URL, which the web page uses)
//                      &scales=1,1.25&flip=1 test-time augmentation of this request (default:
//                      ServerOptions::scales/flip): at most max_scales scales, each in [0.25, 4],
//                      snapped to multiples of scale_grid (0.25) and deduplicated, each giving a
//                      pass of at most max_pixels; flip=0|1. The answer names it in the
//                      X-Augmentation header (and json's "augmentation"): "none" or "scales
//                      1,1.25 + flip". Each scale costs a forward pass, twice with flip.
//                      X-Queue-Ms: the wait for an engine; X-Inference-Ms: the passes alone.
//   GET  /healthz      {"status":"ok"}
//   GET  /v1/model     classes, palette, normalisation, parameter count, backend, the default
//                      augmentation and the limits
//   GET  /             the web page (embedded in the binary; a CSP with frame-ancestors 'none')
//   PUT/PATCH/DELETE/GET /v1/segment: 405 (Allow: POST)
// Bad input gets a 4xx JSON {"error": "..."}: 400 empty body, corrupt/truncated image, bad
// parameter (invalid UTF-8 included) or malformed request (a Content-Length that is not one
// decimal number, both Content-Length and Transfer-Encoding, bad chunks); 403 a POST from a page
// of another origin (Origin, Sec-Fetch-Site); 408 a head or body that arrived too slowly; 413 body
// over max_bytes (a Content-Length over it is answered at once, before any "100 Continue"),
// image or pass over the predictor's max_pixels (PredictorOptions, required > 0: checked from
// the header before decoding and on the decoded size) or a request costing more than
// max_request_cost; 415 not an image, an unsupported format or a Content-Encoding; 421 a Host
// that is not this server's (DNS rebinding: IP literals, localhost, `host` and allowed_hosts
// pass); 431 a head over max_head_bytes or max_header_lines; 501 a Transfer-Encoding other than
// chunked. 503 (Retry-After: 1) when max_queue requests already wait or the admitted ones use
// the cost budget (max_cost), when a body finds no slot within slot_wait or a request no engine
// within queue_timeout, or when max_connections are open. Every answer says nosniff.
//
// Slow clients cannot hold the service: each connection has its own thread (blocked reads cost
// a thread, not a worker), a request head must arrive within head_timeout (checked on every
// read), a body within body_timeout plus 1 s per min_body_rate bytes and within upload_timeout
// in all, and any read or write making no progress for 10 s fails. A body slot is taken at the
// body's first byte. stop() closes idle connections at once and what is still open after
// stop_grace.
//
// Memory is bounded: at most http_threads requests read a body at a time (each ≤ max_bytes);
// admitted requests (engines + max_queue at most, costing at most max_cost pixels of passes
// together) wait with their encoded bodies and decode only when their engine's turn comes, so
// `engines` decoded images (≤ 4·max_pixels bytes each) and passes at once; the onednn engine keeps at
// most 8 Mpixels of plans. Measured (docs/robustness.md): ~180 MB idle, ~1.1–1.4 GB for a request
// at the default 4 Mpixel limit, under 1.8 GB whatever sizes come.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lightseg {

class Predictor;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                         // 0: any free port (see Server::bind)
  size_t max_bytes = 16u << 20;            // request body limit
  int max_queue = 32;                      // requests allowed to wait for an engine
  int http_threads = 0;                    // requests reading a body at once; 0: engines + max_queue + 8
  int max_connections = 1000;              // open connections at most (more: 503 and closed)
  double head_timeout = 5;                 // s: the request line and headers must arrive within it
  double body_timeout = 10;                // s: a body must arrive within body_timeout + size / min_body_rate
  size_t min_body_rate = 8192;             // bytes/s (see body_timeout)
  double upload_timeout = 60;              // s from a body's first byte: the whole body is due by then (408)
  double slot_wait = 1;                    // s a body waits for one of http_threads slots; then 503
  size_t max_head_bytes = 32768;           // request line + headers; more: 431
  int max_header_lines = 100;              // header fields; more: 431
  double stop_grace = 10;                  // s: stop() gives requests in flight this long, then closes them
  // Cost of a request: the pixels of all its forward passes (Predictor::inspect). Admitted
  // requests (waiting or running) cost at most max_cost together (more: 503 + Retry-After); one
  // request at most max_request_cost (more: 413). 0: 8 (resp. 2) × the predictor's max_pixels.
  int64_t max_cost = 0;
  int64_t max_request_cost = 0;
  double queue_timeout = 30;               // s an admitted request may wait for an engine; then 503
  double scale_grid = 0.25;                // a request's scales are snapped to multiples of it (Augmentation::snapped)
  // Host names (besides IP literals and "localhost") a request's Host header may name; any other
  // is answered 421 (DNS rebinding). "*": any.
  std::vector<std::string> allowed_hosts;
  // Test-time augmentation (Predictor's Augmentation) of the requests that name none; default:
  // one plain pass. A request's &scales=&flip= replace it, with at most max_scales scales.
  std::vector<double> scales{1.0};
  bool flip = false;
  int max_scales = 4;
  // Access log and notices, one line each (no newline); empty: silent.
  std::function<void(const std::string&)> log;
  // Test hook: runs in the request's thread right before the forward pass.
  std::function<void()> before_inference;
};

class Server {
 public:
  Server(std::shared_ptr<const Predictor> predictor, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws when the address is unusable.
  int bind();
  // Serves until stop(); then waits for the requests in flight. Binds first if needed.
  void run();
  // Stops accepting connections; safe from any thread (not from a signal handler).
  void stop();
  int port() const;

  // Serves the HTTP/1.1 requests in `input` as one keep-alive connection would (the same
  // routing, handlers, limits and error answers), in this thread, without a socket; returns the
  // bytes the connection would have sent. For tests and the fuzz targets (fuzz/fuzz_http.cpp).
  std::string handle_bytes(const std::string& input);

  // Counters for tests and logs.
  struct Stats {
    uint64_t requests = 0, ok = 0, client_errors = 0, rejected_busy = 0, server_errors = 0;
    uint64_t dropped = 0;  // admitted requests whose client had gone before their forward pass
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lightseg
