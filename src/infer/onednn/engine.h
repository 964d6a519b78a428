// The engine: one plan per input shape, built on first use and kept while there is room: at most
// max_plans of them (4 by default) holding at most max_plans × 2 Mpixels of input together (a
// plan's buffers grow with its pixels). When a new shape needs room, the plans used least often
// go first (then the least recently used): shapes that come back (a camera, a service's usual
// size) stay while a stream of new ones (20 sizes in turn) only replace each other. With
// LIGHTSEG_STEPS=auto (the default) a batch-1 size called more than once has a second plan for
// the claim pool (claim_pool.h), built at its second call and kept with the first (twice the
// plan's buffers).
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

class Engine : public InferenceEngine {
 public:
  // int8: dense convolutions in int8 (needs onednn_int8_available() and f.act_absmax), values
  // in bf16 storage where the CPU has AVX512-BF16, else f32.
  Engine(const FusedNetwork& f, bool bf16, bool int8, bool profile, size_t max_plans)
      : f_(to(f, torch::kCPU)), bf16_(bf16 || (int8 && onednn_bf16_available())), int8_(int8), profile_(profile),
        max_plans_(std::max<size_t>(1, max_plans)), eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
    if (int8_) {
      if (!onednn_int8_available())
        throw std::invalid_argument(
            "int8 inference on the CPU needs AVX512-VNNI (oneDNN's avx512_core_vnni int8 kernels), which this CPU, "
            "or LIGHTSEG_MAX_ISA, does not allow (use fp32" + std::string(onednn_bf16_available() ? " or bf16)" : ")"));
      if (f_.act_absmax.empty())
        throw std::invalid_argument(
            "int8 inference needs weights with an int8 calibration: run `lightseg calibrate` on them first");
    } else if (bf16_) {
      if (!onednn_bf16_available())
        throw std::invalid_argument(
            "bf16 inference on the CPU needs AVX512-BF16 or AMX instructions, which this CPU does not have "
            "(use fp32)");
    }
    for (auto& op : f_.ops)  // the plans read plain OIHW weights
      if (op.weight.defined()) op.weight = op.weight.contiguous();
  }
  torch::Tensor logits(const torch::Tensor& images) override { return call(images, false); }
  torch::Tensor labels(const torch::Tensor& images) override { return call(images, true); }
  torch::Tensor call(const torch::Tensor& images, bool labels) {
    if (images.dim() != 4 || images.size(1) != f_.channels[f_.input])
      throw std::invalid_argument("network input must be N×3×H×W, got " + c10::str(images.sizes()));
    if (images.size(2) < 32 || images.size(3) < 32)
      throw std::invalid_argument("network input must be at least 32×32, got " + std::to_string(images.size(2)) +
                                  "×" + std::to_string(images.size(3)));
    c10::InferenceMode guard;
    auto x = images.to(torch::kCPU, torch::kFloat32).contiguous();
    const auto key = std::make_tuple(x.size(0), x.size(2), x.size(3));
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      const int64_t pixels = x.size(0) * x.size(2) * x.size(3);
      const int64_t budget = static_cast<int64_t>(max_plans_) * (int64_t(2) << 20);
      auto held = [&] {
        int64_t n = 0;
        for (const auto& [k, e] : plans_) n += std::get<0>(k) * std::get<1>(k) * std::get<2>(k);
        return n;
      };
      while (!plans_.empty() && (plans_.size() >= max_plans_ || held() + pixels > budget)) {
        auto victim = plans_.begin();
        for (auto j = plans_.begin(); j != plans_.end(); ++j)
          if (j->second.hits < victim->second.hits ||
              (j->second.hits == victim->second.hits && j->second.last_use < victim->second.last_use))
            victim = j;
        plans_.erase(victim);
      }
      Entry e;
      e.plan = build(x, steps_ == StepScheduler::Pool);
      it = plans_.emplace(key, std::move(e)).first;
    }
    Entry& e = it->second;
    e.hits++;
    e.last_use = ++clock_;
    // auto: the pool plan at a size's second call (or the first after it with threads),
    // untimed: not with the first (a folder of images of many sizes, each seen once, would
    // build two plans per image: twice the time), nor when calls turn slow (~0.25 s then, on a
    // busy CPU); and run once (its first run, cold, was among the slowest calls on a busy
    // CPU). Only batch-1 plans differ on the pool (their convolutions in slices); a batch runs
    // its one plan on either.
    // A pool plan that cannot be built or run (out of memory: it doubles the size's buffers) is
    // not tried again; the size keeps its plan, whose own steps still go to the pool.
    if (steps_ == StepScheduler::Auto && !e.pool_plan && e.pool_failure.empty() && e.hits >= 2 && x.size(0) == 1 &&
        at::get_num_threads() > 1) {
      try {
        e.pool_plan = build(x, true, e.plan.get());
        e.pool_plan->set_profiling(false);  // its profile counts the calls auto gives it
        PoolSteps scope(true);  // and run once: its buffers touched, the pool's threads started
        e.pool_plan->run(x, strm_);
        e.pool_plan->set_profiling(profile_);
      } catch (const std::exception& err) {
        e.pool_plan.reset();
        e.pool_failure = err.what();
        if (e.pool_failure.empty()) e.pool_failure = "unknown error";
      }
    }
    if (steps_ != StepScheduler::Auto) {
      PoolSteps scope(steps_ == StepScheduler::Pool);
      return labels ? e.plan->labels(x, strm_) : e.plan->run(x, strm_);
    }
    // auto: the plan of the side AutoSteps is on.
    Plan& p = e.auto_steps.on_pool && e.pool_plan ? *e.pool_plan : *e.plan;
    PoolSteps scope(e.auto_steps.on_pool);
    const bool timed = at::get_num_threads() > 1;  // with one thread there is no barrier to wait at
    const double waited0 = timed ? thread_run_delay() : -1;
    const auto t0 = std::chrono::steady_clock::now();
    auto out = labels ? p.labels(x, strm_) : p.run(x, strm_);
    if (timed) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double waited1 = waited0 < 0 ? -1 : thread_run_delay();
      e.auto_steps.record(seconds, waited1 < 0 ? -1 : waited1 - waited0);
    }
    return out;
  }
  std::string step_report() const override {
    if (steps_ != StepScheduler::Auto) return std::string(step_scheduler_name(steps_));
    uint64_t calls = 0, pool_calls = 0, switches = 0, pool_plans = 0, failed = 0;
    std::string failure;
    for (const auto& [key, e] : plans_) {
      calls += e.auto_steps.calls;
      pool_calls += e.auto_steps.pool_calls;
      switches += e.auto_steps.switches;
      pool_plans += e.pool_plan != nullptr;
      if (!e.pool_failure.empty()) {
        ++failed;
        failure = e.pool_failure;
      }
    }
    return "auto: " + std::to_string(pool_calls) + " of " + std::to_string(calls) + " timed calls on the pool, " +
           std::to_string(switches) + " switch" + (switches == 1 ? "" : "es") + ", " + std::to_string(pool_plans) +
           " pool plan" + (pool_plans == 1 ? "" : "s") +
           (failed ? ", " + std::to_string(failed) + " not built (" + failure + ")" : std::string());
  }
  std::string backend() const override { return int8_ ? "onednn-int8" : bf16_ ? "onednn-bf16" : "onednn"; }
  torch::Device device() const override { return torch::kCPU; }
  std::string profile() const override {
    std::string r;
    for (const auto& [key, e] : plans_) {
      r += e.plan->report();
      if (e.pool_plan && !e.pool_plan->report().empty()) r += "(its pool plan)\n" + e.pool_plan->report();
    }
    return r;
  }

 private:
  FusedNetwork f_;
  bool bf16_, int8_, profile_;
  size_t max_plans_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  std::unique_ptr<Plan> build(const torch::Tensor& x, bool pool, const Plan* like = nullptr) {
    PoolSteps scope(pool);  // a pool plan cuts its batch-1 convolutions into slices (sliced_conv.h)
    if (pool && pool_plans_fail_for_tests()) throw std::runtime_error("a pool plan failed to build (test)");
    auto p = std::make_unique<Plan>(f_, eng_, x.size(0), x.size(2), x.size(3), bf16_, int8_, like);
    p->set_profiling(profile_);
    return p;
  }
  // StepScheduler::Pool: `plan` is a pool plan. Auto: `plan` runs on OpenMP, and on the pool
  // `pool_plan` where there is one (batch 1, more than one thread), else `plan`.
  StepScheduler steps_ = step_scheduler();
  struct Entry {
    std::unique_ptr<Plan> plan, pool_plan;
    std::string pool_failure;  // why its pool plan could not be built (auto): not tried again
    AutoSteps auto_steps;
    uint64_t hits = 0, last_use = 0;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, Entry> plans_;
  uint64_t clock_ = 0;
};

std::unique_ptr<InferenceEngine> make_blocked_engine(const FusedNetwork& f, bool bf16, bool int8, bool profile,
                                                     size_t max_plans) {
  if (bf16 && kBlock != 16)
    throw std::invalid_argument("bf16 inference on the CPU needs 16-channel plans (AVX512-BF16 or AMX)");
  if (int8 && kBlock != 16)
    throw std::invalid_argument("int8 inference on the CPU needs 16-channel plans (AVX512-VNNI)");
  return std::make_unique<Engine>(f, bf16, int8, profile, max_plans);
}
