// `lightseg serve` over real HTTP on 127.0.0.1: formats, bad input, load, queue, shutdown,
// slow and hostile clients, the CLI's signal handling, and the web page in headless Chromium.
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

using namespace lightseg;
namespace fx = lightseg::fixtures;
namespace fs = std::filesystem;

namespace {

// One predictor per pixel limit (the server's limit is its predictor's).
std::shared_ptr<const Predictor> test_predictor(int64_t max_pixels = 4096 * 1024) {
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

nlohmann::json json_of(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  return nlohmann::json::parse(r->body, nullptr, false);
}

// Expects status `code` with a JSON error message containing `needle`.
void expect_error(const httplib::Result& r, int code, const std::string& needle, const std::string& what) {
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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

nlohmann::json json_body(const RawConn::Reply& r) { return nlohmann::json::parse(r.body, nullptr, false); }

// Expects status `code` and a JSON error containing `needle` (the body must be valid UTF-8 JSON).
void expect_raw_error(const RawConn::Reply& r, int code, const std::string& needle, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(r.status, code) << r.head << r.body;
  auto j = json_body(r);
  ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].is_string()) << r.body;
  EXPECT_NE(j["error"].get<std::string>().find(needle), std::string::npos) << j["error"];
}

// TCP_NODELAY on the server's end of the connection from client_port (the server runs in this
// process, so its sockets are ours to inspect): 1 or 0; -1 when there is no such socket.
int server_side_nodelay(int server_port, int client_port) {
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

double median(std::vector<double> v) {
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

}  // namespace

TEST(Serve, HealthModelAndWebPage) {
  fx::one_thread();
  RunningServer s;
  auto c = s.client();
  auto r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json_of(r)["status"], "ok");

  r = c.Get("/v1/model");
  ASSERT_TRUE(r);
  auto m = json_of(r);
  EXPECT_EQ(m["classes"], ModelMeta::camvid().class_names);
  EXPECT_EQ(m["palette"].size(), 11u);
  EXPECT_EQ(m["palette"][3], nlohmann::json({128, 64, 128}));
  EXPECT_EQ(m["parameters"], test_predictor()->parameters());
  EXPECT_EQ(m["normalization"]["mean"].size(), 3u);

  r = c.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_NE(r->body.find("/v1/segment"), std::string::npos);
  // self-contained: nothing is fetched from elsewhere
  EXPECT_EQ(r->body.find("src=\"http"), std::string::npos);
  // the one <link> is the empty inline icon (no favicon request that ends in a 404)
  const auto link = r->body.find("<link");
  ASSERT_NE(link, std::string::npos);
  EXPECT_EQ(r->body.compare(link, 31, "<link rel=\"icon\" href=\"data:,\">"), 0) << r->body.substr(link, 40);
  EXPECT_EQ(r->body.find("<link", link + 1), std::string::npos);
  EXPECT_EQ(r->body.find("@import"), std::string::npos);
  // no image box before the first upload (a broken-image icon each), download links for the results
  EXPECT_NE(r->body.find("<figure id=\"inputfig\" hidden>"), std::string::npos);
  EXPECT_NE(r->body.find("<figure id=\"overlayfig\" hidden>"), std::string::npos);
  EXPECT_NE(r->body.find("<div id=\"downloads\" hidden>"), std::string::npos);
  EXPECT_NE(r->body.find("id=\"dl-color\""), std::string::npos);
  EXPECT_NE(r->body.find("id=\"dl-ids\""), std::string::npos);
  // a failed request clears the previous result (its legend shares, latency, downloads)
  const auto fail_branch = r->body.find("if (!r.ok) {", r->body.find("async function segment()"));
  ASSERT_NE(fail_branch, std::string::npos);
  EXPECT_LT(r->body.find("clearResult();", fail_branch), r->body.find("return;", fail_branch));
  const auto clear = r->body.find("function clearResult()");
  ASSERT_NE(clear, std::string::npos);
  for (const char* part : {"$(\"latency\").textContent = \"\"", "$(\"downloads\").hidden = true", "showLegend(model.classes"})
    EXPECT_NE(r->body.substr(clear, 700).find(part), std::string::npos) << part;

  r = c.Get("/favicon.ico");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "image/svg+xml");
  EXPECT_EQ(r->body.rfind("<svg ", 0), 0u) << r->body;

  expect_error(c.Get("/nope"), 404, "no such endpoint", "unknown path");
}

