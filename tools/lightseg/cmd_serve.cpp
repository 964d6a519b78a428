// lightseg serve: the HTTP service and its web page (library: src/serve).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "args.h"
#include "lightseg/features.h"
#include "lightseg/predictor.h"
#include "lightseg/runtime.h"
#if LIGHTSEG_HAVE_SERVER
#include "lightseg/serve.h"
#endif

namespace lightseg::cli {

#if LIGHTSEG_HAVE_SERVER
namespace {
int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signals{0};

// Async-signal-safe: the first SIGINT/SIGTERM asks for a graceful stop; a second one exits at once.
extern "C" void on_stop_signal(int sig) {
  if (g_signals.fetch_add(1) > 0) _exit(128 + sig);
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}
}  // namespace
#endif

void add_serve(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("serve", "HTTP service: POST /v1/segment, GET /v1/model, GET /healthz, and a web page at /");
  add_options(sub, a, {Opt::Weights, Opt::Host, Opt::Port, Opt::Threads, Opt::Device, Opt::Backend, Opt::Precision, Opt::Tta, Opt::InputSize});
  struct ServeArgs {
    size_t max_bytes = 16u << 20;
    int64_t max_pixels = 4096 * 1024;
    int queue = 32;
    double grace = 10;
    int max_connections = 1000;
    int max_scales = 4;
    std::vector<std::string> allowed_hosts;
    double queue_timeout = 30;
    int64_t max_cost = 0;
    int64_t max_request_cost = 0;
  };
  static ServeArgs s;
  sub->add_option("--max-bytes", s.max_bytes, "Largest request body in bytes (larger: 413)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-pixels", s.max_pixels, "Largest image, width·height (larger: 413)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--queue", s.queue, "Requests that may wait for the network (more: 503)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--grace", s.grace, "Seconds SIGTERM/SIGINT gives the requests in flight before closing their connections")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-connections", s.max_connections, "Open connections at most (more: 503)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-scales", s.max_scales,
                  "Test-time augmentation scales a request may ask for (&scales=; more: 400). Each is a forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--allowed-hosts", s.allowed_hosts,
                  "Host names a request's Host header may name besides IP addresses and localhost (others: 421, "
                  "against DNS rebinding); '*': any")
      ->delimiter(',');
  sub->add_option("--queue-timeout", s.queue_timeout, "Seconds a request may wait for the network (then 503)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-cost", s.max_cost,
                  "Pixels of forward passes (scales × flip × pixels) the admitted requests may cost together "
                  "(more: 503); 0: 8 × --max-pixels")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-request-cost", s.max_request_cost,
                  "Pixels of forward passes one request may cost (more: 413); 0: 2 × --max-pixels")
      ->check(CLI::NonNegativeNumber);
  sub->callback([&a]() {
#if LIGHTSEG_HAVE_SERVER
    const int threads = init_runtime(a.threads);
    PredictorOptions po;
    po.weights = resolve_weights(a.weights);
    po.engine = engine_options(a);
    po.input_size = InputSize::parse(a.input_size);
    // --scales/--flip: the requests' default augmentation, which each request may change
    // (&scales=, &flip=); the engines themselves run plain passes.
    po.engine.scales = {1.0};
    po.engine.flip = false;
    // The same limit in the decoder, checked after its header and before any pixel is decoded
    // (the server checks the header first; the predictor holds whatever the decoder reads).
    po.max_pixels = s.max_pixels;
    auto predictor = std::make_shared<const Predictor>(po);

    ServerOptions so;
    so.host = a.host;
    so.port = a.port;
    so.max_bytes = s.max_bytes;
    so.max_queue = s.queue;
    so.stop_grace = s.grace;
    so.max_connections = s.max_connections;
    so.scales = a.scales;
    so.flip = a.flip;
    so.max_scales = std::max<int>(s.max_scales, static_cast<int>(a.scales.size()));
    so.allowed_hosts = s.allowed_hosts;
    so.queue_timeout = s.queue_timeout;
    so.max_cost = s.max_cost;
    so.max_request_cost = s.max_request_cost;
    so.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    Server server(predictor, so);
    const int port = server.bind();
    // Every open connection is a file descriptor: make room for --max-connections of them (the
    // soft limit is often 1024), as far as the hard limit allows.
    if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
      const rlim_t want = static_cast<rlim_t>(s.max_connections) + 256;
      if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
        ::setrlimit(RLIMIT_NOFILE, &rl);
      }
    }

    if (::pipe(g_signal_pipe) != 0) throw std::runtime_error("pipe() failed");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    std::thread watcher([&server] {
      char c = 0;
      while (::read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
      }
      if (c != 0) {
        std::fprintf(stderr, "%s: finishing the requests in flight (at most %g s), then exiting (again to quit at once)\n",
                     c == SIGINT ? "SIGINT" : "SIGTERM", s.grace);
        server.stop();
      }
    });

    std::fprintf(stderr,
                 "weights %s (%s, %lld parameters), backend %s, %d threads; limits: %zu bytes, %lld pixels, queue %d, "
                 "%d connections; augmentation of requests that name none: %s (a request may ask up to %d scales)\n",
                 po.weights.c_str(), predictor->meta().dataset.c_str(), static_cast<long long>(predictor->parameters()),
                 predictor->backend().c_str(), threads, s.max_bytes, static_cast<long long>(s.max_pixels), s.queue,
                 s.max_connections,
                 Augmentation{so.scales, so.flip}.text().c_str(),
                 so.max_scales);
    // An IPv6 address goes in brackets in a URL (RFC 3986): http://[::1]:8080/
    const bool v6 = a.host.find(':') != std::string::npos && a.host.front() != '[';
    std::printf("serving on http://%s%s%s:%d/ (Ctrl-C stops)\n", v6 ? "[" : "", a.host.c_str(), v6 ? "]" : "", port);
    std::fflush(stdout);
    server.run();

    const char zero = 0;  // releases the watcher when run() ended without a signal
    [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &zero, 1);
    watcher.join();
    auto st = server.stats();
    std::fprintf(stderr, "stopped: %llu requests (%llu ok, %llu client errors, %llu busy, %llu server errors)\n",
                 static_cast<unsigned long long>(st.requests), static_cast<unsigned long long>(st.ok),
                 static_cast<unsigned long long>(st.client_errors), static_cast<unsigned long long>(st.rejected_busy),
                 static_cast<unsigned long long>(st.server_errors));
#else
    (void)a;
    throw std::runtime_error("this build has no HTTP server (cpp-httplib was not found when it was configured)");
#endif
  });
}

}  // namespace lightseg::cli
