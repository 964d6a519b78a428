// The training loop (see include/lightseg/train.h for the contract). Its parts: the run
// folder (run_folder.h), the state in a checkpoint (checkpoint.cpp), the schedule
// (schedule.h), the optimizer (optimizer.h), the EMA (ema.h) and one step (step.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "lightseg/dataset.h"
#include "lightseg/distributed.h"
#include "lightseg/eval.h"
#include "lightseg/image_io.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "core/file_io.h"
#include "core/json_io.h"
#include "data/data_cache.h"
#include "data/loader.h"
#include "data/transforms.h"
#include "dist/gradient_sync.h"
#include "train/archive_bytes.h"
#include "train/aux_heads.h"
#include "train/ema.h"
#include "train/foreach_adam.h"
#include "train/optimizer.h"
#include "train/run_folder.h"
#include "train/schedule.h"
#include "train/step.h"
#include "train/step_time.h"

namespace lightseg {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Non-finite steps (NaN/inf loss or gradients: a reduced-precision overflow, a bad batch) are
// skipped, as a loss scaler does; only this many in a row count as divergence.
constexpr int kMaxSkipsInRow = 5;

class Trainer {
 public:
  Trainer(const TrainOptions& o, const TrainCallbacks& cb, std::shared_ptr<Collective> col)
      : o_(o), cb_(cb), col_(std::move(col)), lead_(o.rank == 0) {}
  TrainResult run();

 private:
  void say(const std::string& m) const {
    if (lead_ && cb_.on_message) cb_.on_message(m);
  }
  void check_process_group();
  void open_data();
  void cache_data();
  void choose_step_form();
  void lock_run_folder();
  void read_checkpoint();
  void build_model();
  void init_from_weights();
  void save_checkpoint(const std::string& path);
  void write_log();
  EvalResult validate();
  // True when all ranks are to stop now (a stop request or the time limit on any rank).
  bool all_stop(bool* requested);
  void verify_sync();
  TrainResult stopped(bool requested, bool mid_epoch);

