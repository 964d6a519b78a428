// `lightseg serve` against hostile and costly traffic (issue 38: N1-N11): header floods,
// smuggling framings, slow uploads, costly augmentation, the cost budget, the host check.
#include "lightseg/features.h"

#if LIGHTSEG_HAVE_SERVER

#include <gtest/gtest.h>

#include "serve_fixtures.h"

using namespace lightseg;
using namespace lightseg::serve_fixtures;


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


#endif  // LIGHTSEG_HAVE_SERVER