TEST(Serve, SegmentInEveryFormat) {
  fx::one_thread();
  RunningServer s;
  auto c = s.client();
  const auto& p = *test_predictor();
  auto img = fx::shapes_sample(45, 61, 3).first;
  const std::string png = encode_png(img);
  const auto labels = p.predict(img).labels;

  auto r = c.Post("/v1/segment", png, "image/png");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "image/png");
  EXPECT_EQ(r->get_header_value("X-Image-Size"), "61x45");
  EXPECT_FALSE(r->get_header_value("X-Latency-Ms").empty());
  auto ids = decode_image(r->body.data(), r->body.size());
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{45, 61, 1}));  // 8-bit, one channel, input size
  EXPECT_TRUE(ids.squeeze(2).equal(labels));

  r = c.Post("/v1/segment?format=color", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_TRUE(decode_image(r->body.data(), r->body.size()).equal(colorize(labels, p.meta().palette)));

  r = c.Post("/v1/segment?format=overlay&alpha=0.3", png, "application/octet-stream");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_TRUE(decode_image(r->body.data(), r->body.size()).equal(overlay(img, labels, p.meta().palette, 0.3)));

  r = c.Post("/v1/segment?format=json", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  auto j = json_of(r);
  EXPECT_EQ(j["width"], 61);
  EXPECT_EQ(j["height"], 45);
  ASSERT_EQ(j["classes"].size(), 11u);
  auto counts = torch::bincount(labels.flatten().to(torch::kLong), {}, 11);
  double share = 0;
  for (int k = 0; k < 11; ++k) {
    EXPECT_EQ(j["classes"][k]["name"], p.meta().class_names[k]);
    EXPECT_EQ(j["classes"][k]["pixels"], counts[k].item<int64_t>());
    share += j["classes"][k]["share"].get<double>();
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_GT(j["latency_ms"]["total"].get<double>(), 0);
  EXPECT_GE(j["latency_ms"]["total"].get<double>(), j["latency_ms"]["inference"].get<double>());
  EXPECT_FALSE(j.contains("image"));

  r = c.Post("/v1/segment?format=json&image=overlay", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  j = json_of(r);
  const std::string url = j["image"];
  ASSERT_EQ(url.rfind("data:image/png;base64,", 0), 0u);

  // curl --data-binary sends application/x-www-form-urlencoded: any size must still work
  auto big = fx::shapes_sample(96, 128, 4).first;
  const std::string big_png = encode_png(big);
  ASSERT_GT(big_png.size(), 8192u);
  r = c.Post("/v1/segment", big_png, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(decode_image(r->body.data(), r->body.size()).squeeze(2).equal(p.predict(big).labels));

  // chunked transfer encoding (no Content-Length)
  auto chunked = [](const std::string& data) {
    return [data](size_t offset, httplib::DataSink& sink) {
      if (offset < data.size()) sink.write(data.data() + offset, std::min<size_t>(4096, data.size() - offset));
      else sink.done();
      return true;
    };
  };
  r = c.Post("/v1/segment", chunked(png), "image/png");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(decode_image(r->body.data(), r->body.size()).squeeze(2).equal(labels));

  // multipart form upload (what an HTML form sends)
  httplib::MultipartFormDataItems form = {{"note", "hello", "", ""}, {"image", encode_jpeg(img, 95), "x.jpg", "image/jpeg"}};
  r = c.Post("/v1/segment", form);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto jpg = encode_jpeg(img, 95);
  auto expect_jpg = p.predict_encoded(jpg.data(), jpg.size()).labels;
  EXPECT_TRUE(decode_image(r->body.data(), r->body.size()).squeeze(2).equal(expect_jpg));
}

// Test-time augmentation per request (&scales=, &flip=), the server's default (ServerOptions::
// scales, flip) for requests that name none, and clear 4xx answers for bad or costly asks.
TEST(Serve, RequestsChooseTheirTestTimeAugmentation) {
  fx::one_thread();
  ServerOptions o;
  o.flip = true;  // the default of this server
  o.max_scales = 3;
  RunningServer s(o, 100 * 100);
  auto c = s.client();
  const auto& p = *test_predictor(100 * 100);
  auto img = fx::shapes_sample(45, 61, 3).first;
  const std::string png = encode_png(img);
  auto ids = [](const httplib::Result& r) { return decode_image(r->body.data(), r->body.size()).squeeze(2); };
  const auto plain = p.predict(img).labels;
  const auto flipped = p.predict(img, false, {{1.0}, true}).labels;
  const auto multi = p.predict(img, false, {{1.0, 1.25}, true}).labels;
  ASSERT_FALSE(plain.equal(flipped));  // else this test could not tell them apart
  ASSERT_FALSE(multi.equal(flipped));

  auto r = c.Post("/v1/segment", png, "image/png");  // the server's default
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "");
  EXPECT_EQ(r->get_header_value("X-Augmentation"), "scales 1 + flip");
  EXPECT_TRUE(ids(r).equal(flipped));
  r = c.Post("/v1/segment?flip=0", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(r->get_header_value("X-Augmentation"), "none");
  EXPECT_TRUE(ids(r).equal(plain));
  r = c.Post("/v1/segment?scales=1,1.25", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(r->get_header_value("X-Augmentation"), "scales 1,1.25 + flip");
  EXPECT_TRUE(ids(r).equal(multi));
  r = c.Post("/v1/segment?format=json&scales=1,1.25&flip=1", png, "image/png");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(json_of(r)["augmentation"], "scales 1,1.25 + flip");

  auto m = json_of(c.Get("/v1/model"));
  EXPECT_EQ(m["augmentation"]["flip"], true);
  EXPECT_EQ(m["augmentation"]["scales"], nlohmann::json({1.0}));
  EXPECT_EQ(m["limits"]["max_scales"], 3);

  expect_error(c.Post("/v1/segment?scales=abc", png, "image/png"), 400, "scales must be numbers", "not a number");
  expect_error(c.Post("/v1/segment?scales=1,", png, "image/png"), 400, "scales must be numbers", "empty item");
  expect_error(c.Post("/v1/segment?scales=1,%201.5", png, "image/png"), 400, "scales must be numbers", "a space");
  expect_error(c.Post("/v1/segment?scales=0.1", png, "image/png"), 400, "[0.25, 4]", "too small");
  expect_error(c.Post("/v1/segment?scales=nan", png, "image/png"), 400, "[0.25, 4]", "not finite");
  expect_error(c.Post("/v1/segment?scales=1,1,1,1", png, "image/png"), 400, "at most 3 scales", "too many");
  expect_error(c.Post("/v1/segment?flip=yes", png, "image/png"), 400, "flip must be 0 or 1", "flip");
  // 61×45 at 2× is 122×90 = 10980 pixels, over this server's 10000
  expect_error(c.Post("/v1/segment?scales=1,2", png, "image/png"), 413, "over the limit of 10000 pixels", "costly");
  r = c.Post("/v1/segment?scales=1.5", png, "image/png");  // 92×68 = 6256 pixels: within it
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;

  // a default the server cannot honour is refused at construction
  ServerOptions bad;
  bad.scales = {1.0, 1.25, 1.5};
  bad.max_scales = 2;
  EXPECT_THROW({ Server srv(test_predictor(100 * 100), bad); }, std::invalid_argument);
  bad.scales = {0.1};
  bad.max_scales = 4;
  EXPECT_THROW({ Server srv(test_predictor(100 * 100), bad); }, std::invalid_argument);
}

TEST(Serve, BadInputGetsA4xxJsonError) {
  fx::one_thread();
  ServerOptions o;
  o.max_bytes = 64 * 1024;
  RunningServer s(o, 100 * 100);
  auto c = s.client();
  auto img = fx::shapes_sample(40, 40, 4).first;
  const std::string png = encode_png(img), jpg = encode_jpeg(img);

  expect_error(c.Post("/v1/segment", "", "image/png"), 400, "empty", "empty body");
  expect_error(c.Post("/v1/segment"), 400, "empty", "no body at all");
  expect_error(c.Post("/v1/segment", "hello, I am text", "text/plain"), 415, "not an image", "text");
  expect_error(c.Post("/v1/segment", std::string("GIF89a\x01\x00\x01\x00\x80\x00\x00", 13), "image/gif"), 415, "GIF",
               "unsupported format");
  expect_error(c.Post("/v1/segment", png.substr(0, png.size() * 2 / 3), "image/png"), 400, "truncated", "truncated PNG");
  expect_error(c.Post("/v1/segment", jpg.substr(0, jpg.size() / 2), "image/jpeg"), 400, "truncated", "truncated JPEG");
  std::string corrupt = png;
  for (size_t i = 60; i + 20 < corrupt.size(); i += 5) corrupt[i] ^= 0x5A;
  expect_error(c.Post("/v1/segment", corrupt, "image/png"), 400, "corrupt", "corrupt PNG");
  const std::string big = encode_png(fx::shapes_sample(120, 100, 5).first);  // 12000 px, small file
  ASSERT_LT(big.size(), o.max_bytes);
  expect_error(c.Post("/v1/segment", big, "image/png"), 413, "pixels", "too many pixels");
  std::string huge(100 * 1024, 'x');
  expect_error(c.Post("/v1/segment", huge, "application/octet-stream"), 413, "too large", "over-size body");
  auto chunks = [&huge](size_t offset, httplib::DataSink& sink) {
    if (offset < huge.size()) sink.write(huge.data() + offset, std::min<size_t>(8192, huge.size() - offset));
    else sink.done();
    return true;
  };
  expect_error(s.client().Post("/v1/segment", chunks, "application/octet-stream"), 413, "too large",
               "over-size chunked body");
  // far over the limit: the server stops reading (the client may only see the connection close)
  std::string endless(1 << 20, 'y');
  auto flood = [&endless](size_t offset, httplib::DataSink& sink) {
    if (offset < endless.size()) sink.write(endless.data() + offset, std::min<size_t>(8192, endless.size() - offset));
    else sink.done();
    return true;
  };
  auto fr = s.client().Post("/v1/segment", flood, "application/octet-stream");
  if (fr) EXPECT_EQ(fr->status, 413);
  expect_error(c.Post("/v1/segment?format=webp", png, "image/png"), 400, "unknown format", "bad format");
  expect_error(c.Post("/v1/segment?format=overlay&alpha=2", png, "image/png"), 400, "alpha", "bad alpha");
  httplib::MultipartFormDataItems no_file = {{"note", "hello", "", ""}};
  expect_error(c.Post("/v1/segment", no_file), 400, "no file", "multipart form without a file");
  // the server is alive and well after all that
  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto ok = c.Post("/v1/segment", png, "image/png");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_GE(s.server().stats().client_errors, 10u);
  EXPECT_EQ(s.server().stats().server_errors, 0u);
}

TEST(Serve, HundredConcurrentRequestsAreAllAnsweredCorrectly) {
  fx::one_thread();
  ServerOptions o;
  o.max_queue = 128;
  RunningServer s(o);
  const auto& p = *test_predictor();
  const int N = 100;
  std::vector<std::string> bodies(N);
  std::vector<torch::Tensor> imgs;
  for (int i = 0; i < N; ++i) {
    imgs.push_back(fx::shapes_sample(32 + i % 2, 40, 1000 + i).first);
    bodies[i] = encode_png(imgs.back());
  }
  const auto expected = p.predict_batch(imgs);  // two forward passes instead of 100
  std::vector<int> status(N, 0);
  std::vector<std::string> got(N);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < N; ++i)
    threads.emplace_back([&, i] {
      auto c = s.client();
      ready++;
      while (ready < N) std::this_thread::yield();  // fire together
      auto r = c.Post("/v1/segment", bodies[i], "image/png");
      if (r) {
        status[i] = r->status;
        got[i] = r->body;
      } else {
        got[i] = "no response: " + httplib::to_string(r.error());
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < N; ++i) {
    ASSERT_EQ(status[i], 200) << "request " << i << ": " << got[i];
    auto ids = decode_image(got[i].data(), got[i].size()).squeeze(2);
    ASSERT_EQ(ids.sizes(), expected[i].labels.sizes()) << "request " << i;
    // a batch and a single call agree up to float rounding (see Predictor.Batch*)
    EXPECT_GE(fx::agreement(ids, expected[i].labels), 0.995) << "request " << i << " got someone else's answer";
  }
}

TEST(Serve, FullQueueAnswers503AndRecovers) {
  fx::one_thread();
  Gate gate;
  ServerOptions o;
  o.max_queue = 0;  // one engine, no waiting room: a second request is refused
  o.before_inference = [&] { gate.wait(); };
  RunningServer s(o);
  const std::string png = encode_png(fx::shapes_sample(40, 40, 8).first);
  int first = 0;
  std::thread t([&] {
    auto r = s.client().Post("/v1/segment", png, "image/png");
    first = r ? r->status : -1;
  });
  gate.wait_for_waiters(1);
  for (int i = 0; i < 3; ++i) {
    auto r = s.client().Post("/v1/segment", png, "image/png");
    expect_error(r, 503, "busy", "while the engine is busy");
    if (r) EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  }
  // cheap checks still answer while busy
  expect_error(s.client().Post("/v1/segment", "", "image/png"), 400, "empty", "empty body while busy");
  gate.release();
  t.join();
  EXPECT_EQ(first, 200);
  auto r = s.client().Post("/v1/segment", png, "image/png");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(s.server().stats().rejected_busy, 3u);
}

TEST(Serve, StopFinishesTheRequestsInFlight) {
  fx::one_thread();
  Gate gate;
  ServerOptions o;
  o.before_inference = [&] { gate.wait(); };
  auto s = std::make_unique<RunningServer>(o);
  const std::string png = encode_png(fx::shapes_sample(40, 40, 9).first);
  int status = 0;
  std::thread t([&] {
    auto r = s->client().Post("/v1/segment", png, "image/png");
    status = r ? r->status : -1;
  });
  gate.wait_for_waiters(1);
  s->server().stop();  // returns at once; the request in flight is still being served
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(s->done()) << "run() returned while a request was in flight";
  EXPECT_FALSE(s->client().Get("/healthz")) << "new connections are refused after stop()";
  gate.release();
  t.join();
  EXPECT_EQ(status, 200);
  s->wait();
  EXPECT_TRUE(s->done());
}

TEST(Serve, InvalidUtf8InThePathIsA404NotACrash) {
  fx::one_thread();
  RunningServer s;
  // percent-encoded and raw bytes that are not UTF-8; the 404 message quotes the path
  for (const std::string path : {"/%ff", "/%c0%ae%c0%ae/etc/passwd", "/\xff", "/caf\xe9?x=\xff", "/%ed%a0%80"}) {
    RawConn c(s.port());
    ASSERT_TRUE(c.ok());
    auto r = c.exchange("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    expect_raw_error(r, 404, "no such endpoint", path);
  }
  RawConn c(s.port());
  expect_raw_error(c.exchange("DELETE /%fe%ff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 404, "no such endpoint", "DELETE");
  // the server is alive and well after all that
  auto h = s.client().Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(s.server().stats().server_errors, 0u);
}

TEST(Serve, InvalidUtf8InAParameterIsA400) {
  fx::one_thread();
  RunningServer s;
  auto c = s.client();
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  expect_error(c.Post("/v1/segment?format=%ff", png, "image/png"), 400, "unknown format", "format");
  expect_error(c.Post("/v1/segment?format=%c0%ae", png, "image/png"), 400, "unknown format", "overlong format");
  expect_error(c.Post("/v1/segment?format=overlay&alpha=0.5%ff", png, "image/png"), 400, "alpha", "alpha");
  expect_error(c.Post("/v1/segment?format=json&image=%ff", png, "image/png"), 400, "image must be", "image");
  auto ok = c.Post("/v1/segment?format=json", png, "image/png");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(s.server().stats().server_errors, 0u);
}

// The in-process entry of the fuzz target (fuzz/fuzz_http.cpp): the same routing and answers
// as over a socket, several requests on one "connection", nothing sent after a Connection: close.
TEST(Serve, RequestBytesAreServedInProcessAsOneConnection) {
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  const std::string png = encode_png(fx::shapes_sample(40, 30, 4).first);
  const std::string post = "POST /v1/segment?format=json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                           "Content-Length: " + std::to_string(png.size()) + "\r\n\r\n" + png;
  const std::string out = server.handle_bytes("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + post +
                                              "GET /%ff HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" +
                                              "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::vector<std::string> status;
  for (size_t p = out.find("HTTP/1.1 "); p != std::string::npos; p = out.find("HTTP/1.1 ", p + 1))
    status.push_back(out.substr(p + 9, 3));
  EXPECT_EQ(status, (std::vector<std::string>{"200", "200", "404"})) << out.substr(0, 2000);
  EXPECT_NE(out.find("\"height\":40"), std::string::npos) << out.substr(0, 2000);  // shapes_sample(h, w)
  EXPECT_NE(out.find("\"width\":30"), std::string::npos);
  EXPECT_NE(out.find("no such endpoint"), std::string::npos);
  // malformed bytes: an error answer, not a crash or a hang
  const std::string bad = server.handle_bytes("GARBAGE\r\n\r\n");
  EXPECT_EQ(bad.rfind("HTTP/1.1 400", 0), 0u) << bad;
  EXPECT_EQ(server.stats().server_errors, 0u);
}

TEST(Serve, KeepAliveRequestsAreNotDelayedByNagle) {
  fx::one_thread();
  RunningServer s;
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  // A fresh connection per request: the baseline on this machine right now.
  std::vector<double> fresh;
  for (int i = 0; i < 5; ++i) {
    RawConn c(s.port());
    const auto t0 = Clock::now();
    ASSERT_EQ(c.exchange(get).status, 200);
    fresh.push_back(1e3 * seconds_since(t0));
  }
  RawConn c(s.port());
  ASSERT_EQ(c.exchange(get).status, 200);
  // The answer is written as a head and a body: with Nagle on, the body waits for the client's
  // delayed ACK (40 ms on Linux) on every reused connection's request.
  EXPECT_EQ(server_side_nodelay(s.port(), c.local_port()), 1) << "TCP_NODELAY is off on the accepted socket";
  std::vector<double> reused;
  for (int i = 0; i < 11; ++i) {
    const auto t0 = Clock::now();
    ASSERT_EQ(c.exchange(get).status, 200) << "request " << i;
    reused.push_back(1e3 * seconds_since(t0));
  }
  // Relative to the baseline, so that a loaded machine slows both alike.
  EXPECT_LT(median(reused), median(fresh) + 25) << "fresh " << median(fresh) << " ms, reused " << median(reused) << " ms";
}

TEST(Serve, SlowClientsDoNotHoldOffOthers) {
  fx::one_thread();
  ServerOptions o;
  o.head_timeout = 2;
  o.body_timeout = 2;
  o.min_body_rate = 1000;
  RunningServer s(o);
  // More slow connections than the default worker count (engines + max_queue + 8 = 41).
  const char* env = std::getenv("LIGHTSEG_SLOW_CLIENTS");
  const int n_head = env ? std::atoi(env) : 60, n_body = 4;
  std::vector<std::unique_ptr<RawConn>> slow;
  std::vector<RawConn*> raw;
  const auto t0 = Clock::now();
  for (int i = 0; i < n_head + n_body; ++i) {
    slow.push_back(std::make_unique<RawConn>(s.port()));
    ASSERT_TRUE(slow.back()->ok()) << "connection " << i;
    raw.push_back(slow.back().get());
    if (i < n_head)  // a head that never ends: one more byte of a header every 500 ms
      ASSERT_TRUE(slow.back()->send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "));
    else  // a complete head, then a body at 2 bytes/s
      ASSERT_TRUE(slow.back()->send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                                    "Content-Length: 100000\r\n\r\n"));
  }
  Trickler trickle(raw, std::chrono::milliseconds(500), std::chrono::seconds(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all accepted and reading

  // Normal clients meanwhile are answered promptly (generous bound: the machine may be loaded).
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    httplib::Client c("127.0.0.1", s.port());
    c.set_connection_timeout(10, 0);
    c.set_read_timeout(10, 0);
    const auto t = Clock::now();
    auto r = c.Get("/healthz");
    ms.push_back(1e3 * seconds_since(t));
    ASSERT_TRUE(r) << "request " << i << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_LT(ms.back(), 3000) << "request " << i;
  }
  std::sort(ms.begin(), ms.end());
  std::printf("/healthz with %d slow connections: median %.1f ms, max %.1f ms\n", n_head + n_body, ms[ms.size() / 2],
              ms.back());

  // The server closes every slow connection (still trickling) soon after its deadline: 2 s for a
  // head, 2 s + bytes / 1000 B/s for a body.
  const auto end = t0 + std::chrono::seconds(15);
  std::vector<bool> closed(slow.size(), false);
  size_t n_closed = 0;
  while (n_closed < slow.size() && Clock::now() < end) {
    for (size_t i = 0; i < slow.size(); ++i)
      if (!closed[i] && slow[i]->poll_closed()) {
        closed[i] = true;
        ++n_closed;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double took = seconds_since(t0);
  trickle.stop();
  EXPECT_EQ(n_closed, slow.size()) << "slow connections still open after " << took << " s";
  for (size_t i = 0; i < slow.size(); ++i) {
    // what a slow client gets, if anything, before the close: 408
    const std::string& got = slow[i]->received();
    if (!got.empty()) EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 408") << "connection " << i << ": " << got;
  }
  auto h = s.client().Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(Serve, OtherMethodsOnSegmentAre405) {
  fx::one_thread();
  RunningServer s;
  auto c = s.client();
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  auto check = [](const httplib::Result& r, const std::string& what) {
    expect_error(r, 405, "method not allowed", what);
    if (r) EXPECT_EQ(r->get_header_value("Allow"), "POST") << what;
  };
  check(c.Put("/v1/segment", png, "image/png"), "PUT");
  check(c.Patch("/v1/segment", png, "image/png"), "PATCH");
  check(c.Delete("/v1/segment"), "DELETE");
  check(c.Get("/v1/segment"), "GET");
  auto ok = c.Post("/v1/segment", png, "image/png");  // the same connection still works
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Serve, ABodySentToAnUnknownPathIsA404) {
  // also a form-encoded one over 8 KB (curl --data-binary's type), which httplib alone refuses as 413
  fx::one_thread();
  RunningServer s;
  const std::string body(20 * 1024, 'x');
  for (const char* type : {"application/x-www-form-urlencoded", "image/png"}) {
    auto c = s.client();
    expect_error(c.Post("/v1/segments", body, type), 404, "no such endpoint: POST /v1/segments", type);
    expect_error(s.client().Put("/nothing", body, type), 404, "no such endpoint: PUT /nothing", type);
  }
  auto small = s.client().Post("/nope", "a=1", "application/x-www-form-urlencoded");
  expect_error(small, 404, "no such endpoint", "a small form");
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  auto ok = s.client().Post("/v1/segment", png, "application/x-www-form-urlencoded");  // the endpoint itself still works
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Serve, OverLimitContentLengthIsRefusedAtOnce) {
  fx::one_thread();
  ServerOptions o;
  o.max_bytes = 64 * 1024;
  RunningServer s(o);
  const std::string head = "POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                           "Content-Length: 1048576\r\n";
  {  // Expect: 100-continue: a final 413 instead of "100 Continue" (then a 413 for the body sent for nothing)
    RawConn c(s.port());
    const auto t0 = Clock::now();
    auto r = c.exchange(head + "Expect: 100-continue\r\n\r\n", 30);
    expect_raw_error(r, 413, "too large", "Expect: 100-continue");
    EXPECT_LT(seconds_since(t0), 5);  // no waiting for a body (httplib's read timeout is 10 s)
  }
  {  // no Expect, no body sent yet: answered without waiting for the megabyte
    RawConn c(s.port());
    const auto t0 = Clock::now();
    auto r = c.exchange(head + "\r\n", 30);
    expect_raw_error(r, 413, "too large", "no body");
    EXPECT_LT(seconds_since(t0), 5);
  }
  auto h = s.client().Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// ---- issue 38: hostile and costly traffic ----

namespace {

// The status lines of every response in `out` (a connection's bytes).
std::vector<int> statuses_of(const std::string& out) {
  std::vector<int> st;
  for (size_t p = out.find("HTTP/1.1 "); p != std::string::npos; p = out.find("HTTP/1.1 ", p + 1))
    if (p == 0 || out.compare(p - 2, 2, "\r\n") == 0 || out[p - 1] == '}') st.push_back(std::atoi(out.c_str() + p + 9));
  return st;
}

const std::string kSmuggled = "GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

}  // namespace

TEST(Serve, HeadsOverTheSizeOrFieldCapAre431) {  // N1
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  std::string many = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 500; ++i) many += "X-a" + std::to_string(i) + ": b\r\n";
  std::string out = server.handle_bytes(many + "\r\n");
  EXPECT_EQ(statuses_of(out), std::vector<int>{431}) << out.substr(0, 300);
  std::string hundred = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";  // exactly the cap: 100 fields
  for (int i = 0; i < 99; ++i) hundred += "X-a" + std::to_string(i) + ": b\r\n";
  out = server.handle_bytes(hundred + "\r\n");
  EXPECT_EQ(statuses_of(out), std::vector<int>{200}) << out.substr(0, 300);
  std::string big = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 20; ++i) big += "X-b" + std::to_string(i) + ": " + std::string(4000, 'b') + "\r\n";
  out = server.handle_bytes(big + "\r\n");
  EXPECT_EQ(statuses_of(out), std::vector<int>{431}) << out.substr(0, 300);
  // a request line that never ends
  out = server.handle_bytes("GET /" + std::string(100000, 'a'));
  EXPECT_EQ(statuses_of(out), std::vector<int>{431}) << out.substr(0, 300);
}

TEST(Serve, HeaderFloodsAreRefusedWhileTheyLast) {  // N1 over a socket: the flood never stops
  fx::one_thread();
  RunningServer s;
  RawConn c(s.port());
  ASSERT_TRUE(c.send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += "X-a" + std::to_string(i) + ": b\r\n";
  const auto t0 = Clock::now();
  bool answered = false;
  while (seconds_since(t0) < 8 && !answered) {
    c.send_nowait(lines);  // as fast as the socket takes them
    answered = c.poll_closed() || c.received().find("\r\n\r\n") != std::string::npos;
  }
  const double took = seconds_since(t0);
  ASSERT_TRUE(answered) << "no answer while the head kept coming for " << took << " s";
  EXPECT_LT(took, 6);
  EXPECT_EQ(c.received().substr(0, 12), "HTTP/1.1 431") << c.received().substr(0, 200);
  EXPECT_TRUE(c.wait_closed(5));
}

TEST(Serve, ContentLengthThatIsNotOneNumberIsRefused) {  // N3: the four smuggling variants
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  const std::string body = "hello" + kSmuggled;
  for (const std::string lengths : {"Content-Length: 5\r\nContent-Length: " + std::to_string(body.size()) + "\r\n",
                                    std::string("Content-Length: +5\r\n"), std::string("Content-Length: 5abc\r\n"),
                                    std::string("Content-Length: 0x5\r\n"), std::string("Content-Length: 5, 5\r\n"),
                                    std::string("Content-Length: -1\r\n")}) {
    SCOPED_TRACE(lengths);
    const std::string out = server.handle_bytes("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n" +
                                                lengths + "\r\n" + body);
    EXPECT_EQ(statuses_of(out), std::vector<int>{400}) << out.substr(0, 400);
    EXPECT_NE(out.find("Connection: close"), std::string::npos);
    EXPECT_EQ(out.find("\"classes\""), std::string::npos) << "the smuggled GET /v1/model was served";
  }
  // the same value twice is one value
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  const std::string n = std::to_string(png.size());
  const std::string out = server.handle_bytes("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                                              "Content-Length: " + n + "\r\nContent-Length: " + n + "\r\n\r\n" + png);
  EXPECT_EQ(statuses_of(out), std::vector<int>{200}) << out.substr(0, 400);
}

TEST(Serve, TransferEncodingIsChunkedInAnyCaseOrRefused) {  // N4
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  const std::string png = encode_png(fx::shapes_sample(40, 30, 4).first);
  auto hex = [](size_t n) {
    char b[32];
    std::snprintf(b, sizeof b, "%zx", n);
    return std::string(b);
  };
  const std::string half = png.substr(0, png.size() / 2), rest = png.substr(png.size() / 2);
  const std::string chunks = hex(half.size()) + "\r\n" + half + "\r\n" + hex(rest.size()) + ";ext=1\r\n" + rest + "\r\n0\r\n";
  const std::string head = "POST /v1/segment?format=json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n";
  for (const char* te : {"chunked", "Chunked", "CHUNKED"}) {
    SCOPED_TRACE(te);
    const std::string out = server.handle_bytes(head + "Transfer-Encoding: " + te + "\r\n\r\n" + chunks + "\r\n" +
                                                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    EXPECT_EQ(statuses_of(out), (std::vector<int>{200, 200})) << out.substr(0, 400);
    EXPECT_NE(out.find("\"width\":30"), std::string::npos) << out.substr(0, 400);
  }
  {  // a trailer
    const std::string out = server.handle_bytes(head + "Transfer-Encoding: chunked\r\n\r\n" + chunks +
                                                "X-Checksum: 1\r\nX-Other: 2\r\n\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out), (std::vector<int>{200, 200})) << out.substr(0, 400);
    EXPECT_NE(out.find("\"width\":30"), std::string::npos) << out.substr(0, 400);
  }
  for (const char* te : {"gzip, chunked", "chunked, identity", "xchunked", "identity", "chunked, chunked"}) {
    SCOPED_TRACE(te);
    const std::string out = server.handle_bytes(head + "Transfer-Encoding: " + te + "\r\n\r\n" + chunks + "\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out), std::vector<int>{501}) << out.substr(0, 400);
    EXPECT_NE(out.find("Connection: close"), std::string::npos);
  }
  {  // two Transfer-Encoding fields, and one beside a Content-Length
    std::string out = server.handle_bytes(head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks +
                                          "\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out), std::vector<int>{501}) << out.substr(0, 400);
    out = server.handle_bytes(head + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunks + "\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out), std::vector<int>{400}) << out.substr(0, 400);
  }
  {  // malformed chunks: 400 and closed
    const std::string out = server.handle_bytes(head + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out), std::vector<int>{400}) << out.substr(0, 400);
  }
}

TEST(Serve, ABodyLeftUnreadClosesTheConnection) {  // N3/N4: what a handler does not read is not a request
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  for (const std::string method : {"GET /healthz", "GET /v1/model", "GET /"}) {
    SCOPED_TRACE(method);
    const std::string out = server.handle_bytes(method + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                                                std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled);
    EXPECT_EQ(statuses_of(out).size(), 1u) << out.substr(0, 400);
    EXPECT_NE(out.find("Connection: close"), std::string::npos);
  }
}

TEST(Serve, ContentEncodingAndRangesAreNotServed) {  // minor points of issue 38
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  const std::string head = "POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: " +
                           std::to_string(png.size()) + "\r\n";
  for (const char* enc : {"deflate", "gzip, gzip", "br"}) {
    SCOPED_TRACE(enc);
    const std::string out = server.handle_bytes(head + "Content-Encoding: " + enc + "\r\n\r\n" + png);
    EXPECT_EQ(statuses_of(out), std::vector<int>{415}) << out.substr(0, 400);
  }
  const std::string out = server.handle_bytes(head + "Range: bytes=0-9\r\n\r\n" + png);
  EXPECT_EQ(statuses_of(out), std::vector<int>{200}) << out.substr(0, 400);
}

TEST(Serve, SlowUploadsDoNotHoldOffANormalRequest) {  // N2
  fx::one_thread();
  ServerOptions o;
  o.http_threads = 2;       // body slots
  o.body_timeout = 30;      // the slow ones would hold their slots for 30 s
  o.min_body_rate = 1;
  RunningServer s(o);
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  std::vector<std::unique_ptr<RawConn>> slow;
  std::vector<RawConn*> raw;
  for (int i = 0; i < 4; ++i) {  // 2 trickle a body; 2 send a head and then nothing
    slow.push_back(std::make_unique<RawConn>(s.port()));
    ASSERT_TRUE(slow.back()->send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                                  "Content-Length: 100000\r\n\r\n" + std::string(i < 2 ? "x" : "")));
    if (i < 2) raw.push_back(slow.back().get());
  }
  Trickler trickle(raw, std::chrono::milliseconds(200), std::chrono::seconds(40));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(5, 0);
  const auto t0 = Clock::now();
  auto r = c.Post("/v1/segment", png, "image/png");
  const double took = seconds_since(t0);
  ASSERT_TRUE(r) << "no answer in " << took << " s: " << httplib::to_string(r.error());
  EXPECT_TRUE(r->status == 200 || r->status == 503) << r->status << " " << r->body;
  EXPECT_LT(took, 3);
  if (r->status == 503) EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  trickle.stop();
}

TEST(Serve, CostlyRequestsAreRefusedAndQueueTimeIsReportedApart) {  // N5
  fx::one_thread();
  RunningServer s({}, 100 * 100);  // max_pixels 10000: a request may cost 20000 pixels of passes
  auto c = s.client();
  const std::string png = encode_png(fx::shapes_sample(60, 60, 3).first);
  // 75² + 90², twice (flip): 27450
  expect_error(c.Post("/v1/segment?scales=1.25,1.5&flip=1", png, "image/png"), 413, "costs 27450 pixels", "costly");
  auto r = c.Post("/v1/segment?scales=1,1.25", png, "image/png");  // 3600 + 75² = 9225
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(r->get_header_value("X-Queue-Ms").empty());
  EXPECT_FALSE(r->get_header_value("X-Inference-Ms").empty());
  auto j = json_of(c.Post("/v1/segment?format=json", png, "image/png"));
  EXPECT_TRUE(j["latency_ms"].contains("queue")) << j.dump();
}

TEST(Serve, ScalesAreSnappedToAGridAndDeduplicated) {  // N5/N6: few shapes
  fx::one_thread();
  RunningServer s;
  auto c = s.client();
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  auto r = c.Post("/v1/segment?scales=1.93,1.95,1.97,1.99&flip=1", png, "image/png");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Augmentation"), "scales 2 + flip");
  r = c.Post("/v1/segment?scales=1.1,0.9,1", png, "image/png");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Augmentation"), "none");
}

TEST(Serve, OtherSitesCannotReachItThroughABrowser) {  // N11
  fx::one_thread();
  RunningServer s;
  const std::string png = encode_png(fx::shapes_sample(40, 40, 4).first);
  auto get = [&](const std::string& host) {
    RawConn c(s.port());
    return c.exchange("GET /v1/model HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
  };
  expect_raw_error(get("evil.example"), 421, "not this server's", "DNS rebinding");
  expect_raw_error(get("evil.example:" + std::to_string(s.port())), 421, "not this server's", "with a port");
  for (const std::string ok : {"127.0.0.1:" + std::to_string(s.port()), std::string("localhost"), std::string("[::1]:80")})
    EXPECT_EQ(get(ok).status, 200) << ok;
  auto c = s.client();
  const std::string self = "http://127.0.0.1:" + std::to_string(s.port());
  expect_error(c.Post("/v1/segment", {{"Origin", "http://evil.example"}}, png, "text/plain"), 403, "cross-origin", "Origin");
  expect_error(c.Post("/v1/segment", {{"Origin", "null"}}, png, "text/plain"), 403, "cross-origin", "Origin null");
  expect_error(c.Post("/v1/segment", {{"Sec-Fetch-Site", "cross-site"}}, png, "image/png"), 403, "cross-site", "fetch");
  auto r = c.Post("/v1/segment", {{"Origin", self}, {"Sec-Fetch-Site", "same-origin"}}, png, "image/png");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_EQ(page->get_header_value("X-Content-Type-Options"), "nosniff");
  auto e = c.Get("/nope");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->get_header_value("X-Content-Type-Options"), "nosniff");
}

TEST(Serve, HeadDeadlineHoldsWhileBytesKeepComing) {  // N1: the deadline on every read, not only when poll waits
  fx::one_thread();
  ServerOptions o;
  o.head_timeout = 1;
  o.max_head_bytes = size_t(1) << 30;  // no size cap to stop it first
  o.max_header_lines = 1 << 30;
  RunningServer s(o);
  RawConn c(s.port());
  ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += "X-a" + std::to_string(i) + ": b\r\n";
  const auto t0 = Clock::now();
  bool answered = false;
  while (seconds_since(t0) < 8 && !answered) {
    c.send_nowait(lines);
    answered = c.poll_closed() || c.received().find("\r\n\r\n") != std::string::npos;
  }
  const double took = seconds_since(t0);
  ASSERT_TRUE(answered) << "no answer while the head kept coming for " << took << " s";
  EXPECT_LT(took, 3);
  EXPECT_EQ(c.received().substr(0, 12), "HTTP/1.1 408") << c.received().substr(0, 200);
}

TEST(Serve, UploadsHaveATotalDeadline) {  // N2: a body at just over the minimum rate still ends
  fx::one_thread();
  ServerOptions o;
  o.min_body_rate = 10;
  o.upload_timeout = 1.5;
  RunningServer s(o);
  RawConn c(s.port());
  ASSERT_TRUE(c.send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\nx"));
  Trickler trickle({&c}, std::chrono::milliseconds(50), std::chrono::seconds(10));  // 20 B/s
  const auto t0 = Clock::now();
  auto r = c.read_reply(8);
  const double took = seconds_since(t0);
  trickle.stop();
  expect_raw_error(r, 408, "within 1.5 s in all", "total deadline");
  EXPECT_LT(took, 4);
}

TEST(Serve, AQueuedRequestWaitsAtMostQueueTimeout) {  // N5: the queue wait has a deadline
  fx::one_thread();
  Gate gate;
  ServerOptions o;
  o.queue_timeout = 0.5;
  o.before_inference = [&] { gate.wait(); };
  RunningServer s(o);
  const std::string png = encode_png(fx::shapes_sample(40, 40, 8).first);
  int first = 0;
  std::thread t([&] {
    auto r = s.client().Post("/v1/segment", png, "image/png");
    first = r ? r->status : -1;
  });
  gate.wait_for_waiters(1);
  const auto t0 = Clock::now();
  auto r = s.client().Post("/v1/segment", png, "image/png");
  expect_error(r, 503, "in the queue", "queued behind a long one");
  if (r) EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_LT(seconds_since(t0), 3);
  gate.release();
  t.join();
  EXPECT_EQ(first, 200);
}

TEST(Serve, TheCostBudgetRefusesWhatDoesNotFit) {  // N5: admission by cost, not count
  fx::one_thread();
  Gate gate;
  ServerOptions o;
  o.max_cost = 3000;
  o.max_request_cost = 3000;
  o.before_inference = [&] { gate.wait(); };
  RunningServer s(o);
  const std::string big = encode_png(fx::shapes_sample(40, 40, 8).first);    // 1600
  const std::string small = encode_png(fx::shapes_sample(32, 32, 8).first);  // 1024
  int first = 0;
  std::thread t([&] {
    auto r = s.client().Post("/v1/segment", big, "image/png");
    first = r ? r->status : -1;
  });
  gate.wait_for_waiters(1);
  expect_error(s.client().Post("/v1/segment", big, "image/png"), 503, "cost budget", "1600 + 1600 > 3000");
  int second = 0;
  std::thread t2([&] {  // 1600 + 1024 fits: admitted, waits its turn
    auto r = s.client().Post("/v1/segment", small, "image/png");
    second = r ? r->status : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  gate.release();
  t.join();
  t2.join();
  EXPECT_EQ(first, 200);
  EXPECT_EQ(second, 200);
}

TEST(Serve, WorkForAClientThatHasGoneIsDropped) {  // N5
  fx::one_thread();
  Gate gate;
  ServerOptions o;
  std::atomic<int> ran{0};
  o.before_inference = [&] {
    if (ran++ == 0) gate.wait();
  };
  RunningServer s(o);
  const std::string png = encode_png(fx::shapes_sample(40, 40, 8).first);
  std::thread t([&] { s.client().Post("/v1/segment", png, "image/png"); });
  gate.wait_for_waiters(1);
  {
    RawConn c(s.port());  // queued behind the first, then gone
    ASSERT_TRUE(c.send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: " +
                       std::to_string(png.size()) + "\r\n\r\n" + png));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  gate.release();
  t.join();
  for (int i = 0; i < 50 && s.server().stats().dropped == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(s.server().stats().dropped, 1u);
  EXPECT_EQ(ran.load(), 1) << "the forward pass of the gone client ran";
}

TEST(Serve, ThePlanCacheKeepsTheShapesThatComeBack) {  // N6: 20 sizes in turn do not evict a size in use
  fx::one_thread();
  EngineOptions eo;
  eo.backend = "onednn";
  eo.profile = true;  // the profile names each cached plan and its calls
  std::unique_ptr<InferenceEngine> engine;
  try {
    engine = make_engine(fx::random_network(), ModelMeta::camvid(), eo);
  } catch (const std::invalid_argument& e) {
    GTEST_SKIP() << "no onednn backend here: " << e.what();
  }
  const auto small = torch::rand({1, 3, 48, 64});
  for (int i = 0; i < 20; ++i) {
    engine->logits(small);
    engine->logits(torch::rand({1, 3, 40 + 4 * i, 56 + 4 * i}));  // a new shape each time
  }
  engine->logits(small);
  const std::string report = engine->profile();
  // one plan served all 21 calls (a rebuilt plan counts from 0 again)
  const size_t at = report.find("onednn plan 1x48x64: ");
  ASSERT_NE(at, std::string::npos) << report.substr(0, 600);
  EXPECT_GE(std::atoi(report.c_str() + at + 21), 21) << report.substr(at, 100);
}

TEST(Serve, TheHttpFuzzSeedsGetNoServerError) {  // fuzz/corpus/http, as fuzz_http checks them, without a fuzzer build
  fx::one_thread();
  Server server(test_predictor(), ServerOptions{});
  const fs::path dir = fs::path(LIGHTSEG_SOURCE_DIR) / "fuzz" / "corpus" / "http";
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    SCOPED_TRACE(e.path().filename().string());
    std::ifstream f(e.path(), std::ios::binary);
    const std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string out = server.handle_bytes(in);
    EXPECT_FALSE(out.empty());
    for (int st : statuses_of(out)) EXPECT_TRUE(st < 500 || st == 501 || st == 503) << st;
    ++n;
  }
  EXPECT_GE(n, 29u);
  EXPECT_EQ(server.stats().server_errors, 0u);
}

TEST(Serve, AllowedHostsExtendTheHostCheck) {  // N11
  fx::one_thread();
  ServerOptions o;
  o.allowed_hosts = {"seg.example"};
  RunningServer s(o);
  auto get = [&](const std::string& host) {
    RawConn c(s.port());
    return c.exchange("GET /healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n").status;
  };
  EXPECT_EQ(get("seg.example:8080"), 200);
  EXPECT_EQ(get("SEG.example"), 200);
  EXPECT_EQ(get("other.example"), 421);
}

namespace {

// `lightseg serve` as a child process with its stdout on a pipe.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string err_path;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out_fd >= 0) ::close(out_fd);
  }
  // Reads stdout until `needle` appears (or timeout); returns what was read.
  std::string read_until(const std::string& needle, int timeout_s) {
    std::string got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    ::fcntl(out_fd, F_SETFL, O_NONBLOCK);
    char buf[512];
    while (got.find(needle) == std::string::npos && std::chrono::steady_clock::now() < end) {
      ssize_t n = ::read(out_fd, buf, sizeof buf);
      if (n > 0) got.append(buf, n);
      else if (n == 0) break;
      else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return got;
  }
  // Waits for exit; returns the exit code, or -1 on timeout.
  int wait_exit(int timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
};

std::unique_ptr<Child> spawn_serve(const std::vector<std::string>& args, const fs::path& dir) {
  int fds[2];
  if (::pipe(fds) != 0) return nullptr;
  auto c = std::make_unique<Child>();
  c->err_path = (dir / "serve_stderr.txt").string();
  c->pid = ::fork();
  if (c->pid == 0) {
    ::dup2(fds[1], 1);
    int err = ::open(c->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err, 2);
    ::close(fds[0]);
    std::vector<char*> argv;
    std::string exe = LIGHTSEG_CLI;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  c->out_fd = fds[0];
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(ServeCli, SigtermFinishesAndExitsCleanly) {
  fx::one_thread();
  auto dir = fx::temp_dir("serve_cli");
  const std::string weights = fx::random_weights(dir);
  auto child = spawn_serve({"serve", "--weights", weights, "--port", "0", "--threads", "1"}, dir);
  ASSERT_TRUE(child);
  std::string line = child->read_until("/ (Ctrl-C", 60);
  auto at = line.find("http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << line << slurp(child->err_path);
  const int port = std::stoi(line.substr(at + 17));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  // a request in flight when SIGTERM arrives is still answered
  const std::string png = encode_png(fx::shapes_sample(360, 480, 2).first);
  int status = 0;
  std::thread t([&] {
    httplib::Client c2("127.0.0.1", port);
    c2.set_read_timeout(30, 0);
    auto r = c2.Post("/v1/segment", png, "image/png");
    status = r ? r->status : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // accepted and being served (one thread: ~1 s)
  ::kill(child->pid, SIGTERM);
  t.join();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(child->wait_exit(20), 0) << slurp(child->err_path);
  const std::string err = slurp(child->err_path);
  EXPECT_NE(err.find("SIGTERM"), std::string::npos) << err;
  EXPECT_NE(err.find("stopped:"), std::string::npos) << err;

  // a port already in use is a clear error, not a crash
  httplib::Server blocker;
  const int used = blocker.bind_to_any_port("127.0.0.1");
  auto r = fx::run_cli({"serve", "--weights", weights, "--port", std::to_string(used)}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: cannot listen on 127.0.0.1:" + std::to_string(used)), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(ServeCli, SigtermClosesSlowConnectionsAfterTheGracePeriod) {
  fx::one_thread();
  auto dir = fx::temp_dir("serve_grace");
  const std::string weights = fx::random_weights(dir);
  auto child = spawn_serve({"serve", "--weights", weights, "--port", "0", "--threads", "1", "--grace", "2"}, dir);
  ASSERT_TRUE(child);
  std::string line = child->read_until("/ (Ctrl-C", 60);
  auto at = line.find("http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << line << slurp(child->err_path);
  const int port = std::stoi(line.substr(at + 17));
  // A body trickling at 2 bytes/s (its own deadline is minutes away) and a head trickling too.
  RawConn body(port), head(port);
  ASSERT_TRUE(body.ok() && head.ok());
  ASSERT_TRUE(body.send("POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                        "Content-Length: 1000000\r\n\r\n"));
  ASSERT_TRUE(head.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "));
  Trickler trickle({&body, &head}, std::chrono::milliseconds(500), std::chrono::seconds(40));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = Clock::now();
  ::kill(child->pid, SIGTERM);
  const int code = child->wait_exit(30);
  const double took = seconds_since(t0);
  trickle.stop();
  std::printf("exit %.1f s after SIGTERM with --grace 2 and two trickling connections\n", took);
  EXPECT_EQ(code, 0) << slurp(child->err_path);
  EXPECT_LT(took, 2 + 6) << "exit took " << took << " s with --grace 2";
  EXPECT_TRUE(body.wait_closed(5));
  EXPECT_TRUE(head.wait_closed(5));
  const std::string err = slurp(child->err_path);
  EXPECT_NE(err.find("stopped:"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(WebPage, UploadAnImageAndSeeTheOverlay) {
  fx::one_thread();
  // Headless Debian chromium driven by playwright-core (tests/web/upload_test.mjs).
  const char* env_chromium = std::getenv("LIGHTSEG_CHROMIUM");
  const std::string chromium = env_chromium ? env_chromium : "/usr/bin/chromium";
  const fs::path web = fs::path(LIGHTSEG_SOURCE_DIR) / "tests" / "web";
  if (!fs::exists(chromium)) GTEST_SKIP() << "web page test skipped: no chromium at " << chromium << " (apt-get install chromium)";
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "web page test skipped: node is not installed";
  if (!fs::exists(web / "node_modules" / "playwright-core"))
    GTEST_SKIP() << "web page test skipped: playwright-core is missing (npm ci --prefix tests/web)";

  auto dir = fx::temp_dir("web");
  fs::path image = fs::path(LIGHTSEG_SOURCE_DIR) / "examples" / "0016E5_07959.png";
  if (!fs::exists(image)) {
    image = dir / "street.png";
    write_png(image.string(), fx::shapes_sample(180, 240, 3).first);
  }
  std::ofstream(dir / "notes.txt") << "not an image";
  RunningServer s;
  const char* keep = std::getenv("LIGHTSEG_WEB_SCREENSHOT");
  const std::string shot = keep ? keep : (dir / "web.png").string();
  const std::string cmd = "timeout 120 node " + fx::shell_quote((web / "upload_test.mjs").string()) + " --url http://127.0.0.1:" +
                          std::to_string(s.port()) + "/ --image " + fx::shell_quote(image.string()) + " --bad " +
                          fx::shell_quote((dir / "notes.txt").string()) + " --chromium " + fx::shell_quote(chromium) +
                          " --screenshot " + fx::shell_quote(shot) + " > " + fx::shell_quote((dir / "node.txt").string()) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = slurp((dir / "node.txt").string());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "web page test skipped: " << log;
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << log;
  EXPECT_NE(log.find("overlay shown"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(shot));
  if (!keep) fs::remove_all(dir);
}

#else

#include <gtest/gtest.h>

TEST(Serve, NotBuilt) { GTEST_SKIP() << "built without cpp-httplib: lightseg serve is not available"; }

#endif

// PredictorOptions::input_size (serve --input-size): reported in GET /v1/model, and the labels
// come back at the upload's own size.
TEST(Serve, InputSizeIsReportedAndLabelsAreAtTheUploadSize) {
  fx::one_thread();
  PredictorOptions po;
  po.max_pixels = 4096 * 1024;
  po.input_size = InputSize::parse("48x64");
  auto pred = std::make_shared<const Predictor>(fx::random_network(), ModelMeta::camvid(), po);
  ServerOptions o;
  o.port = 0;
  Server server(pred, o);
  const int port = server.bind();
  std::thread t([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto m = json_of(c.Get("/v1/model"));
  EXPECT_EQ(m["input_size"]["height"], 48);
  EXPECT_EQ(m["input_size"]["width"], 64);
  EXPECT_EQ(m["input_size"]["longest_side"], false);
  EXPECT_EQ(m["input_size"]["text"], "48x64");
  auto img = fx::shapes_sample(75, 101, 4).first;
  auto r = c.Post("/v1/segment", encode_png(img), "image/png");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "");
  auto ids = decode_image(r->body.data(), r->body.size());
  EXPECT_EQ(ids.size(0), 75);
  EXPECT_EQ(ids.size(1), 101);
  EXPECT_TRUE(ids.squeeze(2).equal(pred->predict(img).labels));
  server.stop();
  t.join();
}
