// lightseg bench: inference latency (median, p90, p99), FPS, images/s and the achieved
// multiply-accumulates per second against the peak of a dense convolution measured in the
// same run. Speed does not depend on the weights: without any, it runs random ones.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <torch/cuda.h>

#include <cstdlib>

#include <signal.h>
#include <sched.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "args.h"
#include "lightseg/engine.h"
#include "lightseg/runtime.h"
#include "lightseg/features.h"
#include "lightseg/weights.h"
#include "lightseg/predictor.h"
#if LIGHTSEG_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace lightseg::cli {

namespace {

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(line.find_first_not_of(' ', p + 1));
    }
  return "unknown CPU";
}

std::string gpu_name() {
#if LIGHTSEG_HAVE_TORCH_CUDA
  return at::cuda::getCurrentDeviceProperties()->name;
#else
  return "cuda";
#endif
}

double percentile(std::vector<double> v, double q) {  // nearest rank
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

// One line of JSON in insertion order with ", " / ": " separators (as Python's json.dumps).
// The plans' step scheduler in words, from InferenceEngine::step_report().
std::string steps_text(const std::string& report) {
  if (report == "pool") return "the claim pool (LIGHTSEG_STEPS=pool)";
  if (report == "openmp") return "OpenMP's threads (LIGHTSEG_STEPS=openmp)";
  return "OpenMP's threads or the claim pool (LIGHTSEG_STEPS=" + report + ")";
}

std::string json_line(const nlohmann::ordered_json& j) {
  std::string r = "{";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it != j.begin()) r += ", ";
    r += nlohmann::json(it.key()).dump() + ": ";
    if (it->is_array()) {
      r += "[";
      for (size_t i = 0; i < it->size(); ++i) r += (i ? ", " : "") + (*it)[i].dump();
      r += "]";
    } else {
      r += it->dump();
    }
  }
  return r + "}";
}

double round3(double x) { return std::round(x * 1000.0) / 1000.0; }

// `--contention N`: N other processes, each busy on a core for as long as the timing runs, as
// on a robot whose other programs share the CPU. They die with this process, however it ends.
// They run at the default priority (SCHED_OTHER, nice 0) whatever lightseg's own: `nice -n -10 lightseg bench
// --contention 2` measures a prioritised lightseg against ordinary processes. (A process may
// always raise its children's nice value; lowering it below its own needs CAP_SYS_NICE, so under
// `nice -n 5` without it they stay at 5: `nices()` says what they got.) Each replaces itself by
// a fresh image of this program that only loops (`kBusyLoopArg`, run_busy_loop_child): a fork
// that went on running would share every page of this process copy-on-write, so that our first
// write to each page after the fork (the plans' buffers: ~250 MB at 360×480) faulted and copied
// it: the first timed call took 190-220 ms and the first on a pool plan 85-100 ms, the slowest
// calls of a contended run, and no program on a robot shares our pages that way.
class BusyProcesses {
 public:
  explicit BusyProcesses(int n) {
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      int ready[2];  // the child writes a byte when it loops: the timing starts with every one busy
      if (pipe(ready) != 0) fail("--contention: pipe failed");
      // made before the fork: the child of a threaded process only execs (or loops)
      const std::string fd = std::to_string(ready[1]), owner = std::to_string(parent);
      const pid_t pid = fork();
      if (pid < 0) fail("--contention: fork failed");
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // kept across the exec below
        if (getppid() != parent) _exit(0);  // the parent ended before the line above
        const sched_param normal{};  // an ordinary process even under `chrt` (leaving real time is always allowed)
        sched_setscheduler(0, SCHED_OTHER, &normal);
        close(ready[0]);
        execl("/proc/self/exe", "lightseg", kBusyLoopArg, fd.c_str(), owner.c_str(), static_cast<char*>(nullptr));
        run_busy_loop_child(ready[1]);  // no /proc: loop here (sharing our pages)
      }
      close(ready[1]);
      pollfd p{ready[0], POLLIN, 0};
      char byte = 0;
      if (poll(&p, 1, 10000) != 1 || read(ready[0], &byte, 1) != 1) {  // 10 s
        close(ready[0]);
        pids_.push_back(pid);
        fail("--contention: a busy process did not start");
      }
      close(ready[0]);
      pids_.push_back(pid);
      setpriority(PRIO_PROCESS, static_cast<id_t>(pid), 0);
      errno = 0;
      const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(pid));
      nices_.push_back(errno == 0 ? nice : 0);
    }
  }
  const std::vector<int>& nices() const { return nices_; }
  ~BusyProcesses() { stop(); }

 private:
  void stop() {
    for (pid_t p : pids_) kill(p, SIGKILL);
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
    pids_.clear();
  }
  [[noreturn]] void fail(const std::string& what) {  // the constructor's error: the ones started end too
    stop();
    throw std::runtime_error(what);
  }
  std::vector<pid_t> pids_;
  std::vector<int> nices_;
};

}  // namespace

