// c10d process groups (Gloo on CPU, NCCL on CUDA) where this build has them; bucketed gradient
// all-reduce, SyncBN and the model broadcast on top of the Collective interface.
//
// What is compiled depends on the LibTorch at hand (the version differences are named in
// core/torch_compat.h):
//   - c10d itself: off with -DLIGHTSEG_WITH_DISTRIBUTED=OFF (Collective::create then throws);
//   - Gloo: only where its headers exist (pip's LibTorch ships none) and
//     -DLIGHTSEG_DIST_GLOO=ON (the default);
//   - NCCL: where the LibTorch build defines USE_C10D_NCCL.
// LIGHTSEG_FORCE_NO_C10D / LIGHTSEG_FORCE_NO_GLOO compile one of those forms here too (the
// lightseg_dist_forms_check target of CMakeLists.txt builds them on every build).
#include "lightseg/distributed.h"
#include "lightseg/features.h"
#include "distributed/gradient_sync.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#include "core/torch_compat.h"

#if LIGHTSEG_WITH_DISTRIBUTED_OPTION && !defined(LIGHTSEG_FORCE_NO_C10D)
#define LIGHTSEG_C10D 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if LIGHTSEG_DIST_GLOO_OPTION && !defined(LIGHTSEG_FORCE_NO_GLOO) && __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define LIGHTSEG_GLOO 1
#else
#define LIGHTSEG_GLOO 0
#endif
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define LIGHTSEG_NCCL 1
#else
#define LIGHTSEG_NCCL 0
#endif
#else
#define LIGHTSEG_C10D 0
#define LIGHTSEG_GLOO 0
#define LIGHTSEG_NCCL 0
#endif

#include "model/hooks.h"

namespace lightseg {

DistConfig DistConfig::from_env() {
  DistConfig c;
  auto geti = [](const char* name, int& out) {
    if (const char* v = std::getenv(name)) {
      try {
        out = std::stoi(v);
      } catch (...) {
        throw std::invalid_argument(std::string(name) + " must be an integer, got '" + v + "'");
      }
    }
  };
  geti("RANK", c.rank);
  geti("WORLD_SIZE", c.world);
  geti("LOCAL_RANK", c.local_rank);
  geti("MASTER_PORT", c.master_port);
  if (const char* a = std::getenv("MASTER_ADDR")) c.master_addr = a;
  return c;
}

std::vector<std::string> distributed_backends() {
  std::vector<std::string> r;
  if (LIGHTSEG_GLOO) r.push_back("gloo");
  if (LIGHTSEG_NCCL) r.push_back("nccl");
  return r;
}

#if LIGHTSEG_C10D
namespace {

// The object whose collectives are called: a c10d::Backend from LibTorch 2.0 on (what
// ProcessGroupGloo and ProcessGroupNCCL are), a c10d::ProcessGroup before.
#if LIGHTSEG_C10D_BACKEND_CLASS
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

class C10dCollective : public Collective {
 public:
  C10dCollective(c10::intrusive_ptr<C10dGroup> pg, std::string backend) : pg_(std::move(pg)), backend_(std::move(backend)) {}
  int rank() const override { return pg_->getRank(); }
  int world() const override { return pg_->getSize(); }
  std::string backend() const override { return backend_; }
  void allreduce_sum(torch::Tensor& t) override {
    std::vector<torch::Tensor> v{t};
    pg_->allreduce(v)->wait();
  }
  struct P : Pending {
    c10::intrusive_ptr<c10d::Work> w;
    void wait() override { w->wait(); }
  };
  std::unique_ptr<Pending> allreduce_sum_async(torch::Tensor& t) override {
    std::vector<torch::Tensor> v{t};
    auto p = std::make_unique<P>();
    p->w = pg_->allreduce(v);
    return p;
  }
  void broadcast(torch::Tensor& t, int root) override {
    std::vector<torch::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(v, o)->wait();
  }
  void barrier() override { pg_->barrier()->wait(); }

 private:
  c10::intrusive_ptr<C10dGroup> pg_;
  std::string backend_;
};

}  // namespace
#endif

std::shared_ptr<Collective> Collective::create(const DistConfig& cfg, torch::Device device) {
  if (cfg.world < 1 || cfg.rank < 0 || cfg.rank >= cfg.world)
    throw std::invalid_argument("distributed: RANK must be in 0..WORLD_SIZE-1 (RANK=" + std::to_string(cfg.rank) +
                                ", WORLD_SIZE=" + std::to_string(cfg.world) + ")");
  if (cfg.master_port <= 0 || cfg.master_port > 65535)
    throw std::invalid_argument("distributed: MASTER_PORT must be 1..65535, got " + std::to_string(cfg.master_port));
  std::string backend = cfg.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl")
    throw std::invalid_argument("distributed: unknown backend '" + backend + "' (expected gloo or nccl)");
#if !LIGHTSEG_C10D
  throw std::runtime_error("distributed: this lightseg was built without distributed training "
                           "(-DLIGHTSEG_WITH_DISTRIBUTED=OFF): train with one process");
#else
  if (backend == "gloo" && !LIGHTSEG_GLOO)
    throw std::runtime_error("distributed: this build has no Gloo (its LibTorch ships no Gloo headers, or "
                             "-DLIGHTSEG_DIST_GLOO=OFF): train on the cuda device (NCCL) or with one process");
  if (backend == "nccl" && !LIGHTSEG_NCCL)
    throw std::runtime_error("distributed: this LibTorch build has no NCCL (train on the cpu device, which uses Gloo)");
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(cfg.master_port);
  so.isServer = cfg.rank == 0;
  so.numWorkers = static_cast<size_t>(cfg.world);
  so.waitWorkers = true;
  so.timeout = cfg.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(cfg.master_addr, so);
  } catch (const std::exception& e) {
    throw std::runtime_error("distributed: rendezvous at " + cfg.master_addr + ":" + std::to_string(cfg.master_port) +
                             " failed (rank " + std::to_string(cfg.rank) + "): " + e.what());
  }
  store = c10::make_intrusive<c10d::PrefixStore>("lightseg/" + backend, store);
#if LIGHTSEG_GLOO
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(cfg.timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    opts->threads = 1;
    c10::intrusive_ptr<C10dGroup> pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, cfg.rank, cfg.world, opts);
    return std::make_shared<C10dCollective>(pg, "gloo");
  }
