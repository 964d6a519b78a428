// `lightseg serve` as a process (signals, grace periods) and its web page in headless Chromium.
#include "lightseg/features.h"

#if LIGHTSEG_HAVE_SERVER

#include <gtest/gtest.h>

#include "serve_fixtures.h"

using namespace lightseg;
using namespace lightseg::serve_fixtures;

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

#endif  // LIGHTSEG_HAVE_SERVER