  TrainOptions o_;
  const TrainCallbacks& cb_;
  std::shared_ptr<Collective> col_;
  const bool lead_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<SegDataset> train_ds_, val_ds_;
  ModelMeta meta_;
  fs::path out_;
  std::string last_path_, best_path_;
  std::unique_ptr<RunFolderLock> lock_;
  TrainState state_;             // what the next checkpoint records
  WeightsFile resumed_;          // the checkpoint resumed from (when have_resume_)
  bool have_resume_ = false;
  Network net_{nullptr}, ema_net_{nullptr}, scored_{nullptr};  // scored: what is validated and saved
  AuxHeads aux_{nullptr};
  std::unique_ptr<WeightsEma> ema_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<ForeachAdam> fused_;    // the optimizer's steps, when fused (opt_ holds the state)
  std::unique_ptr<DataCache> cache_;      // the decoded training set (data_cache host/device)
  bool cache_on_device_ = false;
  int sync_every_ = 1;                    // steps between reads of the loss (deferred steps)
  bool deferred_ = false;
  std::unique_ptr<GradientSync> grad_sync_;
  bool sync_bn_on_ = false;
  Clock::time_point t_start_;
  TrainResult result_;
};

void Trainer::check_process_group() {
  if (o_.world > 1) {
    if (!col_) throw std::invalid_argument("train: world > 1 needs a process group (Collective)");
    if (col_->rank() != o_.rank || col_->world() != o_.world)
      throw std::invalid_argument("train: rank/world (" + std::to_string(o_.rank) + "/" + std::to_string(o_.world) +
                                  ") differ from the process group's (" + std::to_string(col_->rank()) + "/" +
                                  std::to_string(col_->world()) + ")");
  } else {
    col_.reset();
  }
  device_ = o_.device;
  if (device_.is_cuda() && !torch::cuda::is_available())
    throw std::runtime_error("device cuda: this LibTorch build has no CUDA or no GPU is visible");
  // The crop is fixed: cuDNN's autotuner times each convolution's algorithms once and keeps the fastest.
  if (device_.is_cuda()) at::globalContext().setBenchmarkCuDNN(true);
}

void Trainer::open_data() {
  if (!o_.val_groups.empty()) {  // sequence-disjoint: pool both splits, hold out whole groups
    GroupSplit g = split_by_groups(SegDataset::open(o_.dataset, o_.data, pool_splits(o_.train_split, o_.val_split)),
                                   o_.group_by, o_.val_groups);
    say("sequence-disjoint validation (" + pool_splits(o_.train_split, o_.val_split) + " pooled, groups by " +
        (o_.group_by.empty() ? std::string("the dataset's default") : o_.group_by) + "): " + g.describe());
    train_ds_ = std::make_unique<SegDataset>(std::move(g.train));
    val_ds_ = std::make_unique<SegDataset>(std::move(g.val));
  } else {
    train_ds_ = std::make_unique<SegDataset>(SegDataset::open(o_.dataset, o_.data, o_.train_split));
  }
  if (o_.val_every > 0 && !val_ds_) {
    try {
      val_ds_ = std::make_unique<SegDataset>(SegDataset::open(o_.dataset, o_.data, o_.val_split));
    } catch (const std::exception& e) {
      say(std::string("no validation split (") + e.what() + "): training without val mIoU");
    }
  }
  if (val_ds_ && o_.val_groups.empty()) {  // frames of one video on both sides: say so
    try {
      auto tg = group_counts(train_ds_->groups(o_.group_by)), vg = group_counts(val_ds_->groups(o_.group_by));
      std::vector<std::pair<std::string, size_t>> shared;
      for (const auto& v : vg)
        if (std::any_of(tg.begin(), tg.end(), [&](const auto& t) { return t.first == v.first; })) shared.push_back(v);
      if (!shared.empty())
        say("note: val images of groups also trained on (" + describe_groups(shared) +
            "): neighbouring frames make val mIoU optimistic; --val-groups holds out whole groups");
    } catch (const std::exception&) {  // no grouping for these names: nothing to say
    }
  }
  meta_ = train_ds_->meta();
  if (o_.network.num_classes != train_ds_->num_classes()) {
    say("num_classes set to the dataset's " + std::to_string(train_ds_->num_classes()));
    o_.network.num_classes = train_ds_->num_classes();
  }
}

// One trainer per run folder: two would overwrite each other's checkpoints and log. Only rank
// 0 writes the folder, so only rank 0 locks it (other ranks on its machine would otherwise
// find it locked by rank 0); the others learn of its failure here, at once, rather than when
// the process group times out waiting for it.
void Trainer::lock_run_folder() {
  fs::create_directories(o_.out_dir);
  out_ = fs::path(o_.out_dir);
  last_path_ = (out_ / "last.lsw").string();
  best_path_ = (out_ / "best.lsw").string();
  std::string lock_error;
  if (lead_) {
    try {
      lock_ = std::make_unique<RunFolderLock>(o_.out_dir);
    } catch (const std::exception& e) {
      lock_error = e.what();
    }
  }
  if (col_) {
    auto failed = torch::tensor({lock_error.empty() ? 0.0 : 1.0}, torch::kDouble);
    col_->allreduce_sum(failed);
    if (failed.item<double>() > 0 && lock_error.empty())
      throw std::runtime_error("rank 0 could not lock the run folder '" + o_.out_dir + "' (see its message)");
  }
  if (!lock_error.empty()) throw std::runtime_error(lock_error);
  if (lock_ && !lock_->unsupported().empty())
    say("warning: cannot lock the run folder " + o_.out_dir + " (" + lock_->unsupported() +
        "): a second training on it would not be stopped");
  if (!lead_) return;
  // A kill during a write leaves NAME.tmp.PID behind for good (write_file_atomic); with the
  // folder locked none of these is in progress.
  auto stale = remove_stale_temporaries(o_.out_dir, {"last.lsw", "best.lsw", "log.jsonl", "curve.svg", "class_weights.json"});
  if (!stale.removed.empty()) {
    std::string names;
    for (const auto& n : stale.removed) names += (names.empty() ? "" : ", ") + n;
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.1f MB", stale.bytes / 1e6);
    say("removed " + std::to_string(stale.removed.size()) + " stale temporary file(s) of interrupted checkpoint writes (" +
        mb + ") from " + o_.out_dir + ": " + names);
  }
  for (const auto& k : stale.kept) say("left " + k + " in " + o_.out_dir + ": not removed while its writer may be at work");
}

void Trainer::read_checkpoint() {
  if (!fs::exists(last_path_)) {
    if (o_.resume) say("no checkpoint in " + o_.out_dir + ": starting a new run");
    return;
  }
  if (!o_.resume)
    throw std::runtime_error("'" + last_path_ + "' exists: continue that run (--resume) or choose another run folder (--out)");
  resumed_ = read_weights(last_path_);
  auto s = train_state(resumed_);
  if (!s) throw std::runtime_error("'" + last_path_ + "' is a weights file without training state");
  have_resume_ = true;
  if (resumed_.config != o_.network) say("resuming with the network configuration stored in the checkpoint");
  o_.network = resumed_.config;
  state_ = *s;
  state_.options = o_;
  if (state_.batch > 0 && state_.world != o_.world) {
    say("checkpoint was written mid-epoch by " + std::to_string(state_.world) + " ranks, now " +
        std::to_string(o_.world) + ": restarting epoch " + std::to_string(state_.epoch + 1) + " from its start");
    state_.batch = 0;
    state_.part_loss = state_.part_seconds = state_.part_wait = 0;
    state_.part_count = state_.part_images = state_.part_skipped = 0;
  }
  if (state_.epoch >= o_.epochs)
    say(last_path_ + " has finished its " + std::to_string(o_.epochs) + " epochs: nothing left to train");
  else
    say("resuming from " + last_path_ + " at epoch " + std::to_string(state_.epoch + 1) + ", batch " +
        std::to_string(state_.batch));
}

// data_cache: the training set decoded once, to the host or the training device.
void Trainer::cache_data() {
  const std::string mode = o_.data_cache == "auto" ? (device_.is_cuda() ? "device" : "off") : o_.data_cache;
  if (mode == "off") return;
  const torch::Device where = mode == "device" ? device_ : torch::Device(torch::kCPU);
  const auto t0 = Clock::now();
  try {
    cache_ = std::make_unique<DataCache>(DataCache::build(*train_ds_, where, std::max(1, o_.workers)));
  } catch (const std::exception& e) {
    if (o_.data_cache != "auto") throw;
    say(std::string("data cache off: ") + e.what());
    return;
  }
  cache_on_device_ = mode == "device";
  char b[160];
  std::snprintf(b, sizeof b, "data cache: %ld images of %ldx%ld (%.0f MB) decoded to %s in %.1f s",
                static_cast<long>(cache_->size()), static_cast<long>(cache_->width()), static_cast<long>(cache_->height()),
                cache_->bytes() / 1e6, where.str().c_str(), seconds_since(t0));
  say(b);
}

// The fused optimizer (fused_optimizer) and the deferred non-finite check (sync_every).
void Trainer::choose_step_form() {
  const bool fused = o_.fused_optimizer == "on" || (o_.fused_optimizer == "auto" && device_.is_cuda());
  if (fused && o_.optimizer == "sgd") {
    if (o_.fused_optimizer == "on") say("fused optimizer: SGD runs torch's");
  } else if (fused) {
    try {
      fused_ = std::make_unique<ForeachAdam>(*opt_, o_.optimizer == "adamw");
    } catch (const std::invalid_argument& e) {
      say(std::string(e.what()) + ": torch's optimizer instead");
    }
  }
  sync_every_ = o_.sync_every > 0 ? o_.sync_every : (device_.is_cuda() ? 20 : 1);
  if (sync_every_ > 1) {
    std::string why = !fused_ ? "the fused optimizer" : ema_ ? "no EMA" : col_ ? "one process" : "";
    if (why.empty()) deferred_ = true;
    else if (o_.sync_every > 1) say("sync_every " + std::to_string(o_.sync_every) + " needs " + why + ": the loss is read every step");
    if (!deferred_) sync_every_ = 1;
  }
}

// The network, the auxiliary heads, the EMA copy, the optimizer and the distributed parts,
// fresh or from the checkpoint. A checkpoint of an EMA run holds the average as its
// (inference) tensors and the raw weights the optimizer works on as the "raw_weights" blob.
void Trainer::build_model() {
  torch::manual_seed(o_.seed);
  net_ = Network(o_.network);
  const bool use_ema = o_.ema_decay > 0, use_aux = o_.aux_weight > 0;
  const bool ckpt_ema = have_resume_ && resumed_.blobs.count("raw_weights") > 0;
  const bool ckpt_aux = have_resume_ && resumed_.blobs.count("aux_heads") > 0;
  if (have_resume_) {
    if (ckpt_ema) from_archive_bytes(*net_, resumed_.blobs.at("raw_weights"));
    else load_into(net_, resumed_);
    if (ckpt_ema && !use_ema) say("EMA off: continuing from the checkpoint's raw weights, not its average");
  } else if (!o_.init_weights.empty()) {
    init_from_weights();
  }
  // Auxiliary heads on M1 (C1.3) and M2 (C1.5): outside the network, so never in its weights.
  if (use_aux) {
    aux_ = AuxHeads(o_.network.c1, o_.network.c2, o_.network.num_classes);
    if (ckpt_aux) from_archive_bytes(*aux_, resumed_.blobs.at("aux_heads"));
    else if (have_resume_) say("the checkpoint has no auxiliary heads: starting new ones");
  } else if (ckpt_aux) {
    say("aux_weight 0: the checkpoint's auxiliary heads are dropped");
  }
  if (use_ema) {
    ema_net_ = Network(o_.network);
    if (ckpt_ema) {
      load_into(ema_net_, resumed_);
    } else {
      if (have_resume_) say("the checkpoint has no EMA: the average starts from its weights");
      state_.ema_steps = 0;
      WeightsEma::copy_weights(ema_net_, net_);
    }
    ema_net_->to(device_);
    if (o_.channels_last) to_channels_last(*ema_net_);
    ema_net_->eval();  // only ever averaged into and scored
  }
  net_->to(device_);
  if (o_.channels_last) to_channels_last(*net_);
  net_->train();
  if (aux_) {
    aux_->to(device_);
    if (col_) {  // rank 0's heads everywhere (before channels_last: flat, contiguous)
      torch::NoGradGuard ng;
      for (auto& p : aux_->parameters()) col_->broadcast(p, 0);
      for (auto& b : aux_->buffers()) col_->broadcast(b, 0);
    }
    if (o_.channels_last) to_channels_last(*aux_);
    aux_->train();
  }
  // Distributed: same weights everywhere (rank 0's), SyncBN, bucketed gradient all-reduce.
  if (col_) {
    broadcast_model(*col_, net_);
    if (o_.sync_bn) {
      enable_sync_batchnorm(col_);
      sync_bn_on_ = true;
    }
    grad_sync_ = std::make_unique<GradientSync>(net_, col_, static_cast<size_t>(o_.bucket_mb * (1 << 20)), o_.overlap_allreduce);
  }
  opt_ = make_optimizer(o_, net_, aux_);
  std::string opt_blob = have_resume_ && resumed_.blobs.count("optimizer") ? resumed_.blobs.at("optimizer") : "";
  if (!opt_blob.empty() && ckpt_aux != use_aux) {
    say(std::string("auxiliary heads ") + (use_aux ? "added" : "removed") +
        " on resume: the optimizer's parameters changed, its state starts afresh");
    opt_blob.clear();
  }
  if (!opt_blob.empty()) from_archive_bytes(*opt_, opt_blob, device_);
  if (ema_net_) ema_ = std::make_unique<WeightsEma>(ema_net_, net_, o_.ema_decay, state_.ema_steps);
  scored_ = ema_net_ ? ema_net_ : net_;
  resumed_ = WeightsFile{};  // its tensors are loaded: free them
}

// Fine-tuning (--init-weights): every tensor of the file that fits is loaded, the rest (the
// classifier of another class count, say) keep their fresh initialisation; what happened is said.
void Trainer::init_from_weights() {
  WeightsFile w = read_weights(o_.init_weights);
  PartialLoad r = load_matching(net_, w);
  if (r.loaded.size() * 2 < r.model_tensors)
    throw std::runtime_error("--init-weights '" + o_.init_weights + "' fits " + std::to_string(r.loaded.size()) + " of " +
                             std::to_string(r.model_tensors) + " tensors of the network being trained: its network is " +
                             w.config.to_json_string() + ", this one " + o_.network.to_json_string() +
                             " (give the same network keys with --config/--set)");
  say("initialised from " + o_.init_weights + ": " + r.summary());
}

void Trainer::save_checkpoint(const std::string& path) {
  WeightsFile w = make_weights(scored_, meta_);
  if (ema_net_) w.blobs["raw_weights"] = to_archive_bytes(*net_);
  if (aux_) w.blobs["aux_heads"] = to_archive_bytes(*aux_);
  if (fused_) fused_->export_state();
  w.blobs["optimizer"] = to_archive_bytes(*opt_);
  state_.options = o_;
  state_.world = o_.world;
  if (ema_) state_.ema_steps = ema_->steps();
  set_train_state(w, state_);
  write_weights(path, w);
}

void Trainer::write_log() {
  std::string s;
  for (const auto& r : state_.history) s += r.to_json_string() + "\n";
  write_file_atomic((out_ / "log.jsonl").string(), s);
  write_curve_svg((out_ / "curve.svg").string(), state_.history, "lightseg on " + o_.dataset + " (" + meta_.dataset + ")");
}

EvalResult Trainer::validate() {
  EvalOptions eo;
  eo.engine.device = device_;
  return evaluate(scored_, meta_, *val_ds_, eo);
}

bool Trainer::all_stop(bool* requested) {
  bool stop = cb_.stop_requested && cb_.stop_requested();
  bool over_time = o_.time_limit_min > 0 && seconds_since(t_start_) > o_.time_limit_min * 60;
  if (col_) {
    auto t = torch::tensor({stop ? 1.0 : 0.0, over_time ? 1.0 : 0.0}, torch::kDouble);
    col_->allreduce_sum(t);
    stop = t[0].item<double>() > 0;
    over_time = t[1].item<double>() > 0;
  }
  *requested = stop;
  return stop || over_time;
}

// Every rank must now hold rank 0's weights bit for bit (TrainOptions::verify_sync).
void Trainer::verify_sync() {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> parts;
  for (auto& p : net_->parameters()) parts.push_back(p.reshape(-1));
  auto mine = torch::cat(parts), ref = mine.clone();
  col_->broadcast(ref, 0);
  const double d = (mine - ref).abs().max().item<double>();
  if (d != 0)
    throw std::runtime_error("verify_sync: rank " + std::to_string(o_.rank) + " weights differ from rank 0's by " +
                             std::to_string(d) + " after step " + std::to_string(state_.global_step + 1));
}

TrainResult Trainer::stopped(bool requested, bool mid_epoch) {
  const std::string why = requested ? "stop requested" : "time limit reached";
  if (mid_epoch)
    say(why + ": checkpoint written at epoch " + std::to_string(state_.epoch + 1) + ", iteration " +
        std::to_string(state_.batch) + " (" + last_path_ + ")");
  else
    say(why + " after epoch " + std::to_string(state_.epoch) + ": checkpoint written (" + last_path_ + ")");
  result_.stopped_by_time = true;
  result_.epochs_done = state_.epoch;
  result_.history = state_.history;
  result_.best_miou = state_.best_miou;
  return result_;
}

TrainResult Trainer::run() {
  o_.validate();
  check_process_group();
  open_data();
  lock_run_folder();
  read_checkpoint();
  struct SyncBNGuard {
    bool* on;
    ~SyncBNGuard() {
      if (*on) disable_sync_batchnorm();
    }
  } syncbn_guard{&sync_bn_on_};
  build_model();
  choose_step_form();
  cache_data();

  torch::Tensor weight;
  if (o_.loss != "ce") {
    std::vector<float> w =
        o_.class_weights.empty() ? cached_class_weights(*train_ds_, o_, [this](const std::string& m) { say(m); }) : o_.class_weights;
    if (static_cast<int>(w.size()) != train_ds_->num_classes())
      throw std::invalid_argument("class_weights has " + std::to_string(w.size()) + " entries but the dataset has " +
                                  std::to_string(train_ds_->num_classes()) + " classes");
    weight = torch::tensor(w).to(device_);
  }
  AugmentOptions aug;
  aug.crop_h = o_.crop_h;
  aug.crop_w = o_.crop_w;
  aug.scale_min = o_.scale_min;
  aug.scale_max = o_.scale_max;
  aug.flip = o_.flip;
  aug.jitter = o_.jitter;

  const int64_t iters_per_epoch =
      static_cast<int64_t>(epoch_batches(train_ds_->size(), o_.batch, o_.seed, 0, o_.rank, o_.world, o_.max_iters).size());
  if (iters_per_epoch == 0)
    throw std::runtime_error("the training split has " + std::to_string(train_ds_->size()) +
                             " images: fewer than one batch of " + std::to_string(o_.batch) + " per rank");
  const int64_t total_steps = iters_per_epoch * o_.epochs;
  const int64_t warmup = static_cast<int64_t>(std::llround(o_.warmup_epochs * iters_per_epoch));
  auto lr_at = [&](int64_t step) { return poly_lr(o_.lr, step, total_steps, warmup, o_.warmup_start, o_.poly_power); };

  TrainStep step({o_, device_, net_, aux_, *opt_, weight, col_, grad_sync_.get(), ema_.get(), cb_.after_backward,
                  fused_.get(), deferred_});
  // A resumed run folder's log and curve are the checkpoint's whole history at once: a checkpoint
  // copied into a new folder (as scripts/train_camvid_trainval.sh does) brings its log with it,
  // even when its schedule is already finished and no epoch is left to write them.
  if (have_resume_ && lead_) write_log();
  t_start_ = Clock::now();
  result_.best_miou = state_.best_miou;
  StepTimeEstimate step_time;  // seconds per iteration, for the ETA
  int skips_in_row = 0;
  double last_loss = 0;  // deferred steps: the mean loss of the last steps read
  TrainState& s = state_;
  const SegDataset& train_ds = *train_ds_;

  for (int epoch = s.epoch; epoch < o_.epochs; ++epoch) {
    auto batches = epoch_batches(train_ds.size(), o_.batch, o_.seed, epoch, o_.rank, o_.world, o_.max_iters);
    const int64_t iters = static_cast<int64_t>(batches.size());
    if (s.batch == 0) {
      s.part_loss = s.part_seconds = s.part_wait = 0;
      s.part_count = s.part_images = s.part_skipped = 0;
    }
    std::vector<std::vector<size_t>> todo(batches.begin() + std::min<int64_t>(s.batch, iters), batches.end());
    const uint64_t seed = o_.seed;
    auto from_cache = [&, seed, epoch](const std::vector<size_t>& idx) {
      std::vector<AugmentDraw> draws;
      for (size_t i : idx) {
        std::mt19937_64 rng(sample_seed(seed, epoch, i));
        draws.push_back(draw_augment(aug, cache_->height(), cache_->width(), rng));
      }
      Batch b;
      std::tie(b.images, b.labels) = cache_->batch(idx, draws, aug, meta_);
      return b;
    };
    BatchLoader loader(
        cache_ ? BatchLoader::MakeBatch(from_cache) : [&, seed, epoch](const std::vector<size_t>& idx) {
          std::vector<torch::Tensor> xs, ys;
          for (size_t i : idx) {
            std::mt19937_64 rng(sample_seed(seed, epoch, i));
            auto [img, lab] = train_ds.load(i);
            auto [x, y] = augment(to_rgb_chw_float(img), lab, aug, meta_.mean, rng);
            xs.push_back(normalize(x, meta_));
            ys.push_back(y.to(torch::kLong));
          }
          Batch b;
          b.images = torch::stack(xs);
          b.labels = torch::stack(ys);
          return b;
        },
        todo, o_.workers, o_.prefetch, cache_on_device_);
    const auto t_epoch = Clock::now();
    const double wait_before = loader.wait_seconds();
    const double allreduce_before = grad_sync_ ? grad_sync_->seconds() : 0.0;
    Batch batch;
    while (true) {
      if (cb_.kill_now && cb_.kill_now(epoch + 1, s.batch + 1)) {
        result_.killed = true;
        result_.history = s.history;
        return result_;
      }
      const auto t_it = Clock::now();
      if (!loader.next(batch)) break;
      const double lr = lr_at(s.global_step);
      set_learning_rate(*opt_, lr);
      auto x = batch.images.to(device_);
      auto y = batch.labels.to(device_);
      if (o_.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
      StepResult r = step.run(x, y);
      if (deferred_) {
        // read with the totals below
      } else if (r.finite) {
        skips_in_row = 0;
      } else {
        ++skips_in_row;
        ++s.part_skipped;
        say("skipped a step: non-finite loss or gradients at epoch " + std::to_string(epoch + 1) + ", iteration " +
            std::to_string(s.batch + 1) + " (no update; BatchNorm statistics restored)");
        if (skips_in_row >= kMaxSkipsInRow)
          throw std::runtime_error("training diverged: non-finite loss or gradients in " + std::to_string(kMaxSkipsInRow) +
                                   " steps in a row, up to epoch " + std::to_string(epoch + 1) + ", iteration " +
                                   std::to_string(s.batch + 1) + " (a lower learning rate?)");
      }
      if (col_ && o_.verify_sync) verify_sync();
      ++s.global_step;
      ++s.batch;
      double lv = r.loss;
      if (col_) {  // the mean loss over ranks
        auto t = torch::tensor({lv}, torch::kDouble);
        col_->allreduce_sum(t);
        lv = t[0].item<double>() / o_.world;
      }
      bool requested = false;
      const bool stop = all_stop(&requested);
      if (deferred_ && (stop || s.batch % sync_every_ == 0 || s.batch == iters)) {
        const StepTotals t = step.take_totals();
        s.part_loss += t.loss_sum;
        s.part_count += t.finite;
        s.part_skipped += t.steps - t.finite;
        if (t.finite > 0) last_loss = t.loss_sum / static_cast<double>(t.finite);
        if (t.steps > t.finite)
          say("skipped " + std::to_string(t.steps - t.finite) + " of the last " + std::to_string(t.steps) +
              " steps: non-finite loss or gradients, up to epoch " + std::to_string(epoch + 1) + ", iteration " +
              std::to_string(s.batch) + " (no update; BatchNorm statistics restored)");
        if (t.max_skips_in_row >= kMaxSkipsInRow)
          throw std::runtime_error("training diverged: non-finite loss or gradients in " + std::to_string(kMaxSkipsInRow) +
                                   " steps in a row, up to epoch " + std::to_string(epoch + 1) + ", iteration " +
                                   std::to_string(s.batch) + " (a lower learning rate?)");
      }
      if (deferred_) {
        lv = last_loss;
      } else if (r.finite) {
        s.part_loss += lv;
        ++s.part_count;
      }
      s.part_images += static_cast<int64_t>(batch.indices.size());
      const double dt = seconds_since(t_it);
      step_time.add(dt);
      if (lead_ && cb_.on_iteration) {
        TrainProgress p;
        p.epoch = epoch + 1;
        p.epochs = o_.epochs;
        p.iter = s.batch;
        p.iters = iters;
        p.loss = lv;
        p.lr = lr;
        const double el = s.part_seconds + seconds_since(t_epoch);
        p.images_per_s = el > 0 ? s.part_images * o_.world / el : 0;
        p.eta_s = step_time.seconds_per_step() * static_cast<double>((o_.epochs - epoch - 1) * iters_per_epoch + (iters - s.batch));
        p.data_wait_share = el > 0 ? (s.part_wait + loader.wait_seconds() - wait_before) / el : 0;
        p.allreduce_share = el > 0 && grad_sync_ ? (grad_sync_->seconds() - allreduce_before) / el : 0;
        cb_.on_iteration(p);
      }
      if (stop && s.batch < iters) {
        s.part_seconds += seconds_since(t_epoch);
        s.part_wait += loader.wait_seconds() - wait_before;
        s.epoch = epoch;
        if (lead_) save_checkpoint(last_path_);
        return stopped(requested, true);
      }
    }
    // ---------------------------------------------------------------- end of epoch
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.loss = s.part_count ? s.part_loss / s.part_count : 0;
    rec.lr = lr_at(std::max<int64_t>(0, s.global_step - 1));
    rec.seconds = s.part_seconds + seconds_since(t_epoch);
    rec.images_per_s = rec.seconds > 0 ? s.part_images * o_.world / rec.seconds : 0;
    rec.data_wait_share = rec.seconds > 0 ? (s.part_wait + loader.wait_seconds() - wait_before) / rec.seconds : 0;
    rec.allreduce_share = rec.seconds > 0 && grad_sync_ ? (grad_sync_->seconds() - allreduce_before) / rec.seconds : 0;
    rec.skipped_steps = s.part_skipped;
    if (col_ && !o_.sync_bn) {  // keep BatchNorm statistics identical: rank 0's
      torch::NoGradGuard ng;
      for (auto& b : net_->buffers()) col_->broadcast(b, 0);
      if (ema_net_)  // each rank averaged its own statistics
        for (auto& b : ema_net_->buffers()) col_->broadcast(b, 0);
      if (aux_)
        for (auto& b : aux_->buffers()) col_->broadcast(b, 0);
    }
    const bool do_val = val_ds_ && o_.val_every > 0 && ((epoch + 1) % o_.val_every == 0 || epoch + 1 == o_.epochs);
    if (lead_ && do_val) {
      auto r = validate();
      rec.miou = r.miou();
      rec.pixel_acc = r.pixel_accuracy();
    }
    s.history.push_back(rec);
    s.epoch = epoch + 1;
    s.batch = 0;
    s.part_loss = s.part_seconds = s.part_wait = 0;
    s.part_count = s.part_images = s.part_skipped = 0;
    if (lead_) {
      if (rec.miou > s.best_miou) {
        s.best_miou = rec.miou;
        WeightsFile w = make_weights(scored_, meta_);
        TrainState best;
        best.epoch = epoch + 1;
        best.val_miou = rec.miou;
        best.best_miou = rec.miou;
        best.options = o_;
        set_train_state(w, best);
        write_weights(best_path_, w);
      }
      save_checkpoint(last_path_);
      write_log();
      if (cb_.on_epoch) cb_.on_epoch(rec);
    }
    result_.epochs_done = epoch + 1;
    bool requested = false;
    if (all_stop(&requested) && epoch + 1 < o_.epochs) return stopped(requested, false);
  }
  result_.finished = true;
  result_.epochs_done = o_.epochs;
  result_.history = s.history;
  result_.best_miou = s.best_miou;
  return result_;
}

}  // namespace

TrainResult train(const TrainOptions& o, const TrainCallbacks& cb, std::shared_ptr<Collective> col) {
  return Trainer(o, cb, std::move(col)).run();
}

}  // namespace lightseg