#endif
#if LIGHTSEG_NCCL
  if (backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = cfg.timeout;
    c10::intrusive_ptr<C10dGroup> pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, cfg.rank, cfg.world, opts);
    return std::make_shared<C10dCollective>(pg, "nccl");
  }
#endif
  throw std::logic_error("distributed: backend '" + backend + "' not handled");
#endif
}

void broadcast_model(Collective& c, Network& net, bool buffers) {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> ts;
  for (auto& p : net->parameters()) ts.push_back(p);
  if (buffers)
    for (auto& b : net->buffers()) ts.push_back(b);
  // one flat buffer per dtype keeps it to a couple of collectives
  for (auto dtype : {torch::kFloat32, torch::kInt64}) {
    std::vector<torch::Tensor> sel;
    for (auto& t : ts)
      if (t.scalar_type() == dtype) sel.push_back(t);
    if (sel.empty()) continue;
    std::vector<torch::Tensor> flat_parts;
    for (auto& t : sel) flat_parts.push_back(t.reshape(-1));
    auto flat = torch::cat(flat_parts);
    c.broadcast(flat, 0);
    int64_t off = 0;
    for (auto& t : sel) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

// ---------------------------------------------------------------- gradient buckets
struct GradientSync::Bucket {
  std::vector<size_t> params;    // indices into params_
  std::vector<int64_t> offsets;  // offset of each param in flat
  torch::Tensor flat;
  int ready = 0;
  std::unique_ptr<Collective::Pending> pending;
};

GradientSync::GradientSync(Network& net, std::shared_ptr<Collective> c, size_t bucket_bytes, bool overlap)
    : c_(std::move(c)), overlap_(overlap) {
  for (auto& p : net->parameters())
    if (p.requires_grad()) params_.push_back(p);
  // buckets in reverse registration order: roughly the order gradients appear in backward
  auto b = std::make_unique<Bucket>();
  int64_t size = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    b->params.push_back(k);
    b->offsets.push_back(size);
    size += params_[k].numel();
    if (static_cast<size_t>(size) * 4 >= bucket_bytes) {
      b->flat = torch::zeros({size}, params_[k].options().requires_grad(false));
      buckets_.push_back(std::move(b));
      b = std::make_unique<Bucket>();
      size = 0;
    }
  }
  if (!b->params.empty()) {
    b->flat = torch::zeros({size}, params_[0].options().requires_grad(false));
    buckets_.push_back(std::move(b));
  }
  if (overlap_) {
    for (auto& bk : buckets_) {
      Bucket* bp = bk.get();
      for (size_t j = 0; j < bp->params.size(); ++j) {
        const size_t k = bp->params[j];
        const int64_t off = bp->offsets[j];
        hooks_.emplace_back(k, params_[k].register_hook([this, bp, k, off](const torch::Tensor& g) {
          torch::NoGradGuard ng;
          bp->flat.narrow(0, off, params_[k].numel()).copy_(g.reshape(-1));
          if (++bp->ready == static_cast<int>(bp->params.size())) {
            auto t0 = std::chrono::steady_clock::now();
            bp->pending = c_->allreduce_sum_async(bp->flat);
            seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
          return torch::Tensor();  // keep the gradient as it is
        }));
      }
    }
  }
}

GradientSync::~GradientSync() {
  for (auto& [k, id] : hooks_) params_[k].remove_hook(id);
}

void GradientSync::begin() {
  for (auto& b : buckets_) {
    b->ready = 0;
    b->pending.reset();
  }
}

// Gathers the bucket's gradients (zeros where a parameter has none) and all-reduces them now.
void GradientSync::reduce_now(Bucket& b) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    auto& p = params_[b.params[j]];
    auto slot = b.flat.narrow(0, b.offsets[j], p.numel());
    if (p.grad().defined()) slot.copy_(p.grad().reshape(-1));
    else slot.zero_();
  }
  c_->allreduce_sum(b.flat);
}

void GradientSync::finish() {
  torch::NoGradGuard ng;
  auto t0 = std::chrono::steady_clock::now();
  const double scale = 1.0 / c_->world();
  for (auto& b : buckets_) {
    if (overlap_) {
      if (b->pending) b->pending->wait();
      else reduce_now(*b);  // some parameter got no gradient this step (its hook never fired)
    } else {
      reduce_now(*b);
    }
    for (size_t j = 0; j < b->params.size(); ++j) {
      auto& p = params_[b->params[j]];
      auto avg = b->flat.narrow(0, b->offsets[j], p.numel()).view(p.sizes()) * scale;
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      p.mutable_grad().copy_(avg);
    }
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------- SyncBN
void enable_sync_batchnorm(std::shared_ptr<Collective> c) {
  model::set_batchnorm_allreduce([c](torch::Tensor& t) { c->allreduce_sum(t); });
}

void disable_sync_batchnorm() { model::set_batchnorm_allreduce(nullptr); }

}  // namespace lightseg
