// The training loop (see include/lightseg/train.h for the contract). Its parts: the trainer's
// set-up (trainer_setup.cpp), its run folder and checkpoints (trainer_checkpoint.cpp), the state
// in a checkpoint (checkpoint.cpp), the schedule (schedule.h), the optimizer (optimizer.h), the
// EMA (ema.h) and one step (step.h).
#include <algorithm>
#include <cmath>
#include <random>

#include "lightseg/image_io.h"
#include "data/loader.h"
#include "data/transforms.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/step.h"
#include "train/step_time.h"
#include "train/trainer.h"

namespace lightseg {
namespace detail {

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

// One line at the start: what is trained on, how long, in what form.
void Trainer::say_schedule(int64_t iters_per_epoch) const {
  const bool bf16 = device_.is_cuda() ? o_.amp : o_.amp_cpu;
  std::string precision = bf16 ? "bf16 autocast" : "fp32";
  precision += " (" + (o_.precision_origin.empty() ? std::string(device_.is_cuda() ? "the amp option" : "the amp_cpu option")
                                                   : o_.precision_origin) + ")";
  const std::string splits = o_.val_groups.empty() ? o_.train_split : pool_splits(o_.train_split, o_.val_split) + " less val groups";
  say("schedule: " + o_.dataset + " '" + folder_name(o_.data) + "' " + splits + ", " +
      std::to_string(train_ds_->size()) + " images; " + std::to_string(o_.epochs) + " epochs x " +
      std::to_string(iters_per_epoch) + " iterations of batch " + std::to_string(o_.batch) +
      (o_.world > 1 ? " x " + std::to_string(o_.world) + " ranks" : "") + "; crop " + std::to_string(o_.crop_h) + "x" +
      std::to_string(o_.crop_w) + " (" + crop_.origin + "); " + precision + "; " + describe_lr_schedule(o_) +
      "; ETA after " + std::to_string(kEtaAfterSteps) + " iterations");
}

TrainResult Trainer::run() {
  o_.validate();
  check_process_group();
  open_data();
  choose_crop_from_data();
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
  aug.blur = o_.blur;
  aug.noise = o_.noise;

  const int64_t iters_per_epoch =
      static_cast<int64_t>(epoch_batches(train_ds_->size(), o_.batch, o_.seed, 0, o_.rank, o_.world, o_.max_iters).size());
  if (iters_per_epoch == 0)
    throw std::runtime_error("the training split has " + std::to_string(train_ds_->size()) +
                             " images: fewer than one batch of " + std::to_string(o_.batch) + " per rank");
  const int64_t total_steps = iters_per_epoch * o_.epochs;
  const int64_t warmup = static_cast<int64_t>(std::llround(o_.warmup_epochs * iters_per_epoch));
  auto lr_at = [&](int64_t step) { return poly_lr(o_.lr, step, total_steps, warmup, o_.warmup_start, o_.poly_power); };
  say_schedule(iters_per_epoch);

  TrainStep step({o_, device_, net_, aux_, *opt_, weight, col_, grad_sync_.get(), ema_.get(), cb_.after_backward,
                  fused_.get(), deferred_, teacher_});
  std::unique_ptr<GraphedStep> graphed;
  std::string graph_state;
  if (graph_step_) graphed = std::make_unique<GraphedStep>(step, *fused_);
  // A resumed run folder's log and curve are the checkpoint's whole history at once: a checkpoint
  // copied into a new folder (as scripts/train_camvid_trainval.sh does) brings its log with it,
  // even when its schedule is already finished and no epoch is left to write them.
  if (have_resume_ && lead_) write_log();
  t_start_ = Clock::now();
  result_.best_miou = state_.best_miou;
  StepTimeEstimate step_time;  // seconds per iteration, for the ETA
  // The ETA also counts the epoch ends to come: a validation and a checkpoint (each as last timed).
  double val_s = 0, end_s = 0;
  bool val_timed = false;
  auto eta = [&](int epoch, int64_t iters, int64_t done) {
    const int64_t steps = (o_.epochs - epoch - 1) * iters_per_epoch + (iters - done);
    const bool has_val = val_ds_ && o_.val_every > 0;
    return step_time.seconds_per_step() * static_cast<double>(steps) + end_s * (o_.epochs - epoch) +
           (has_val ? val_s * static_cast<double>(validations_left(epoch + 1, o_.epochs, o_.val_every)) : 0.0);
  };
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
      StepResult r;
      if (graphed) {
        graphed->run(x, y);
        r.loss = std::nan("");
        if (device_.is_cuda() && graphed->state() != graph_state && graphed->state() != "warming up") {
          graph_state = graphed->state();
          say(graph_state == "captured" ? "cuda graph: the step is captured; replaying it"
              : graphed->failure().empty() ? std::string("cuda graph: this build has no CUDA graphs: the step runs eagerly")
                                          : "cuda graph: the capture failed (" + graphed->failure() + "): the step runs eagerly");
        }
      } else {
        r = step.run(x, y);
      }
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
      if (step_time.steps() == kEtaAfterSteps) {
        const bool val_to_time = val_ds_ && o_.val_every > 0 && !val_timed;
        say("time: " + std::to_string(step_time.seconds_per_step()).substr(0, 5) + " s per iteration after " +
            std::to_string(kEtaAfterSteps) + ": about " + format_duration(eta(epoch, iters, s.batch)) + " to go" +
            (val_to_time ? " (validation not yet timed)" : ""));
      }
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
        p.eta_s = eta(epoch, iters, s.batch);
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
      const auto t_val = Clock::now();
      auto r = validate();
      rec.miou = r.miou();
      rec.pixel_acc = r.pixel_accuracy();
      val_s = seconds_since(t_val);
      val_timed = true;
    }
    const auto t_end = Clock::now();
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
        set_training_data(w, trained_on_);
        write_weights(best_path_, w);
      }
      save_checkpoint(last_path_);
      write_log();
      end_s = seconds_since(t_end);
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

}  // namespace detail

TrainResult train(const TrainOptions& o, const TrainCallbacks& cb, std::shared_ptr<Collective> col) {
  return detail::Trainer(o, cb, std::move(col)).run();
}

}  // namespace lightseg