void run_busy_loop_child(int ready_fd) {
  if (ready_fd >= 0) {
    const char byte = 1;
    if (write(ready_fd, &byte, 1) != 1) _exit(1);
    close(ready_fd);
  }
  volatile uint64_t x = 0;
  for (;;) x = x + 1;
}

void add_bench(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("bench", "Measure inference speed (latency, FPS, achieved MAC/s vs peak)");
  add_options(sub, a, {Opt::Size, Opt::Batch, Opt::Threads, Opt::Iters, Opt::Weights, Opt::Config, Opt::Backend,
                       Opt::Device, Opt::Precision, Opt::Json, Opt::Tta, Opt::InputSize});
  static bool profile = false;
  static int contention = 0;
  sub->add_option("--contention", contention,
                  "Time with N other processes busy on the cores (a shared robot CPU; N = cores: one per core)")
      ->check(CLI::Range(0, 1024));
  static std::string times_path;
  sub->add_option("--times", times_path,
                  "Write each timed call's milliseconds to this file, one per line in call order (where a tail comes from)");
  sub->add_flag("--profile", profile,
                "Time every step of the plan and print the mean of each (onednn; also LIGHTSEG_PROFILE=1)");
  sub->callback([&a]() {
    std::ofstream times_file;
    if (!times_path.empty()) {  // opened first: a path that cannot be written fails before the timing
      times_file.open(times_path);
      if (!times_file) throw std::runtime_error("--times: cannot write " + times_path);
    }
    const int threads = init_runtime(a.threads);
    auto [h, w] = parse_size(a.size);  // with --input-size: the camera frame's size
    const InputSize input_size = InputSize::parse(a.input_size);
    const auto [nh, nw] = input_size.resolve(h, w);  // the network's input size
    if (!a.config.empty() && !a.weights.empty()) throw std::invalid_argument("give --config or --weights, not both");
    torch::Device device = a.device == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
    if (device.is_cuda() && !torch::cuda::is_available())
      throw std::runtime_error("--device cuda: this LibTorch has no CUDA or no GPU is visible");
    const torch::ScalarType dtype = precision_type(a.precision);

    ModelMeta meta;
    std::string source;
    Network net{nullptr};
    std::string wpath = a.weights.empty() && a.config.empty() ? default_weights_path() : a.weights;
    if (!wpath.empty()) {
      net = load_network(wpath, &meta);
      source = wpath;
    } else {
      NetworkConfig cfg = a.config.empty() ? NetworkConfig{} : NetworkConfig::from_file(a.config);
      torch::manual_seed(0);
      net = Network(cfg);
      net->eval();
      meta = ModelMeta::generic(cfg.num_classes);
      source = "random";
      std::fprintf(stderr, "note: no weights file (--weights, models/camvid.lsw): timing random weights "
                           "(speed does not depend on them)\n");
    }
    EngineOptions eo = engine_options(a);
    const char* env = std::getenv("LIGHTSEG_PROFILE");
    eo.profile = profile || (env && *env && std::string(env) != "0");
    auto engine = make_engine(net, meta, eo);
    const double macs_per_image = count_inference_macs(net, meta, nh, nw, eo);  // with TTA: every pass

    torch::manual_seed(1);
    auto images = (torch::rand({a.batch, 3, h, w}) * 255).to(device);
    auto sync = [&] {
      if (device.is_cuda()) torch::cuda::synchronize();
    };
    using clock = std::chrono::steady_clock;
    // Warm-up: the first call builds the per-shape plan / picks kernels.
    const int warmup = std::max(3, a.iters / 10);
    // --input-size: end to end through the Predictor, as segment and serve run a frame: the
    // frame (H×W×3 uint8) resized (bilinear) to the network's size, the labels, and the labels
    // resized back (nearest) to the frame's size.
    std::unique_ptr<Predictor> predictor;
    std::vector<torch::Tensor> frames;
    if (!input_size.none()) {
      PredictorOptions po;
      po.engine = eo;
      po.input_size = input_size;
      predictor = std::make_unique<Predictor>(net, meta, po);
      for (int64_t i = 0; i < a.batch; ++i)
        frames.push_back(images[i].permute({1, 2, 0}).to(torch::kCPU, torch::kUInt8).contiguous());
    }
    auto call = [&] {
      if (!predictor) return engine->logits(images);
      return predictor->predict_batch(frames).back().labels;
    };
    for (int i = 0; i < warmup; ++i) call();
    sync();
    std::vector<double> ms;
    ms.reserve(a.iters);
    std::vector<int> others_nice;
    {
      BusyProcesses others(contention);
      others_nice = others.nices();
      for (int i = 0; i < a.iters; ++i) {
        auto t0 = clock::now();
        auto y = call();
        sync();
        ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
      }
    }
    if (times_file.is_open()) {
      for (double v : ms) times_file << round3(v) << '\n';
      times_file.close();
      if (!times_file) throw std::runtime_error("--times: writing " + times_path + " failed");
    }
    const double p50 = percentile(ms, 0.5), p90 = percentile(ms, 0.9), p99 = percentile(ms, 0.99);
    const double best = *std::min_element(ms.begin(), ms.end());  // least disturbed by other load
    const double fps = 1000.0 / p50, ips = a.batch * fps;
    const double achieved = macs_per_image * ips;
    // int8: no LibTorch int8 convolution to measure a peak with; the fp32 one is the reference.
    const torch::ScalarType peak_dtype = dtype == torch::kQInt8 ? torch::kFloat32 : dtype;
    const double peak = measure_peak_macs(device, peak_dtype);
    const std::string dev_name = device.is_cuda() ? gpu_name() : cpu_name();

    std::printf("lightseg bench: backend %s on %s (%s), %d threads, batch %d, %lldx%lld, %d iterations after %d warm-up\n",
                engine->backend().c_str(), device.is_cuda() ? "cuda" : "cpu", dev_name.c_str(), threads, a.batch,
                static_cast<long long>(h), static_cast<long long>(w), a.iters, warmup);
    std::printf("weights: %s, %s\n", source.c_str(), c10::toString(dtype));
    if (!input_size.none())
      std::printf("input:   %lldx%lld frames at network input size %lldx%lld (end to end: resize, labels, labels "
                  "resized back)\n",
                  static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(nh),
                  static_cast<long long>(nw));
    errno = 0;
    const int own_nice = getpriority(PRIO_PROCESS, 0);  // this thread's, which the threads it starts inherit
    std::string others_text;
    if (contention > 0) {
      others_text = ", timed with " + std::to_string(contention) + " other busy process" + (contention == 1 ? "" : "es");
      if (own_nice != 0 || others_nice.front() != 0)
        others_text += " (nice " + std::to_string(others_nice.front()) + "; lightseg at nice " + std::to_string(own_nice) + ")";
    } else if (own_nice != 0) {
      others_text = ", lightseg at nice " + std::to_string(own_nice);
    }
    std::printf("threads: %s%s\n", thread_wait_policy().c_str(), others_text.c_str());
    if (engine->backend().rfind("onednn", 0) == 0)
      std::printf("plans:   %s; their own steps on %s\n", onednn_plan_description().c_str(),
                  steps_text(engine->step_report()).c_str());
    std::printf("latency: median %.2f ms, p90 %.2f ms, p99 %.2f ms, best %.2f ms (per call of %d image%s)\n", p50, p90,
                p99, best, a.batch,
                a.batch == 1 ? "" : "s");
    std::printf("speed:   %.1f FPS, %.1f images/s\n", fps, ips);
    std::printf("compute: %.3f GMACs/image, %.1f GMAC/s achieved; peak %.1f GMAC/s (dense 3x3 conv in %s, same run): "
                "%.0f %%\n",
                macs_per_image / 1e9, achieved / 1e9, peak / 1e9, c10::toString(peak_dtype), 100.0 * achieved / peak);
    if (eo.profile) {
      const std::string steps = engine->profile();
      std::fprintf(stderr, "%s", steps.empty() ? ("profile: the " + engine->backend() + " backend times no steps\n").c_str()
                                              : steps.c_str());
    }
    if (a.json) {
      nlohmann::ordered_json j;
      j["size"] = {h, w};
      j["batch"] = a.batch;
      j["threads"] = threads;
      j["p50_ms"] = round3(p50);
      j["p90_ms"] = round3(p90);
      j["p99_ms"] = round3(p99);
      j["fps"] = round3(fps);
      j["backend"] = engine->backend();
      if (engine->backend().rfind("onednn", 0) == 0) {
        j["plans"] = onednn_plan_description();
        j["steps"] = onednn_step_scheduler();
        j["steps_report"] = engine->step_report();
      }
      j["min_ms"] = round3(best);
      j["images_per_s"] = round3(ips);
      j["device"] = dev_name;
      j["precision"] = a.precision;
      j["input_size"] = {nh, nw};  // after the contract's fixed prefix (size, batch, threads, p50_ms)
      j["gmacs_per_image"] = round3(macs_per_image / 1e9);
      j["achieved_gmac_s"] = round3(achieved / 1e9);
      j["peak_gmac_s"] = round3(peak / 1e9);
      j["peak_fraction"] = round3(achieved / peak);
      j["weights"] = source;
      j["contention"] = contention;
      j["nice"] = own_nice;
      j["contention_nice"] = others_nice;
      j["wait_policy"] = thread_wait_policy();
      std::cout << json_line(j) << std::endl;
    }
  });
}

}  // namespace lightseg::cli
