// The trainer's set-up (see trainer.h): the process group and device, the data, the
// network with its EMA, auxiliary heads and optimizer (fresh, fine-tuned or resumed), the step form.
#include <algorithm>
#include <cstdio>

#include "lightseg/file_io.h"
#include "train/archive_bytes.h"
#include "train/compact_state.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace lightseg::detail {

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
  trained_on_ = describe_training_data(*train_ds_, o_.dataset, o_.data,
                                      o_.val_groups.empty() ? o_.train_split : pool_splits(o_.train_split, o_.val_split),
                                      o_.group_by, o_.val_groups);
  meta_ = train_ds_->meta();
  if (o_.network.num_classes != train_ds_->num_classes()) {
    say("num_classes set to the dataset's " + std::to_string(train_ds_->num_classes()));
    o_.network.num_classes = train_ds_->num_classes();
  }
}

// The crop: as set, or from the training images' size (TrainOptions::crop_h); the options then
// hold the crop chosen, so checkpoints store it and a resumed run keeps it.
void Trainer::choose_crop_from_data() {
  crop_ = choose_crop(o_, sample_image_sizes(*train_ds_), train_ds_->size());
  o_.crop_h = crop_.h;
  o_.crop_w = crop_.w;
  if (!crop_.warning.empty()) say(crop_.warning);
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
  if (o_.cuda_graph == "on") {
    const std::string why = graph_step_unavailable(o_, deferred_, static_cast<bool>(cb_.after_backward));
    graph_step_ = why.empty();
    if (!graph_step_) say("cuda graph: needs " + why + ": the step runs eagerly");
    else if (!device_.is_cuda() || !cuda_graphs_compiled())
      say("cuda graph: no CUDA here: the step runs as it would be captured (fixed buffers, the learning rate on the "
          "device), uncaptured");
  }
}

// The network, the auxiliary heads, the EMA copy, the optimizer and the distributed parts,
// fresh or from the checkpoint. A checkpoint of an EMA run holds the average as its
// (inference) tensors and the raw weights the optimizer works on as the "raw_weights" blob.
void Trainer::build_model() {
  torch::manual_seed(o_.seed);
  net_ = Network(o_.network);
  const bool use_ema = o_.ema_decay > 0, use_aux = o_.aux_weight > 0;
  const bool ckpt_ema = have_resume_ && (resumed_.blobs.count("raw_weights") || resumed_.blobs.count("raw_weights_q8"));
  const bool ckpt_aux = have_resume_ && resumed_.blobs.count("aux_heads") > 0;
  if (have_resume_) {
    if (ckpt_ema && resumed_.blobs.count("raw_weights")) {
      from_archive_bytes(*net_, resumed_.blobs.at("raw_weights"));
    } else {
      load_into(net_, resumed_);
      if (ckpt_ema) {  // compact: the average plus the raw weights' difference from it
        add_weights_delta(*net_, resumed_.blobs.at("raw_weights_q8"));
        say("compact checkpoint: the raw weights are the average plus their 8-bit difference from it");
      }
    }
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
  if (!o_.distill_from.empty()) {  // the teacher: a constant network, in eval mode
    teacher_ = load_network(o_.distill_from);
    if (teacher_->config().num_classes != o_.network.num_classes)
      throw std::invalid_argument("distill_from '" + o_.distill_from + "' has " +
                                  std::to_string(teacher_->config().num_classes) + " classes, the network " +
                                  std::to_string(o_.network.num_classes));
    for (auto& p : teacher_->parameters()) p.set_requires_grad(false);
    teacher_->to(device_);
    if (o_.channels_last) to_channels_last(*teacher_);
    teacher_->eval();
    char how[96];
    std::snprintf(how, sizeof how, " parameters), weight %g, temperature %g", o_.distill_weight, o_.distill_temperature);
    say("distillation from " + o_.distill_from + " (" + std::to_string(count_parameters(*teacher_)) + how);
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
  if (!opt_blob.empty()) {
    load_optimizer_bytes(*opt_, opt_blob, device_);
    if (const int64_t restarted = expand_optimizer_state(*opt_))
      say("compact checkpoint: the optimizer's first moments of " + std::to_string(restarted) +
          " tensors restart at zero (second moments kept)");
  }
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

}  // namespace lightseg::detail
