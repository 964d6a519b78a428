// The claim pool (src/infer/onednn/claim_pool.h): parallel_steps keeps at::parallel_for's
// contract on it (every index once, in ranges of at least the grain), serves nested and
// concurrent callers, and the engine's results do not depend on which scheduler runs its steps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "engine_fixtures.h"
#include "infer/fused_network.h"
#include "infer/onednn/claim_pool.h"
#include "infer/onednn_engine.h"
#include "cli_run.h"
#include "lightseg/engine.h"
#include "lightseg/weights.h"

namespace {

using lightseg::onednn::choose_step_scheduler;
using lightseg::onednn::parallel_steps;
using lightseg::onednn::StepScheduler;

// Two threads and a scheduler for one test (the engines made meanwhile keep it), then what the
// process had; with the pool, this thread's own parallel_steps calls go to the pool too.
class PoolScope {
 public:
  explicit PoolScope(bool pool) : PoolScope(pool ? StepScheduler::Pool : StepScheduler::OpenMP) {}
  explicit PoolScope(StepScheduler s)
      : threads_(at::get_num_threads()), was_(lightseg::onednn::step_scheduler()), steps_(s == StepScheduler::Pool) {
    at::set_num_threads(2);
    choose_step_scheduler(s);
  }
  ~PoolScope() {
    choose_step_scheduler(was_);
    at::set_num_threads(threads_);
  }

 private:
  int threads_;
  StepScheduler was_;
  lightseg::onednn::PoolSteps steps_;
};

// Runs parallel_steps over [begin, begin + n) and checks the ranges it was given.
void expect_each_index_once(int64_t begin, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  parallel_steps(begin, begin + n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i - begin)].fetch_add(1);
    std::lock_guard<std::mutex> g(m);
    ranges.emplace_back(b, e);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  std::sort(ranges.begin(), ranges.end());
  ASSERT_FALSE(ranges.empty());
  EXPECT_LE(ranges.size(), 16u) << "at most 8 pieces per thread";
  for (size_t k = 0; k < ranges.size(); ++k) {
    EXPECT_LT(ranges[k].first, ranges[k].second);
    if (k + 1 < ranges.size()) EXPECT_GE(ranges[k].second - ranges[k].first, std::min(grain, n)) << n << "/" << grain;
  }
}

}  // namespace

TEST(ClaimPool, EveryIndexOnceInRangesOfAtLeastTheGrain) {
  PoolScope scope(true);
  for (int64_t n : {1, 2, 5, 16, 17, 100, 1000, 4097})
    for (int64_t grain : {1, 4, 16, 256}) expect_each_index_once(7, n, grain);
  // many short steps one after another, as a plan runs them
  for (int i = 0; i < 2000; ++i) expect_each_index_once(0, 64 + i % 50, 4);
}

