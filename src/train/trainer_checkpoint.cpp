// The trainer's run folder and checkpoints (see trainer.h): the folder's lock and stale
// temporaries, resuming from last.lsw, writing it, the log and curve, and a clean stop.
#include <cstdio>

#include "lightseg/file_io.h"
#include "train/archive_bytes.h"
#include "train/compact_state.h"
#include "train/curve.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace lightseg::detail {

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
void Trainer::save_checkpoint(const std::string& path, bool compact) {
  WeightsFile w = make_weights(scored_, meta_);
  if (ema_net_) {
    if (compact) w.blobs["raw_weights_q8"] = compact_weights_delta_bytes(*net_, *ema_net_);
    else w.blobs["raw_weights"] = to_archive_bytes(*net_);
  }
  if (aux_) w.blobs["aux_heads"] = to_archive_bytes(*aux_);
  if (fused_) fused_->export_state();
  w.blobs["optimizer"] = compact ? compact_optimizer_bytes(*opt_) : to_archive_bytes(*opt_);
  state_.options = o_;
  state_.world = o_.world;
  if (ema_) state_.ema_steps = ema_->steps();
  set_train_state(w, state_);
  set_training_data(w, trained_on_);
  write_weights(path, w);
}

void Trainer::write_log() {
  std::string s;
  for (const auto& r : state_.history) s += r.to_json_string() + "\n";
  write_file_atomic((out_ / "log.jsonl").string(), s);
  write_curve_svg((out_ / "curve.svg").string(), state_.history, "lightseg on " + o_.dataset + " (" + meta_.dataset + ")");
}

TrainResult Trainer::stopped(bool requested, bool mid_epoch) {
  const std::string why = requested ? "stop requested" : "time limit reached";
  if (lead_ && o_.compact_state) save_checkpoint(last_path_, /*compact=*/true);
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

}  // namespace lightseg::detail
