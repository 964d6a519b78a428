// The training loop (see include/lightseg/train.h for the contract).
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "lightseg/dataset.h"
#include "lightseg/distributed.h"
#include "lightseg/eval.h"
#include "lightseg/image_io.h"
#include "lightseg/loader.h"
#include "lightseg/losses.h"
#include "lightseg/train.h"
#include "lightseg/transforms.h"
#include "lightseg/weights.h"
#include "archive_bytes.h"
#include "aux_heads.h"
#include "run_folder.h"
#include "core/file_io.h"
#include "core/json_number.h"

namespace lightseg {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// bf16 autocast (no loss scaling needed, unlike fp16) on CUDA or the CPU (convolutions
// forward and backward in bf16 through oneDNN). The API moved in LibTorch 2.4.
void set_autocast(at::DeviceType type, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::set_autocast_enabled(type, on);
#else
  if (type == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(on);
  }
#endif
  if (!on) at::autocast::clear_cache();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  std::seed_seq s{static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(b),
                  static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)};
  uint64_t out[1];
  s.generate(reinterpret_cast<uint32_t*>(out), reinterpret_cast<uint32_t*>(out) + 2);
  return out[0];
}

// The same permutation on every rank; each rank then takes its own shard.
std::vector<std::vector<size_t>> epoch_batches(size_t n, int batch, uint64_t seed, int epoch, int rank, int world,
                                               int64_t max_iters) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(mix(seed, static_cast<uint64_t>(epoch), 0x5EEDull));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<size_t> shard;
  for (size_t i = static_cast<size_t>(rank); i < n; i += static_cast<size_t>(world)) shard.push_back(perm[i]);
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i + static_cast<size_t>(batch) <= shard.size(); i += static_cast<size_t>(batch))
    out.emplace_back(shard.begin() + i, shard.begin() + i + batch);  // drop_last: BN wants full batches
  if (max_iters > 0 && static_cast<int64_t>(out.size()) > max_iters) out.resize(static_cast<size_t>(max_iters));
  return out;
}

std::vector<float> class_weights_cached(const SegDataset& ds, const TrainOptions& o, const std::function<void(const std::string&)>& say) {
  fs::path cache = fs::path(o.out_dir) / "class_weights.json";
  const std::string key = ds.kind() + ":" + fs::weakly_canonical(o.data).string() + ":" + o.train_split + ":" +
                          std::to_string(ds.size());
  if (fs::exists(cache)) {
    try {
      auto j = read_json_file(cache.string());
      if (j.value("key", "") == key) return json_numbers<float>(j.at("weights"), "weights");
    } catch (...) {
    }
  }
  if (say) say("computing class weights from " + std::to_string(ds.size()) + " training labels");
  auto counts = ds.class_histogram();
  auto w = enet_class_weights(counts);
  write_file_atomic(cache.string(), json{{"key", key}, {"counts", counts}, {"weights", w}}.dump(1));
  return w;
}

}  // namespace

