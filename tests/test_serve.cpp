// `lightseg serve` over real HTTP on 127.0.0.1: health, model and page, formats, test-time
// augmentation, bad input, load, the queue, shutdown, slow clients, input size.
#include "lightseg/features.h"

#if LIGHTSEG_HAVE_SERVER

#include <gtest/gtest.h>

#include "serve_fixtures.h"

using namespace lightseg;
using namespace lightseg::serve_fixtures;

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

#else

#include <gtest/gtest.h>

TEST(Serve, NotBuilt) { GTEST_SKIP() << "built without cpp-httplib: lightseg serve is not available"; }

#endif  // LIGHTSEG_HAVE_SERVER
