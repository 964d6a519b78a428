// lightseg serve: the HTTP service (cpp-httplib). See include/lightseg/serve.h.
#include "lightseg/serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <mutex>

#include <arpa/inet.h>

#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "core/json_io.h"
#include "infer/tta.h"
#include "serve/http_server.h"
#include "serve/web_page.h"
#include "serve/http_text.h"

namespace lightseg {

using namespace serve_text;

struct Server::Impl {
  std::shared_ptr<const Predictor> pred;
  ServerOptions opt;
  HttpServer http;
  std::string model_json;
  int slots = 0;                 // engines + max_queue: requests past admission at most
  int64_t max_cost = 0, max_request_cost = 0;
  int port = -1;
  std::atomic<uint64_t> n_requests{0}, n_ok{0}, n_client{0}, n_server{0}, n_dropped{0};
  mutable std::atomic<uint64_t> n_busy{0};

  // The queue in front of the engines: admission against a count and a cost, then a FIFO wait
  // for one of `engines` turns (bounded by queue_timeout; given up when the client goes).
  std::mutex qmu;
  std::condition_variable qcv;
  int n_admitted = 0;           // guarded by qmu, as are the four below
  int64_t cost_admitted = 0;
  int running = 0;
  std::deque<uint64_t> waiting;  // tickets, in arrival order
  uint64_t next_ticket = 0;

  void log(const std::string& line) const {
    if (opt.log) opt.log(line);
  }

  // An admitted request: its cost counts until it is destroyed, its engine turn (if taken) too.
  struct Admission {
    Impl& s;
    int64_t cost;
    bool turn = false;
    void end_turn() {
      if (!turn) return;
      std::lock_guard<std::mutex> l(s.qmu);
      turn = false;
      --s.running;
      s.qcv.notify_all();
    }
    ~Admission() {
      end_turn();
      std::lock_guard<std::mutex> l(s.qmu);
      --s.n_admitted;
      s.cost_admitted -= cost;
      s.qcv.notify_all();
    }
  };

  [[noreturn]] void busy(httplib::Response& res, const std::string& why) const {
    n_busy++;
    res.set_header("Retry-After", "1");
    throw HttpError{503, "busy: " + why + "; retry later"};
  }

  // Admits a request of `cost` or answers 503 at once.
  std::unique_ptr<Admission> admit(int64_t cost, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> l(qmu);
      if (n_admitted < slots && cost_admitted + cost <= max_cost) {
        ++n_admitted;
        cost_admitted += cost;
        return std::unique_ptr<Admission>(new Admission{*this, cost});
      }
    }
    busy(res, n_admitted >= slots ? std::to_string(opt.max_queue) + " requests are already waiting"
                                  : "the requests already admitted use the cost budget (" + std::to_string(max_cost) +
                                        " pixels of forward passes)");
  }