TrainResult train(const TrainOptions& o_in, const TrainCallbacks& cb, std::shared_ptr<Collective> col) {
  TrainOptions o = o_in;
  o.validate();
  if (o.world > 1) {
    if (!col) throw std::invalid_argument("train: world > 1 needs a process group (Collective)");
    if (col->rank() != o.rank || col->world() != o.world)
      throw std::invalid_argument("train: rank/world (" + std::to_string(o.rank) + "/" + std::to_string(o.world) +
                                  ") differ from the process group's (" + std::to_string(col->rank()) + "/" +
                                  std::to_string(col->world()) + ")");
  } else {
    col.reset();
  }
  const bool lead = o.rank == 0;
  auto say = [&](const std::string& m) {
    if (lead && cb.on_message) cb.on_message(m);
  };
  torch::Device device(o.device == "cpu" ? std::string("cpu") : o.device);
  if (device.is_cuda() && !torch::cuda::is_available())
    throw std::runtime_error("device cuda: this LibTorch build has no CUDA or no GPU is visible");

  SegDataset train_ds = SegDataset::open(o.dataset, o.data, o.train_split);
  std::unique_ptr<SegDataset> val_ds;
  if (o.val_every > 0) {
    try {
      val_ds = std::make_unique<SegDataset>(SegDataset::open(o.dataset, o.data, o.val_split));
    } catch (const std::exception& e) {
      say(std::string("no validation split (") + e.what() + "): training without val mIoU");
    }
  }
  ModelMeta meta = train_ds.meta();
  if (o.network.num_classes != train_ds.num_classes()) {
    say("num_classes set to the dataset's " + std::to_string(train_ds.num_classes()));
    o.network.num_classes = train_ds.num_classes();
  }
  fs::create_directories(o.out_dir);
  const fs::path out(o.out_dir);
  const std::string last_path = (out / "last.lsw").string(), best_path = (out / "best.lsw").string();

  // One trainer per run folder: two would overwrite each other's checkpoints and log. Only
  // rank 0 writes the folder, so only rank 0 locks it (other ranks on its machine would
  // otherwise find it locked by rank 0); the others learn of its failure here, at once,
  // rather than when the process group times out waiting for it.
  std::unique_ptr<RunFolderLock> lock;
  std::string lock_error;
  if (lead) {
    try {
      lock = std::make_unique<RunFolderLock>(o.out_dir);
    } catch (const std::exception& e) {
      lock_error = e.what();
    }
  }
  if (col) {
    auto failed = torch::tensor({lock_error.empty() ? 0.0 : 1.0}, torch::kDouble);
    col->allreduce_sum(failed);
    if (failed.item<double>() > 0 && lock_error.empty())
      throw std::runtime_error("rank 0 could not lock the run folder '" + o.out_dir + "' (see its message)");
  }
  if (!lock_error.empty()) throw std::runtime_error(lock_error);
  if (lock && !lock->unsupported().empty())
    say("warning: cannot lock the run folder " + o.out_dir + " (" + lock->unsupported() +
        "): a second training on it would not be stopped");
  if (lead) {
    // A kill during a write leaves NAME.tmp.PID behind for good (write_file_atomic); with the
    // folder locked none of these is in progress.
    auto stale = remove_stale_temporaries(o.out_dir, {"last.lsw", "best.lsw", "log.jsonl", "curve.svg", "class_weights.json"});
    if (!stale.removed.empty()) {
      std::string names;
      for (const auto& n : stale.removed) names += (names.empty() ? "" : ", ") + n;
      char mb[32];
      std::snprintf(mb, sizeof mb, "%.1f MB", stale.bytes / 1e6);
      say("removed " + std::to_string(stale.removed.size()) + " stale temporary file(s) of interrupted checkpoint writes (" +
          mb + ") from " + o.out_dir + ": " + names);
    }
    for (const auto& k : stale.kept) say("left " + k + " in " + o.out_dir + ": not removed while its writer may be at work");
  }

  // ---------------------------------------------------------------- state (fresh or resumed)
  int start_epoch = 0;
  int64_t start_batch = 0, global_step = 0;
  double best_miou = -1, part_loss = 0, part_seconds = 0, part_wait = 0;
  int64_t part_count = 0, part_images = 0, skipped_steps = 0;  // this epoch's so far
  int64_t ema_steps = 0;  // EMA updates so far (its warm-up)
  std::vector<EpochRecord> history;
  std::string opt_blob;
  WeightsFile resumed;
  bool have_resume = false;
  if (fs::exists(last_path)) {
    if (!o.resume)
      throw std::runtime_error("'" + last_path + "' exists: continue that run (the resume option) or choose another run folder (out_dir)");
    resumed = read_weights(last_path);
    if (!resumed.extra.contains("train"))
      throw std::runtime_error("'" + last_path + "' is a weights file without training state");
    have_resume = true;
    const json& t = resumed.extra.at("train");
    if (!(resumed.config == o.network)) say("resuming with the network configuration stored in the checkpoint");
    o.network = resumed.config;
    start_epoch = json_number<int>(t.at("epoch"), "epoch");
    start_batch = json_number<int64_t>(t.at("batch"), "batch");
    global_step = json_number<int64_t>(t.at("global_step"), "global_step");
    best_miou = t.at("best_miou").get<double>();
    part_loss = t.value("part_loss", 0.0);
    part_count = t.value("part_count", int64_t(0));
    part_images = t.value("part_images", int64_t(0));
    skipped_steps = t.value("part_skipped", int64_t(0));
    part_seconds = t.value("part_seconds", 0.0);
    part_wait = t.value("part_wait", 0.0);
    ema_steps = t.value("ema_steps", int64_t(0));
    for (const auto& r : t.at("history")) history.push_back(EpochRecord::from_json(r));
    if (start_batch > 0 && t.value("world", 1) != o.world) {
      say("checkpoint was written mid-epoch by " + std::to_string(t.value("world", 1)) + " ranks, now " +
          std::to_string(o.world) + ": restarting epoch " + std::to_string(start_epoch + 1) + " from its start");
      start_batch = 0;
      part_loss = part_seconds = part_wait = 0;
      part_count = part_images = skipped_steps = 0;
    }
    if (resumed.blobs.count("optimizer")) opt_blob = resumed.blobs.at("optimizer");
    say("resuming from " + last_path + " at epoch " + std::to_string(start_epoch + 1) + ", batch " +
        std::to_string(start_batch));
  } else if (o.resume) {
    say("no checkpoint in " + o.out_dir + ": starting a new run");
  }

  torch::manual_seed(o.seed);
  Network net(o.network);
  // A checkpoint of an EMA run holds the average as its (inference) tensors and the raw
  // weights the optimizer works on as the "raw_weights" blob.
  const bool use_ema = o.ema_decay > 0, use_aux = o.aux_weight > 0;
  const bool ckpt_ema = have_resume && resumed.blobs.count("raw_weights") > 0;
  const bool ckpt_aux = have_resume && resumed.blobs.count("aux_heads") > 0;
  if (have_resume) {
    if (ckpt_ema) from_archive_bytes(*net, resumed.blobs.at("raw_weights"));
    else load_into(net, resumed);
    if (ckpt_ema && !use_ema) say("EMA off: continuing from the checkpoint's raw weights, not its average");
  } else if (!o.init_weights.empty()) {
    load_into(net, read_weights(o.init_weights));
    say("initialised from " + o.init_weights);
  }
  // Auxiliary heads on M1 (C1.3) and M2 (C1.5): outside the network, so never in its weights.
  AuxHeads aux{nullptr};
  if (use_aux) {
    aux = AuxHeads(o.network.c1, o.network.c2, o.network.num_classes);
    if (ckpt_aux) from_archive_bytes(*aux, resumed.blobs.at("aux_heads"));
    else if (have_resume) say("the checkpoint has no auxiliary heads: starting new ones");
  } else if (ckpt_aux) {
    say("aux_weight 0: the checkpoint's auxiliary heads are dropped");
  }
  Network ema_net{nullptr};
  if (use_ema) {
    ema_net = Network(o.network);
    if (ckpt_ema) {
      load_into(ema_net, resumed);
    } else {
      if (have_resume) say("the checkpoint has no EMA: the average starts from its weights");
      ema_steps = 0;
      torch::NoGradGuard ng;
      auto src = net->parameters(), dst = ema_net->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
      auto bsrc = net->buffers(), bdst = ema_net->buffers();
      for (size_t i = 0; i < bsrc.size(); ++i) bdst[i].copy_(bsrc[i]);
    }
    ema_net->to(device);
    if (o.channels_last) to_channels_last(*ema_net);
    ema_net->eval();  // only ever averaged into and scored
  }
  net->to(device);
  if (o.channels_last) to_channels_last(*net);
  net->train();
  if (aux) {
    aux->to(device);
    if (col) {  // rank 0's heads everywhere (before channels_last: flat, contiguous)
      torch::NoGradGuard ng;
      for (auto& p : aux->parameters()) col->broadcast(p, 0);
      for (auto& b : aux->buffers()) col->broadcast(b, 0);
    }
    if (o.channels_last) to_channels_last(*aux);
    aux->train();
  }
  // Distributed: same weights everywhere (rank 0's), SyncBN, bucketed gradient all-reduce.
  std::unique_ptr<GradientSync> grad_sync;
  struct SyncBNGuard {
    bool on = false;
    ~SyncBNGuard() {
      if (on) disable_sync_batchnorm();
    }
  } syncbn_guard;
  if (col) {
    broadcast_model(*col, net);
    if (o.sync_bn) {
      enable_sync_batchnorm(col);
      syncbn_guard.on = true;
    }
    grad_sync = std::make_unique<GradientSync>(net, col, static_cast<size_t>(o.bucket_mb * (1 << 20)), o.overlap_allreduce);
  }

  // Parameter groups: conv weights get weight decay; BN/PReLU parameters and biases only with bn_weight_decay.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : net->named_parameters()) (p.value().dim() > 1 || o.bn_weight_decay ? decay : no_decay).push_back(p.value());
  if (aux)  // appended after the network's, so the network's parameter order is that of a run without them
    for (auto& p : aux->parameters()) (p.dim() > 1 || o.bn_weight_decay ? decay : no_decay).push_back(p);
  std::unique_ptr<torch::optim::Optimizer> opt;
  {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (o.optimizer == "sgd") {
      auto mk = [&](double wd) {
        return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(wd));
      };
      groups.emplace_back(decay, mk(o.weight_decay));
      groups.emplace_back(no_decay, mk(0));
      opt = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov));
    } else if (o.optimizer == "adamw") {
      auto mk = [&](double wd) { return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr).weight_decay(wd)); };
      groups.emplace_back(decay, mk(o.weight_decay));
      groups.emplace_back(no_decay, mk(0));
      opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(o.lr));
    } else {
      auto mk = [&](double wd) { return std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(o.lr).weight_decay(wd)); };
      groups.emplace_back(decay, mk(o.weight_decay));
      groups.emplace_back(no_decay, mk(0));
      opt = std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(o.lr));
    }
  }
  if (!opt_blob.empty() && ckpt_aux != use_aux) {
    say(std::string("auxiliary heads ") + (use_aux ? "added" : "removed") +
        " on resume: the optimizer's parameters changed, its state starts afresh");
    opt_blob.clear();
  }
  if (!opt_blob.empty()) from_archive_bytes(*opt, opt_blob, device);

  torch::Tensor weight;
  if (o.loss != "ce") {
    std::vector<float> w = o.class_weights.empty() ? class_weights_cached(train_ds, o, say) : o.class_weights;
    if (static_cast<int>(w.size()) != train_ds.num_classes())
      throw std::invalid_argument("class_weights has " + std::to_string(w.size()) + " entries but the dataset has " +
                                  std::to_string(train_ds.num_classes()) + " classes");
    weight = torch::tensor(w).to(device);
  }

  AugmentOptions aug;
  aug.crop_h = o.crop_h;
  aug.crop_w = o.crop_w;
  aug.scale_min = o.scale_min;
  aug.scale_max = o.scale_max;
  aug.flip = o.flip;
  aug.jitter = o.jitter;

  const int64_t iters_per_epoch =
      static_cast<int64_t>(epoch_batches(train_ds.size(), o.batch, o.seed, 0, o.rank, o.world, o.max_iters).size());
  if (iters_per_epoch == 0)
    throw std::runtime_error("the training split has " + std::to_string(train_ds.size()) +
                             " images: fewer than one batch of " + std::to_string(o.batch) + " per rank");
  const int64_t total_steps = iters_per_epoch * o.epochs;
  const int64_t warmup = static_cast<int64_t>(std::llround(o.warmup_epochs * iters_per_epoch));

  // The network that is scored and saved for inference: the EMA's when there is one.
  Network scored = ema_net ? ema_net : net;
  auto save_checkpoint = [&](const std::string& path, int next_epoch, int64_t next_batch, bool with_optimizer) {
    WeightsFile w = make_weights(scored, meta);
    if (ema_net) w.blobs["raw_weights"] = to_archive_bytes(*net);
    if (aux) w.blobs["aux_heads"] = to_archive_bytes(*aux);
    w.extra["train"] = {{"epoch", next_epoch}, {"batch", next_batch}, {"global_step", global_step}, {"world", o.world},
                        {"best_miou", best_miou}, {"part_loss", part_loss}, {"part_count", part_count},
                        {"part_images", part_images}, {"part_skipped", skipped_steps},
                        {"part_seconds", part_seconds}, {"part_wait", part_wait},
                        {"options", o.to_json()}, {"history", json::array()}};
    for (const auto& r : history) w.extra["train"]["history"].push_back(r.to_json());
    if (ema_net) w.extra["train"]["ema_steps"] = ema_steps;
    if (with_optimizer) w.blobs["optimizer"] = to_archive_bytes(*opt);
    write_weights(path, w);
  };
  auto write_log = [&]() {
    std::string s;
    for (const auto& r : history) s += r.to_json().dump() + "\n";
    write_file_atomic((out / "log.jsonl").string(), s);
    write_curve_svg((out / "curve.svg").string(), history, "lightseg on " + o.dataset + " (" + meta.dataset + ")");
  };

  const auto t_start = Clock::now();
  TrainResult result;
  result.best_miou = best_miou;
  double step_time_avg = 0;  // running mean of seconds per iteration (for the ETA)
  int64_t steps_timed = 0;
  // Non-finite steps (NaN/inf loss or gradients: a reduced-precision overflow, a bad batch)
  // are skipped, as a loss scaler does: no optimizer update, and the BatchNorm running
  // statistics that the step's forward pass updated are put back. Only kMaxSkipsInRow in a
  // row count as divergence.
  constexpr int kMaxSkipsInRow = 5;
  int skips_in_row = 0;
  // The buffers are saved as one flat copy per dtype (one kernel each on CUDA, not hundreds).
  std::map<c10::ScalarType, std::vector<torch::Tensor>> buffers;
  for (const auto& b : net->buffers()) buffers[b.scalar_type()].push_back(b);
  if (aux)
    for (const auto& b : aux->buffers()) buffers[b.scalar_type()].push_back(b);
  // EMA: ema = d·ema + (1−d)·raw over the parameters and floating-point buffers (BatchNorm
  // running statistics), d = min(ema_decay, (1+n)/(10+n)) after n updates (the warm-up keeps
  // the average from clinging to the random initialisation); counters are copied.
  std::vector<torch::Tensor> ema_avg, ema_src, ema_copy, ema_copy_src;
  if (ema_net) {
    auto add = [&](std::vector<torch::Tensor> dst, std::vector<torch::Tensor> src) {
      for (size_t i = 0; i < dst.size(); ++i) {
        (dst[i].is_floating_point() ? ema_avg : ema_copy).push_back(dst[i]);
        (dst[i].is_floating_point() ? ema_src : ema_copy_src).push_back(src[i]);
      }
    };
    add(ema_net->parameters(), net->parameters());
    add(ema_net->buffers(), net->buffers());
  }
  auto ema_update = [&] {
    torch::NoGradGuard ng;
    const double n = static_cast<double>(ema_steps);
    const double d = std::min(o.ema_decay, (1.0 + n) / (10.0 + n));
    at::_foreach_mul_(ema_avg, d);
    at::_foreach_add_(ema_avg, ema_src, 1.0 - d);
    for (size_t i = 0; i < ema_copy.size(); ++i) ema_copy[i].copy_(ema_copy_src[i]);
    ++ema_steps;
  };
  std::map<c10::ScalarType, torch::Tensor> buffers_saved;
  auto save_buffers = [&] {
    torch::NoGradGuard ng;
    for (auto& [type, bs] : buffers) {
      std::vector<torch::Tensor> flat;
      for (const auto& b : bs) flat.push_back(b.detach().reshape({-1}));
      buffers_saved[type] = torch::cat(flat);
    }
  };
  auto restore_buffers = [&] {
    torch::NoGradGuard ng;
    for (auto& [type, bs] : buffers) {
      int64_t off = 0;
      for (auto& b : bs) {
        b.copy_(buffers_saved[type].narrow(0, off, b.numel()).view(b.sizes()));
        off += b.numel();
      }
    }
  };

  for (int epoch = start_epoch; epoch < o.epochs; ++epoch) {
    auto batches = epoch_batches(train_ds.size(), o.batch, o.seed, epoch, o.rank, o.world, o.max_iters);
    const int64_t iters = static_cast<int64_t>(batches.size());
    const int64_t first = epoch == start_epoch ? start_batch : 0;
    if (first == 0) {
      part_loss = part_seconds = part_wait = 0;
      part_count = part_images = skipped_steps = 0;
    }
    std::vector<std::vector<size_t>> todo(batches.begin() + std::min<int64_t>(first, iters), batches.end());
    const uint64_t seed = o.seed;
    const int ep = epoch;
    BatchLoader loader(
        [&, seed, ep](const std::vector<size_t>& idx) {
          std::vector<torch::Tensor> xs, ys;
          for (size_t i : idx) {
            std::mt19937_64 rng(mix(seed, static_cast<uint64_t>(ep) + 1, i));
            auto [img, lab] = train_ds.load(i);
            auto [x, y] = augment(to_rgb_chw_float(img), lab, aug, meta.mean, rng);
            xs.push_back(normalize(x, meta));
            ys.push_back(y.to(torch::kLong));
          }
          Batch b;
          b.images = torch::stack(xs);
          b.labels = torch::stack(ys);
          return b;
        },
        todo, o.workers, o.prefetch);
    const auto t_epoch = Clock::now();
    const double wait_before = loader.wait_seconds();
    const double allreduce_before = grad_sync ? grad_sync->seconds() : 0.0;
    Batch batch;
    int64_t it = first;
    while (true) {
      if (cb.kill_now && cb.kill_now(epoch + 1, it + 1)) {
        result.killed = true;
        result.history = history;
        return result;
      }
      const auto t_it = Clock::now();
      if (!loader.next(batch)) break;
      const double lr = poly_lr(o.lr, global_step, total_steps, warmup, o.warmup_start, o.poly_power);
      for (auto& g : opt->param_groups()) g.options().set_lr(lr);
      auto x = batch.images.to(device);
      auto y = batch.labels.to(device);
      if (o.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
      save_buffers();
      torch::Tensor logits, aux1, aux2;
      {
        const bool amp = device.is_cuda() ? o.amp : o.amp_cpu;
        if (amp) set_autocast(device.type(), true);
        if (aux) {  // one pass; the heads read the semantic branches' outputs M1, M2
          auto b = net->forward_with_branches(x);
          logits = b.logits;
          std::tie(aux1, aux2) = aux->forward(b.M1, b.M2, y.size(1), y.size(2));
        } else {
          logits = net->forward(x);
        }
        if (amp) {
          set_autocast(device.type(), false);
          logits = logits.to(torch::kFloat32);
          if (aux) {
            aux1 = aux1.to(torch::kFloat32);
            aux2 = aux2.to(torch::kFloat32);
          }
        }
      }
      auto criterion = [&](const torch::Tensor& z) {
        return o.loss == "ohem" ? ohem_cross_entropy(z, y, o.ohem_thresh, o.ohem_min_kept, weight)
                                : weighted_cross_entropy(z, y, weight);
      };
      // `loss` is what is optimised; progress and log.jsonl report the main output's loss
      // alone, comparable between runs with and without the auxiliary heads.
      torch::Tensor main_loss = criterion(logits);
      torch::Tensor loss = aux ? main_loss + o.aux_weight * (criterion(aux1) + criterion(aux2)) : main_loss;
      opt->zero_grad();
      if (grad_sync) grad_sync->begin();
      loss.backward();
      if (grad_sync) grad_sync->finish();
      if (col && aux) {  // the heads' gradients are not in GradientSync's buckets: average them here
        torch::NoGradGuard ng;
        std::vector<torch::Tensor> gs;
        for (auto& p : aux->parameters())
          if (p.grad().defined()) gs.push_back(p.grad());
        std::vector<torch::Tensor> parts;
        for (auto& g : gs) parts.push_back(g.reshape(-1));
        if (!parts.empty()) {
          auto flat = torch::cat(parts);
          col->allreduce_sum(flat);
          flat.div_(o.world);
          int64_t off = 0;
          for (auto& g : gs) {
            g.copy_(flat.narrow(0, off, g.numel()).view(g.sizes()));
            off += g.numel();
          }
        }
      }
      if (cb.after_backward) cb.after_backward(net);
      bool finite = true;
      {
        torch::NoGradGuard ng;
        std::vector<torch::Tensor> grads;
        for (const auto& p : net->parameters())
          if (p.grad().defined()) grads.push_back(p.grad());
        if (aux)
          for (const auto& p : aux->parameters())
            if (p.grad().defined()) grads.push_back(p.grad());
        torch::Tensor sum = loss.detach().to(torch::kFloat32).reshape({});
        if (!grads.empty()) sum = sum + torch::stack(at::_foreach_norm(grads)).sum().to(torch::kFloat32);
        if (col) {  // all ranks skip together
          auto t = torch::tensor({std::isfinite(sum.item<double>()) ? 0.0 : 1.0}, torch::kDouble);
          col->allreduce_sum(t);
          finite = t.item<double>() == 0;
        } else {
          finite = std::isfinite(sum.item<double>());
        }
      }
      if (finite) {
        opt->step();
        if (ema_net) ema_update();
        skips_in_row = 0;
      } else {
        restore_buffers();
        opt->zero_grad();
        ++skips_in_row;
        ++skipped_steps;
        if (lead)
          say("skipped a step: non-finite loss or gradients at epoch " + std::to_string(epoch + 1) + ", iteration " +
              std::to_string(it + 1) + " (no update; BatchNorm statistics restored)");
        if (skips_in_row >= kMaxSkipsInRow)
          throw std::runtime_error("training diverged: non-finite loss or gradients in " +
                                   std::to_string(kMaxSkipsInRow) + " steps in a row, up to epoch " +
                                   std::to_string(epoch + 1) + ", iteration " + std::to_string(it + 1) +
                                   " (a lower learning rate?)");
      }
      if (col && o.verify_sync) {  // every rank must now hold rank 0's weights bit for bit
        torch::NoGradGuard ng;
        std::vector<torch::Tensor> parts;
        for (auto& p : net->parameters()) parts.push_back(p.reshape(-1));
        auto mine = torch::cat(parts), ref = mine.clone();
        col->broadcast(ref, 0);
        const double d = (mine - ref).abs().max().item<double>();
        if (d != 0)
          throw std::runtime_error("verify_sync: rank " + std::to_string(o.rank) + " weights differ from rank 0's by " +
                                   std::to_string(d) + " after step " + std::to_string(global_step + 1));
      }
      ++global_step;
      ++it;
      double lv = main_loss.item<double>();
      bool stop = cb.stop_requested && cb.stop_requested();
      bool over_time = o.time_limit_min > 0 && seconds_since(t_start) > o.time_limit_min * 60;
      if (col) {  // the mean loss over ranks, and all ranks stop together
        auto t = torch::tensor({lv, stop ? 1.0 : 0.0, over_time ? 1.0 : 0.0}, torch::kDouble);
        col->allreduce_sum(t);
        lv = t[0].item<double>() / o.world;
        stop = t[1].item<double>() > 0;
        over_time = t[2].item<double>() > 0;
      }
      if (finite) {
        part_loss += lv;
        ++part_count;
      }
      part_images += static_cast<int64_t>(batch.indices.size());
      const double dt = seconds_since(t_it);
      step_time_avg = (step_time_avg * steps_timed + dt) / (steps_timed + 1);
      ++steps_timed;
      if (lead && cb.on_iteration) {
        TrainProgress p;
        p.epoch = epoch + 1;
        p.epochs = o.epochs;
        p.iter = it;
        p.iters = iters;
        p.loss = lv;
        p.lr = lr;
        const double el = part_seconds + seconds_since(t_epoch);
        p.images_per_s = el > 0 ? part_images * o.world / el : 0;
        p.eta_s = step_time_avg * static_cast<double>((o.epochs - epoch - 1) * iters_per_epoch + (iters - it));
        p.data_wait_share = el > 0 ? (part_wait + loader.wait_seconds() - wait_before) / el : 0;
        p.allreduce_share = el > 0 && grad_sync ? (grad_sync->seconds() - allreduce_before) / el : 0;
        cb.on_iteration(p);
      }
      if ((stop || over_time) && it < iters) {
        part_seconds += seconds_since(t_epoch);
        part_wait += loader.wait_seconds() - wait_before;
        if (lead) {
          save_checkpoint(last_path, epoch, it, true);
          say(std::string(stop ? "stop requested" : "time limit reached") + ": checkpoint written at epoch " + std::to_string(epoch + 1) + ", iteration " +
              std::to_string(it) + " (" + last_path + ")");
        }
        result.stopped_by_time = true;
        result.epochs_done = epoch;
        result.history = history;
        result.best_miou = best_miou;
        return result;
      }
    }
    // ---------------------------------------------------------------- end of epoch
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.loss = part_count ? part_loss / part_count : 0;
    rec.lr = poly_lr(o.lr, std::max<int64_t>(0, global_step - 1), total_steps, warmup, o.warmup_start, o.poly_power);
    rec.seconds = part_seconds + seconds_since(t_epoch);
    rec.images_per_s = rec.seconds > 0 ? part_images * o.world / rec.seconds : 0;
    rec.data_wait_share = rec.seconds > 0 ? (part_wait + loader.wait_seconds() - wait_before) / rec.seconds : 0;
    rec.allreduce_share = rec.seconds > 0 && grad_sync ? (grad_sync->seconds() - allreduce_before) / rec.seconds : 0;
    rec.skipped_steps = skipped_steps;
    if (col && !o.sync_bn) {  // keep BatchNorm statistics identical: rank 0's
      torch::NoGradGuard ng;
      for (auto& b : net->buffers()) col->broadcast(b, 0);
      if (ema_net)  // each rank averaged its own statistics
        for (auto& b : ema_net->buffers()) col->broadcast(b, 0);
      if (aux)
        for (auto& b : aux->buffers()) col->broadcast(b, 0);
    }
    const bool do_val = val_ds && o.val_every > 0 && ((epoch + 1) % o.val_every == 0 || epoch + 1 == o.epochs);
    if (lead && do_val) {
      EvalOptions eo;
      eo.device = device;
      auto r = evaluate(scored, meta, *val_ds, eo);
      rec.miou = r.miou();
      rec.pixel_acc = r.pixel_accuracy();
      net->train();
      if (ema_net) ema_net->eval();
    }
    history.push_back(rec);
    part_loss = part_seconds = part_wait = 0;
    part_count = part_images = skipped_steps = 0;
    if (lead) {
      if (rec.miou > best_miou) {
        best_miou = rec.miou;
        WeightsFile w = make_weights(scored, meta);
        w.extra["train"] = {{"epoch", epoch + 1}, {"val_miou", rec.miou}, {"options", o.to_json()}};
        write_weights(best_path, w);
      }
      save_checkpoint(last_path, epoch + 1, 0, true);
      write_log();
      if (cb.on_epoch) cb.on_epoch(rec);
    }
    result.epochs_done = epoch + 1;
    bool stop = cb.stop_requested && cb.stop_requested();
    bool over_time = o.time_limit_min > 0 && seconds_since(t_start) > o.time_limit_min * 60;
    if (col) {
      auto flags = torch::tensor({(stop || over_time) ? 1.0f : 0.0f});
      col->allreduce_sum(flags);
      over_time = over_time || flags[0].item<float>() > 0;
    }
    if ((stop || over_time) && epoch + 1 < o.epochs) {
      say(std::string(stop ? "stop requested" : "time limit reached") + " after epoch " + std::to_string(epoch + 1) + ": checkpoint written (" + last_path + ")");
      result.stopped_by_time = true;
      result.history = history;
      result.best_miou = best_miou;
      return result;
    }
  }
  result.finished = true;
  result.epochs_done = o.epochs;
  result.history = history;
  result.best_miou = best_miou;
  return result;
}

}  // namespace lightseg