TEST(ClaimPool, EveryPieceRunsOnceWhenStepsGrow) {
  // Steps of few pieces and of many in turn, on more threads than cores (so that workers are
  // preempted at every point of a claim): a worker that read a finished step's word with the
  // next step's piece count once claimed a piece past the old step's end, ran it twice and
  // counted it twice, and the caller then waited forever (once in ~10^7 steps; here the
  // moments where that can happen are widened). A watchdog turns a hang into a failure.
  if (!lightseg::onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  const int threads = at::get_num_threads();
  lightseg::onednn::set_claim_pool_race_window(200);
  struct Shared {
    std::vector<std::atomic<int>> hits = std::vector<std::atomic<int>>(64);
    std::atomic<int> wrong{0};
    std::atomic<bool> finished{false}, no_pool{false};
    std::mutex m;
    std::condition_variable cv;
  };
  auto sh = std::make_shared<Shared>();  // outlives a hung worker
  constexpr int kSteps = 20000;
  std::thread([sh] {
    at::set_num_threads(4);  // this thread's own count (OpenMP's is per thread)
    for (int k = 0; k < kSteps && !sh->no_pool; ++k) {
      const int64_t pieces = k % 2 ? 2 + k % 3 : 40 + k % 24;
      lightseg::onednn::ClaimPoolLease lease;
      if (!lease.ready()) {
        sh->no_pool = true;
        break;
      }
      lease.run(
          pieces, [](void* c, int64_t i) { static_cast<Shared*>(c)->hits[static_cast<size_t>(i)].fetch_add(1); }, sh.get());
      for (int64_t i = 0; i < 64; ++i)
        if (sh->hits[static_cast<size_t>(i)].exchange(0) != (i < pieces ? 1 : 0)) sh->wrong.fetch_add(1);
    }
    std::lock_guard<std::mutex> g(sh->m);
    sh->finished = true;
    sh->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> g(sh->m);
  const bool ended = sh->cv.wait_for(g, std::chrono::seconds(120), [&] { return sh->finished.load(); });
  g.unlock();
  lightseg::onednn::set_claim_pool_race_window(0);
  at::set_num_threads(threads);
  ASSERT_TRUE(ended) << "a step of the claim pool never ended (a piece lost or counted twice)";
  ASSERT_FALSE(sh->no_pool) << "the pool was not free";
  EXPECT_EQ(sh->wrong.load(), 0) << "pieces run other than once";
}

TEST(ClaimPool, ThePoolsThreadsTakePieces) {
  // The first piece waits (up to 20 s) until a piece has run on another thread: it returns
  // at once when the pool's worker joins the step, and the test fails if it never does.
  PoolScope scope(true);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> other{false};
  std::atomic<int> pieces{0};
  parallel_steps(0, 16, 1, [&](int64_t b, int64_t e) {
    pieces.fetch_add(static_cast<int>(e - b));
    if (std::this_thread::get_id() != caller) other = true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (b == 0 && !other && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  EXPECT_EQ(pieces.load(), 16);
  EXPECT_TRUE(other.load()) << "no piece ran on the pool's thread";
}

TEST(ClaimPool, NestedAndConcurrentCallersAreServed) {
  PoolScope scope(true);
  // within a piece: the inner step runs on the piece's own thread, whole
  std::atomic<int> inner_total{0}, inner_elsewhere{0};
  parallel_steps(0, 8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto me = std::this_thread::get_id();
      parallel_steps(0, 100, 1, [&](int64_t ib, int64_t ie) {
        inner_total.fetch_add(static_cast<int>(ie - ib));
        if (std::this_thread::get_id() != me) inner_elsewhere.fetch_add(1);
      });
    }
  });
  EXPECT_EQ(inner_total.load(), 800);
  EXPECT_EQ(inner_elsewhere.load(), 0);
  // two callers at once: one holds the pool, the other runs on OpenMP's threads; both complete
  std::atomic<int> failures{0};
  auto caller = [&] {
    lightseg::onednn::PoolSteps on(true);
    for (int k = 0; k < 300; ++k) {
      std::vector<std::atomic<int>> hits(257);
      parallel_steps(0, 257, 4, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits)
        if (h.load() != 1) failures.fetch_add(1);
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ClaimPool, TheEngineGivesTheSameLogitsOnEitherScheduler) {
  using namespace lightseg;
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  if (!onednn_unsuitable_reason().empty()) GTEST_SKIP() << onednn_unsuitable_reason();
  for (const auto& cfg : {NetworkConfig{}, fixtures::unaligned_config()}) {
    auto net = fixtures::random_net(cfg, 9);
    const auto f = fuse_network(net, ModelMeta::generic(cfg.num_classes));
    for (bool bf16 : {false, true}) {
      if (bf16 && !onednn_bf16_available()) continue;
      // an engine per scheduler: a plan is built for the one chosen when it is first run
      std::unique_ptr<InferenceEngine> on_openmp, on_pool;
      {
        PoolScope s(false);
        on_openmp = make_onednn_engine(f, bf16);
      }
      {
        PoolScope s(true);
        on_pool = make_onednn_engine(f, bf16, /*profile=*/true);
      }
      // batch 1: convolutions cut into slices; batch 2: whole, on OpenMP
      for (auto [n, h, w] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 97, 131}, {1, 360, 480}, {2, 65, 33}}) {
        torch::manual_seed(h);
        auto x = torch::rand({n, 3, h, w}) * 255;
        torch::Tensor a, b, la, lb;
        {
          PoolScope s(false);
          a = on_openmp->logits(x).clone();
          la = on_openmp->labels(x);
        }
        {
          PoolScope s(true);
          b = on_pool->logits(x).clone();
          lb = on_pool->labels(x);
          if (n == 1)  // and the plan was built for the pool: its convolutions in slices
            EXPECT_NE(on_pool->profile().find(" slices + pass: claim pool"), std::string::npos) << on_pool->profile();
        }
        // Two plans may pick different algorithms for a convolution (each measures its
        // candidates when it is built): rounding apart, the same logits and labels.
        const double scale = std::max(1.0, a.abs().max().item<double>());
        const double d = (a - b).abs().max().item<double>() / scale;
        const double agree = la.eq(lb).to(torch::kFloat64).mean().item<double>();
        std::printf("  %s %lldx%lldx%lld: max |logit diff| %.2e of the largest logit, labels %.5f\n", bf16 ? "bf16" : "fp32",
                    static_cast<long long>(n), static_cast<long long>(h), static_cast<long long>(w), d, agree);
        EXPECT_LT(d, bf16 ? 2e-2 : 1e-5) << (bf16 ? "bf16 " : "fp32 ") << h << "x" << w;
        EXPECT_GE(agree, bf16 ? 0.99 : 0.999) << (bf16 ? "bf16 " : "fp32 ") << h << "x" << w;
      }
    }
  }
}

TEST(ClaimPool, AutoGoesToThePoolWhileCallsRunSlowAndComesBack) {
  using lightseg::onednn::AutoSteps;
  AutoSteps a;
  for (double t : {0.030, 0.021, 0.020, 0.024, 0.029}) EXPECT_FALSE(a.record(t));  // quiet noise
  EXPECT_DOUBLE_EQ(a.best, 0.020);
  // two slow calls, then a quiet one: not enough in a row
  EXPECT_FALSE(a.record(0.050));
  EXPECT_FALSE(a.record(0.060));
  EXPECT_FALSE(a.record(0.021));
  EXPECT_FALSE(a.on_pool);
  EXPECT_FALSE(a.record(0.050));
  EXPECT_FALSE(a.record(0.031));  // just over 1.5 x best counts as slow
  EXPECT_TRUE(a.record(0.070));
  EXPECT_TRUE(a.on_pool);
  EXPECT_EQ(a.switches, 1u);
  // on the pool: slow calls keep it there and do not move best; a fast one does not either
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(a.record(i % 5 == 0 ? 0.025 : 0.045));
  EXPECT_TRUE(a.on_pool);
  EXPECT_DOUBLE_EQ(a.best, 0.020);
  // kQuietCalls calls in a row under 1.3 x best bring it back
  for (int i = 0; i < AutoSteps::kQuietCalls - 1; ++i) EXPECT_FALSE(a.record(0.022));
  EXPECT_TRUE(a.record(0.022));
  EXPECT_FALSE(a.on_pool);
  EXPECT_EQ(a.switches, 2u);
  EXPECT_EQ(a.calls, 5u + 6u + 20u + AutoSteps::kQuietCalls);
  EXPECT_EQ(a.pool_calls, 20u + AutoSteps::kQuietCalls);
  // a faster quiet call on OpenMP lowers best
  EXPECT_FALSE(a.record(0.018));
  EXPECT_DOUBLE_EQ(a.best, 0.018);
}

TEST(ClaimPool, AutoSeesABusyCpuFromTheWaitWithoutAQuietCall) {
  // A process started on a busy CPU: its calls are all equally slow, so the time alone never
  // says so (its best call is a busy one); the calling thread's wait for a CPU does.
  using lightseg::onednn::AutoSteps;
  AutoSteps a;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(a.record(0.050, 0.002));  // waited 4 %: not busy
  EXPECT_FALSE(a.on_pool);
  EXPECT_FALSE(a.record(0.050, 0.020));  // 40 %: busy
  EXPECT_FALSE(a.record(0.052, 0.010));  // 19 %
  EXPECT_FALSE(a.record(0.050, 0.005));  // 10 %: not, the count starts again
  EXPECT_FALSE(a.record(0.050, 0.020));
  EXPECT_FALSE(a.record(0.050, 0.020));
  EXPECT_TRUE(a.record(0.050, 0.020));
  EXPECT_TRUE(a.on_pool);
  // on the pool: fast enough by time, but still waiting for the CPU: stays
  for (int i = 0; i < 3 * AutoSteps::kQuietCalls; ++i) EXPECT_FALSE(a.record(0.045, 0.015));
  EXPECT_TRUE(a.on_pool);
  // the CPU free again (a wait under 5 %) and the calls near best: back to OpenMP
  for (int i = 0; i < AutoSteps::kQuietCalls - 1; ++i) EXPECT_FALSE(a.record(0.030, 0.0005));
  EXPECT_TRUE(a.record(0.030, 0.0005));
  EXPECT_FALSE(a.on_pool);
  // unknown waits (-1): time alone decides, as before
  AutoSteps b;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(b.record(0.050, -1));
  EXPECT_FALSE(b.on_pool);
}

TEST(ClaimPool, TheRunDelayOfAThreadGrowsOnABusyCpu) {
  // What the auto steps read: -1 where the kernel keeps no schedstat; else seconds that grow
  // while more threads want the CPUs than there are.
  const double before = lightseg::onednn::thread_run_delay();
  if (before < 0) GTEST_SKIP() << "this kernel keeps no run delay (/proc/thread-self/schedstat)";
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (unsigned i = 0; i < 2 * cpus; ++i)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < until) x = x + 1;
  const double after = lightseg::onednn::thread_run_delay();
  stop = true;
  for (auto& t : busy) t.join();
  // 2 x cpus busy threads and this one on `cpus` CPUs: a fair share leaves this thread waiting
  // about 2/3 of the 0.5 s; 0.05 s is far below that and far above a quiet machine's wait
  EXPECT_GT(after - before, 0.05) << "waited " << after - before << " s of 0.5 s beside " << 2 * cpus << " busy threads";
}

TEST(ClaimPool, AnAutoEngineKeepsItsResultsAcrossSwitches) {
  // The switches forced (every call counts as slow, then as quiet): the engine goes to its pool
  // plan (its convolutions in slices) and back, with the same results throughout.
  using namespace lightseg;
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  if (!onednn_unsuitable_reason().empty()) GTEST_SKIP() << onednn_unsuitable_reason();
  using lightseg::onednn::AutoSteps;
  auto net = fixtures::random_net(NetworkConfig{}, 9);
  const auto f = fuse_network(net, ModelMeta::camvid());
  PoolScope scope(StepScheduler::Auto);
  auto engine = make_onednn_engine(f, false, /*profile=*/true);
  struct Factors {
    ~Factors() { lightseg::onednn::set_auto_steps_factors(); }
  } restore;
  torch::manual_seed(3);
  auto x = torch::rand({1, 3, 97, 131}) * 255;
  lightseg::onednn::set_auto_steps_factors(0.0, 0.0, 1e9, 0.0);  // every call slow, none quiet
  auto first = engine->logits(x).clone();
  // a size seen once has no pool plan (a folder of many sizes builds one plan per image)
  EXPECT_EQ(engine->step_report(), "auto: 0 of 1 timed calls on the pool, 0 switches, 0 pool plans");
  auto first_labels = engine->labels(x);
  EXPECT_EQ(engine->step_report(), "auto: 0 of 2 timed calls on the pool, 0 switches, 1 pool plan");
  EXPECT_EQ(engine->profile().find(" slices + pass: claim pool"), std::string::npos) << "the pool plan has not run";
  const double scale = std::max(1.0, first.abs().max().item<double>());
  // each plan measures its convolutions' candidates when it is built: rounding apart, the same
  auto agreement = [&](const torch::Tensor& l) { return l.eq(first_labels).to(torch::kFloat64).mean().item<double>(); };
  for (int i = 0; i < 6; ++i) {
    auto y = engine->logits(x);
    EXPECT_LT((y - first).abs().max().item<double>(), 1e-5 * scale) << "call " << i;
    EXPECT_GE(agreement(engine->labels(x)), 0.999) << "call " << i;
  }
  // the 3rd call switched: the 4th to the 14th ran on the pool plan
  EXPECT_EQ(engine->step_report(), "auto: 11 of 14 timed calls on the pool, 1 switch, 1 pool plan");
  EXPECT_NE(engine->profile().find(" slices + pass: claim pool"), std::string::npos) << engine->profile();
  lightseg::onednn::set_auto_steps_factors(1e9, 1e9, 1e9, 1e9);  // none slow, every call quiet
  for (int i = 0; i < AutoSteps::kQuietCalls + 2; ++i) EXPECT_GE(agreement(engine->labels(x)), 0.999);
  EXPECT_EQ(engine->step_report(), "auto: " + std::to_string(11 + AutoSteps::kQuietCalls) + " of " +
                                       std::to_string(16 + AutoSteps::kQuietCalls) + " timed calls on the pool, 2 switches, 1 pool plan");
}

TEST(ClaimPool, ABf16PoolPlanTakesItsFirstPlansLayouts) {
  // Which bf16 convolutions run in NHWC is measured when a plan is built; auto's pool plan of a
  // size takes its first plan's choices, so a switch between them does not change the results
  // (NHWC and blocked bf16 round differently: ~1e-3, enough to move a label at a near-tie). The
  // first plan is built with NHWC forced, the pool plan with it forbidden: it still follows.
  using namespace lightseg;
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  if (!onednn_unsuitable_reason().empty()) GTEST_SKIP() << onednn_unsuitable_reason();
  if (!onednn_bf16_available()) GTEST_SKIP() << "no bf16 plans on this CPU";
  auto net = fixtures::random_net(NetworkConfig{}, 9);
  const auto f = fuse_network(net, ModelMeta::camvid());
  PoolScope scope(StepScheduler::Auto);
  auto engine = make_onednn_engine(f, /*bf16=*/true, /*profile=*/true);
  struct Restore {
    ~Restore() {
      lightseg::onednn::set_auto_steps_factors();
      onednn_set_bf16_nhwc(-1);
    }
  } restore;
  torch::manual_seed(3);
  auto x = torch::rand({1, 3, 97, 131}) * 255;
  lightseg::onednn::set_auto_steps_factors(0.0, 0.0, 1e9, 0.0);  // every call slow: to the pool plan
  onednn_set_bf16_nhwc(1);
  auto first = engine->logits(x).clone();
  onednn_set_bf16_nhwc(0);
  for (int i = 0; i < 4; ++i) engine->logits(x);  // builds the pool plan, switches to it
  auto pooled = engine->logits(x);
  ASSERT_EQ(engine->step_report(), "auto: 3 of 6 timed calls on the pool, 1 switch, 1 pool plan");
  const std::string report = engine->profile();
  const auto pool_part = report.find("(its pool plan)");
  ASSERT_NE(pool_part, std::string::npos) << report;
  EXPECT_NE(report.find("(nhwc ", pool_part), std::string::npos) << report;
  const double scale = std::max(1.0, first.abs().max().item<double>());
  EXPECT_LT((pooled - first).abs().max().item<double>(), 1e-5 * scale);
}

TEST(ClaimPool, AnAutoEngineWhosePoolPlanFailsKeepsItsPlan) {
  // A pool plan that cannot be built (out of memory: it doubles the size's buffers) does not fail
  // the call: the size keeps its plan, its own steps on the pool while calls run slow, and the
  // report says why; the build is not tried again at every call.
  using namespace lightseg;
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  if (!onednn_unsuitable_reason().empty()) GTEST_SKIP() << onednn_unsuitable_reason();
  auto net = fixtures::random_net(NetworkConfig{}, 9);
  const auto f = fuse_network(net, ModelMeta::camvid());
  PoolScope scope(StepScheduler::Auto);
  auto engine = make_onednn_engine(f, false, /*profile=*/false);
  struct Restore {
    ~Restore() {
      lightseg::onednn::set_auto_steps_factors();
      lightseg::onednn::set_pool_plans_fail_for_tests(false);
    }
  } restore;
  torch::manual_seed(4);
  auto x = torch::rand({1, 3, 75, 99}) * 255;
  lightseg::onednn::set_auto_steps_factors(0.0, 0.0, 1e9, 0.0);  // every call slow, none quiet
  lightseg::onednn::set_pool_plans_fail_for_tests(true);
  const auto first = engine->logits(x).clone();
  const double scale = std::max(1.0, first.abs().max().item<double>());
  for (int i = 0; i < 8; ++i) {
    torch::Tensor y;
    ASSERT_NO_THROW(y = engine->logits(x)) << "call " << i;
    EXPECT_LT((y - first).abs().max().item<double>(), 1e-5 * scale) << "call " << i;
  }
  // switched after the 3rd call: calls 4 to 9 on the pool, with the size's own plan
  EXPECT_EQ(engine->step_report(),
            "auto: 6 of 9 timed calls on the pool, 1 switch, 0 pool plans, 1 not built (a pool plan failed to build (test))");
  // not tried again: builds that would now succeed are not attempted for this size
  lightseg::onednn::set_pool_plans_fail_for_tests(false);
  engine->logits(x);
  EXPECT_NE(engine->step_report().find("0 pool plans, 1 not built"), std::string::npos) << engine->step_report();
}

TEST(ClaimPool, AnUnknownSchedulerIsAClearError) {
  if (!lightseg::onednn_available() || !lightseg::onednn_unsuitable_reason().empty())
    GTEST_SKIP() << "no onednn plans here";
  const auto dir = std::filesystem::temp_directory_path() / ("lightseg_claim_pool_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  setenv("LIGHTSEG_STEPS", "fast", 1);
  auto r = lightseg::fixtures::run_cli({"bench", "--backend", "onednn", "--size", "64x64", "--iters", "1"}, dir);
  unsetenv("LIGHTSEG_STEPS");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("LIGHTSEG_STEPS must be auto, openmp or pool, not 'fast'"), std::string::npos) << r.err;
  setenv("LIGHTSEG_STEPS", "pool", 1);
  r = lightseg::fixtures::run_cli({"bench", "--backend", "onednn", "--size", "64x64", "--iters", "2", "--json"}, dir);
  unsetenv("LIGHTSEG_STEPS");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"steps\": \"pool\""), std::string::npos) << r.out;
  setenv("LIGHTSEG_STEPS", "pool", 1);
  r = lightseg::fixtures::run_cli({"info", "--json"}, dir);
  unsetenv("LIGHTSEG_STEPS");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"onednn_steps\":\"pool\""), std::string::npos) << r.out;
  r = lightseg::fixtures::run_cli({"info"}, dir);
  EXPECT_NE(r.out.find("their own steps on OpenMP's threads"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}