  // Waits for an engine turn, in arrival order: 503 after queue_timeout; false when the client
  // has gone (its work is dropped).
  bool take_turn(Admission& a, httplib::Response& res) {
    const int engines = pred->options().engines;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt.queue_timeout));
    std::unique_lock<std::mutex> l(qmu);
    const uint64_t ticket = next_ticket++;
    waiting.push_back(ticket);
    auto leave = [&] {
      waiting.erase(std::find(waiting.begin(), waiting.end(), ticket));
      qcv.notify_all();
    };
    for (;;) {
      if (running < engines && waiting.front() == ticket) break;
      if (Clock::now() >= deadline) {
        leave();
        l.unlock();
        busy(res, "waited " + seconds_text(opt.queue_timeout) + " s in the queue for the network");
      }
      qcv.wait_for(l, std::chrono::milliseconds(100));
      if (running < engines && waiting.front() == ticket) break;
      l.unlock();
      const bool gone = HttpServer::client_gone();
      l.lock();
      if (gone) {
        leave();
        return false;
      }
    }
    waiting.pop_front();
    ++running;
    a.turn = true;
    qcv.notify_all();
    return true;
  }

  // The image: the raw body, or a file of a multipart form (field "image", else the first file).
  // Read through a content reader, not httplib's own body handling, which refuses
  // form-urlencoded bodies over 8 KiB (curl --data-binary's default content type).
  // httplib enforces max_bytes either way (413).
  std::string read_image_body(const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) const {
    std::string body;
    if (HttpServer::request_framing() == BodyFraming::None) return body;  // no body at all
    // httplib checks Content-Length against max_bytes, not chunked bodies: count here too. An
    // over-size chunked body is read on and dropped (up to max_bytes more) so that the client,
    // still sending, gets to read the 413 instead of a reset connection.
    size_t total = 0;
    bool too_big = false;
    auto count = [&](size_t n) {
      total += n;
      too_big = too_big || total > opt.max_bytes;
      return total <= 2 * opt.max_bytes;
    };
    bool ok = true;
    if (req.is_multipart_form_data()) {
      std::vector<httplib::MultipartFormData> parts;
      ok = reader(
          [&](const httplib::MultipartFormData& f) {
            parts.push_back(f);
            return true;
          },
          [&](const char* data, size_t n) {
            if (!count(n)) return false;
            if (!too_big) parts.back().content.append(data, n);
            return true;
          });
      if (ok && !too_big) {
        auto it = std::find_if(parts.begin(), parts.end(), [](const auto& f) { return f.name == "image"; });
        if (it == parts.end())
          it = std::find_if(parts.begin(), parts.end(), [](const auto& f) { return !f.filename.empty(); });
        if (it == parts.end())
          throw HttpError{400, "the multipart form has no file (send the image as a file field, e.g. \"image\")"};
        body = std::move(it->content);
      }
    } else {
      ok = reader([&](const char* data, size_t n) {
        if (!count(n)) return false;
        if (!too_big) body.append(data, n);
        return true;
      });
    }
    if (too_big && ok) throw HttpError{413, ""};  // read to the end: the connection stays usable
    if (!ok) {
      res.set_header("Connection", "close");  // the rest of the body was not read
      if (too_big || res.status == 413) throw HttpError{413, ""};  // message from the error handler
      if (HttpServer::request_busy())
        busy(res, "every body slot is taken by uploads in progress (" + std::to_string(opt.http_threads > 0 ? opt.http_threads : slots + 8) + ")");
      if (HttpServer::request_timed_out())
        throw HttpError{408, "the request body arrived too slowly (it is due within " + seconds_text(opt.body_timeout) +
                                 " s plus 1 s per " + std::to_string(opt.min_body_rate) + " bytes, and within " +
                                 seconds_text(opt.upload_timeout) + " s in all)"};
      throw HttpError{400, "the request body could not be read (malformed or interrupted upload)"};
    }
    return body;
  }

  // The request's &scales=S1,S2,..&flip=0|1, each defaulting to the server's, snapped to the
  // grid (so that passes come in few shapes).
  Augmentation augmentation(const httplib::Request& req) const {
    try {
      return Augmentation::parse(req.has_param("scales") ? req.get_param_value("scales") : "",
                                 req.has_param("flip") ? req.get_param_value("flip") : "", {opt.scales, opt.flip},
                                 opt.max_scales)
          .snapped(opt.scale_grid);
    } catch (const std::invalid_argument& e) {
      throw HttpError{400, e.what()};
    }
  }

  void segment(const httplib::Request& req, httplib::Response& res, const std::string& image) {
    const auto t0 = Clock::now();
    const std::string format = req.has_param("format") ? req.get_param_value("format") : "ids";
    if (format != "ids" && format != "color" && format != "overlay" && format != "json")
      throw HttpError{400, "unknown format '" + shown(format) + "' (expected ids, color, overlay or json)"};
    double alpha = 0.5;
    if (req.has_param("alpha")) {
      const std::string a = req.get_param_value("alpha");
      try {
        size_t used = 0;
        alpha = std::stod(a, &used);
        if (used != a.size()) throw std::invalid_argument(a);
      } catch (const std::exception&) {
        throw HttpError{400, "alpha must be a number in [0, 1], got '" + shown(a) + "'"};
      }
      if (!(alpha >= 0 && alpha <= 1)) throw HttpError{400, "alpha must be in [0, 1], got '" + shown(a) + "'"};
    }
    const std::string picture = req.has_param("image") ? req.get_param_value("image") : "";
    if (!picture.empty() && picture != "overlay" && picture != "color")
      throw HttpError{400, "image must be overlay or color, got '" + shown(picture) + "'"};
    const Augmentation aug = augmentation(req);

    // The front door: the header and the augmentation, before any decoding. These cheap checks
    // (empty, not an image, unsupported, too many pixels, too costly) answer even when busy.
    const InspectedImage info = pred->inspect(image.data(), image.size(), aug, "request body");
    if (info.cost > max_request_cost)
      throw HttpError{413, "the augmentation '" + aug.text() + "' of the " + std::to_string(info.size.width) + "x" +
                               std::to_string(info.size.height) + " image costs " + std::to_string(info.cost) +
                               " pixels of forward passes, over the limit of " + std::to_string(max_request_cost) +
                               " per request (fewer scales, smaller ones, or no flip)"};
    auto admission = admit(info.cost, res);
    const auto tq = Clock::now();
    if (!take_turn(*admission, res)) {  // the client has gone: nobody to answer
      n_dropped++;
      res.set_header("Connection", "close");
      throw HttpError{503, "the client closed the connection while its request waited"};
    }
    const double queue_ms = ms_between(tq, Clock::now());
    if (opt.before_inference) opt.before_inference();
    Prediction p = pred->predict_inspected(info, image.data(), image.size(), false, "request body");
    admission.reset();  // the engine's turn and the cost go to the next request
    const auto t1 = Clock::now();
    const int64_t H = p.labels.size(0), W = p.labels.size(1);
    const auto& palette = pred->meta().palette;
    std::string out, type = "image/png";
    if (format != "json") {
      out = render(p.image, p.labels, palette, render_from_string(format), alpha);
    } else {
      nlohmann::json j;
      j["width"] = W;
      j["height"] = H;
      j["channels"] = p.image.dim() == 3 ? p.image.size(2) : 1;
      j["classes"] = to_json(legend(p.labels, pred->meta()));
      j["backend"] = pred->backend();
      j["augmentation"] = aug.text();
      if (!picture.empty()) {
        j["image"] = "data:image/png;base64," + base64(render(p.image, p.labels, palette, render_from_string(picture), alpha));
      }
      const auto t2 = Clock::now();
      j["latency_ms"] = {{"queue", queue_ms},
                         {"decode", p.decode_ms},
                         {"inference", p.inference_ms},
                         {"encode", ms_between(t1, t2)},
                         {"total", ms_between(t0, t2)}};
      out = j.dump();
      type = "application/json";
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", ms_between(t0, Clock::now()));
    res.set_header("X-Latency-Ms", buf);
    std::snprintf(buf, sizeof buf, "%.1f", p.inference_ms);
    res.set_header("X-Inference-Ms", buf);
    std::snprintf(buf, sizeof buf, "%.1f", queue_ms);
    res.set_header("X-Queue-Ms", buf);
    res.set_header("X-Image-Size", std::to_string(W) + "x" + std::to_string(H));
    res.set_header("X-Augmentation", aug.text());
    res.set_content(std::move(out), type.c_str());
  }

  bool host_allowed(const std::string& host) const {
    if (host.empty()) return false;
    if (is_ip_literal(host) || host == "localhost" || host == lowercase(opt.host)) return true;
    for (const auto& h : opt.allowed_hosts)
      if (h == "*" || lowercase(h) == host) return true;
    return false;
  }

  // A browser's view of the request (N11): the Host must name this server (a page of another
  // name resolving to 127.0.0.1, DNS rebinding, gets 421), and a POST from a page of another
  // origin (a form, a no-cors fetch: the requests a browser sends without asking) gets 403.
  // Clients that are not browsers send no Origin or Sec-Fetch-Site.
  bool check_origin(const httplib::Request& req, httplib::Response& res) const {
    if (req.has_header("Host")) {
      const std::string host = host_part(req.get_header_value("Host"));
      if (!host_allowed(host)) {
        send_error(res, 421, "the Host '" + shown(req.get_header_value("Host")) +
                                 "' is not this server's (an IP address, localhost, or a name given with --allowed-hosts)");
        return false;
      }
    } else if (req.version == "HTTP/1.1") {
      send_error(res, 400, "an HTTP/1.1 request needs a Host header");
      return false;
    }
    if (req.method == "GET" || req.method == "HEAD" || req.method == "OPTIONS") return true;
    const std::string site = lowercase(req.get_header_value("Sec-Fetch-Site"));
    if (!site.empty() && site != "same-origin" && site != "none") {
      send_error(res, 403, "cross-site request refused (Sec-Fetch-Site: " + shown(site) + ")");
      return false;
    }
    if (req.has_header("Origin")) {
      const std::string origin = lowercase(req.get_header_value("Origin"));
      const std::string host = lowercase(req.get_header_value("Host"));
      if (origin != "http://" + host && origin != "https://" + host) {
        send_error(res, 403, "cross-origin request refused (Origin " + shown(req.get_header_value("Origin")) +
                                 " is not this server's)");
        return false;
      }
    }
    return true;
  }

  void setup() {
    const PredictorOptions& po = pred->options();
    if (opt.max_queue < 0) throw std::invalid_argument("max_queue must be ≥ 0, got " + std::to_string(opt.max_queue));
    if (opt.max_bytes == 0) throw std::invalid_argument("max_bytes must be > 0");
    if (po.max_pixels <= 0)
      throw std::invalid_argument("the server's predictor needs a pixel limit (PredictorOptions::max_pixels > 0): "
                                  "it bounds the memory of the decoded images");
    if (opt.max_connections <= 0) throw std::invalid_argument("max_connections must be > 0");
    if (opt.max_scales < 1) throw std::invalid_argument("max_scales must be ≥ 1");
    Augmentation{opt.scales, opt.flip}.check();
    if (opt.scales.size() > static_cast<size_t>(opt.max_scales))
      throw std::invalid_argument("the default augmentation has " + std::to_string(opt.scales.size()) +
                                  " scales, more than max_scales (" + std::to_string(opt.max_scales) + ")");
    if (!(opt.head_timeout > 0) || !(opt.body_timeout >= 0) || !(opt.stop_grace >= 0) || !(opt.upload_timeout > 0) ||
        !(opt.slot_wait >= 0) || !(opt.queue_timeout >= 0) || !(opt.scale_grid > 0))
      throw std::invalid_argument("head_timeout, upload_timeout and scale_grid must be > 0; body_timeout, slot_wait, "
                                  "queue_timeout and stop_grace ≥ 0");
    if (opt.max_cost < 0 || opt.max_request_cost < 0) throw std::invalid_argument("max_cost and max_request_cost must be ≥ 0");
    slots = po.engines + opt.max_queue;
    max_request_cost = opt.max_request_cost > 0 ? opt.max_request_cost : 2 * po.max_pixels;
    max_cost = std::max(opt.max_cost > 0 ? opt.max_cost : 8 * po.max_pixels, max_request_cost);
    const int body_slots = opt.http_threads > 0 ? opt.http_threads : slots + 8;

    const ModelMeta& m = pred->meta();
    nlohmann::json pal = nlohmann::json::array();
    for (const auto& c : m.palette) pal.push_back({c[0], c[1], c[2]});
    std::string wname = pred->weights_path();
    if (auto slash = wname.find_last_of('/'); slash != std::string::npos) wname = wname.substr(slash + 1);
    model_json = nlohmann::json{
        {"arch", m.arch},
        {"dataset", m.dataset},
        {"weights", wname},
        {"num_classes", pred->config().num_classes},
        {"classes", m.class_names},
        {"palette", pal},
        {"ignore_index", m.ignore_index},
        {"normalization", {{"input", "RGB, 0..255"}, {"mean", m.mean}, {"std", m.std}, {"formula", "(x - mean) / std"}}},
        {"parameters", pred->parameters()},
        {"config", to_json(pred->config())},
        {"backend", pred->backend()},
        {"device", po.engine.device.str()},
        {"input_size",
         {{"height", po.input_size.height},
          {"width", po.input_size.width},
          {"longest_side", po.input_size.longest_side},
          {"text", po.input_size.text()}}},
        {"augmentation", {{"scales", opt.scales}, {"flip", opt.flip}, {"text", Augmentation{opt.scales, opt.flip}.text()}, {"grid", opt.scale_grid}}},
        {"limits",
         {{"max_bytes", opt.max_bytes},
          {"max_pixels", po.max_pixels},
          {"max_queue", opt.max_queue},
          {"max_cost", max_cost},
          {"max_request_cost", max_request_cost},
          {"max_scales", opt.max_scales}}},
    }.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // a file name is any bytes

    // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
    // server share the port silently instead of failing.
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    // A thread per connection, deadlines per request (see http_server.h); a read or write making
    // no progress for 10 s fails too.
    ConnectionLimits limits;
    limits.max_connections = opt.max_connections;
    limits.body_slots = body_slots;
    limits.head_timeout = opt.head_timeout;
    limits.body_timeout = opt.body_timeout;
    limits.min_body_rate = opt.min_body_rate;
    limits.upload_timeout = opt.upload_timeout;
    limits.slot_wait = opt.slot_wait;
    limits.max_head_bytes = opt.max_head_bytes;
    limits.max_header_lines = opt.max_header_lines;
    http.set_limits(limits);
    // Never a type sniffed from a reply's bytes (a label PNG is a PNG, an error is JSON).
    http.set_default_headers({{"X-Content-Type-Options", "nosniff"}});
    http.set_request_filter([this](const httplib::Request& req, httplib::Response& res) {
      return check_origin(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                    : httplib::Server::HandlerResponse::Handled;
    });
    http.set_notice([this](const std::string& line) { log(line); });
    http.set_payload_max_length(opt.max_bytes);
    http.set_read_timeout(10, 0);
    http.set_write_timeout(10, 0);
    http.set_keep_alive_timeout(2);
    http.set_keep_alive_max_count(100);

    // The rest of the framing's refusals and the server's own.
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/v1/model", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(model_json, "application/json");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("Content-Security-Policy", kPagePolicy);
      res.set_header("X-Frame-Options", "DENY");
      res.set_header("Referrer-Policy", "no-referrer");
      res.set_content(web_page_html(), "text/html; charset=utf-8");
    });
    // Browsers ask for it whatever the page links (the page links an empty data: icon): a tiny
    // icon (two label colours) rather than a 404. Not a 204: httplib sends Content-Length with
    // it, which Chromium refuses.
    http.Get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "max-age=86400");
      res.set_content("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'><rect width='16' height='16' rx='3' "
                      "fill='#804080'/><path d='M0 10 16 6V16H0z' fill='#2f6fde'/></svg>",
                      "image/svg+xml");
    });
    http.Post("/v1/segment",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                try {
                  const std::string image = read_image_body(req, res, reader);
                  segment(req, res, image);
                } catch (const HttpError& e) {
                  if (e.message.empty()) {
                    res.status = e.status;  // the error handler writes the message
                    res.body.clear();
                  } else {
                    send_error(res, e.status, e.message);
                  }
                } catch (const InputError& e) {
                  send_error(res, status_for(e.kind()), e.what());
                }
              });
    // Other methods on /v1/segment: 405, not 404. Any body is left unread, so the connection closes.
    auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", "POST");
      if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) res.set_header("Connection", "close");
      send_error(res, 405, "method not allowed: " + req.method + " /v1/segment (use POST)");
    };
    auto not_allowed_body = [not_allowed](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader&) { not_allowed(req, res); };
    http.Get("/v1/segment", not_allowed);
    http.Put("/v1/segment", not_allowed);
    http.Put("/v1/segment", not_allowed_body);
    http.Patch("/v1/segment", not_allowed);
    http.Patch("/v1/segment", not_allowed_body);
    http.Delete("/v1/segment", not_allowed);
    http.Delete("/v1/segment", not_allowed_body);
    // A body sent to any other path: 404 without reading it. httplib would read it first and
    // answer a form-encoded one over 8 KB (curl's default type) with 413, "too large", which is
    // not what is wrong.
    auto no_endpoint = [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
      if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) res.set_header("Connection", "close");
      send_error(res, 404, "no such endpoint: " + req.method + " " + shown(req.path));
    };
    http.Post(".*", no_endpoint);
    http.Put(".*", no_endpoint);
    http.Patch(".*", no_endpoint);
    http.Delete(".*", no_endpoint);
    // Errors decided by httplib itself (404, 413 over max_bytes, 400 malformed requests, a head
    // that missed its deadline) get a JSON body too. httplib calls this outside its try block:
    // nothing may escape (send_error does not throw; the path is made valid UTF-8 first).
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 400 && HttpServer::request_timed_out()) res.status = 408;
      std::string msg = HttpServer::request_refusal();
      if (!msg.empty() && res.status == 400 && msg.find("too large") != std::string::npos) res.status = 431;
      if (msg.empty()) switch (res.status) {
        case 404: msg = "no such endpoint: " + req.method + " " + shown(req.path); break;
        case 413: msg = "request body too large (the limit is " + std::to_string(opt.max_bytes) + " bytes)"; break;
        case 400: msg = "malformed HTTP request"; break;
        case 405: msg = "method not allowed: " + req.method + " " + shown(req.path); break;
        case 408: msg = "the request head did not arrive within " + seconds_text(opt.head_timeout) + " s"; break;
        case 414: msg = "request URI too long"; break;
        default: msg = "HTTP error " + std::to_string(res.status); break;
      }
      // After these the rest of the request is unread or unknown: the connection cannot go on.
      if (res.status == 400 || res.status == 408 || res.status == 413 || res.status == 414 || res.status == 431 ||
          res.status == 501)
        res.set_header("Connection", "close");
      send_error(res, res.status, msg);
    });
    // The last resort for what a handler throws (a library message may hold any bytes: send_error
    // makes it valid UTF-8).
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg += std::string(": ") + e.what();
      } catch (...) {
      }
      send_error(res, 500, msg);
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      n_requests++;
      if (res.status < 400) n_ok++;
      else if (res.status == 503) {}
      else if (res.status < 500 || res.status == 501) n_client++;  // 501: a Transfer-Encoding the client chose
      else n_server++;
      if (!opt.log) return;
      try {  // runs outside httplib's try block too
        std::string line = req.method + " " + req.path;
        if (req.has_param("format")) line += "?format=" + req.get_param_value("format");
        if (res.has_header("X-Augmentation") && res.get_header_value("X-Augmentation") != "none")
          line += " [" + res.get_header_value("X-Augmentation") + "]";
        line += " " + std::to_string(res.status) + " " + std::to_string(res.body.size()) + " B";
        if (res.has_header("X-Latency-Ms")) line += " " + res.get_header_value("X-Latency-Ms") + " ms";
        if (res.status >= 400 && res.get_header_value("Content-Type") == "application/json") {
          auto j = nlohmann::json::parse(res.body, nullptr, false);
          if (j.is_object() && j.contains("error") && j["error"].is_string())
            line += " (" + j["error"].get<std::string>() + ")";
        }
        log(loggable(line));
      } catch (...) {
      }
    });
  }
};

Server::Server(std::shared_ptr<const Predictor> predictor, ServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (!predictor) throw std::invalid_argument("Server: no predictor");
  impl_->pred = std::move(predictor);
  impl_->opt = std::move(options);
  impl_->setup();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  if (impl_->port >= 0) return impl_->port;
  const auto& o = impl_->opt;
  if (o.port < 0 || o.port > 65535) throw std::invalid_argument("port must be 0..65535, got " + std::to_string(o.port));
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) throw std::runtime_error("cannot listen on " + o.host + " (any port)");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw std::runtime_error("cannot listen on " + o.host + ":" + std::to_string(port) +
                             " (address in use, not permitted, or not an address of this machine)");
  }
  // httplib's listening socket has a backlog of 5 (fixed when Debian built the library): a burst
  // of connections would see dropped SYNs and second-long retries.
  impl_->http.raise_backlog(SOMAXCONN);
  impl_->port = port;
  return port;
}

void Server::run() {
  bind();
  impl_->http.serve();  // returns after stop(), its connections closed and their threads joined
}

void Server::stop() { impl_->http.stop(impl_->opt.stop_grace); }

int Server::port() const { return impl_->port; }

std::string Server::handle_bytes(const std::string& input) { return impl_->http.serve_bytes(input); }

Server::Stats Server::stats() const {
  Stats s;
  s.requests = impl_->n_requests;
  s.ok = impl_->n_ok;
  s.client_errors = impl_->n_client;
  s.rejected_busy = impl_->n_busy + impl_->http.refused();
  s.server_errors = impl_->n_server;
  s.dropped = impl_->n_dropped;
  return s;
}

}  // namespace lightseg
