// The trainer's class (internal): train() in trainer.cpp runs its epoch loop; its set-up (data,
// model, step form) is trainer_setup.cpp, its run folder and checkpoints trainer_checkpoint.cpp.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "lightseg/dataset.h"
#include "lightseg/distributed.h"
#include "lightseg/eval.h"
#include "lightseg/train.h"
#include "lightseg/training_data.h"
#include "lightseg/weights.h"
#include "data/data_cache.h"
#include "distributed/gradient_sync.h"
#include "train/aux_heads.h"
#include "train/ema.h"
#include "train/foreach_adam.h"
#include "train/graph_step.h"
#include "train/run_folder.h"
#include "train/train_defaults.h"

namespace lightseg::detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Non-finite steps (NaN/inf loss or gradients: a reduced-precision overflow, a bad batch) are
// skipped, as a loss scaler does; only this many in a row count as divergence.
constexpr int kMaxSkipsInRow = 5;
// The run says its time per iteration and its ETA once, after this many iterations.
constexpr int64_t kEtaAfterSteps = 5;

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
  void choose_crop_from_data();
  void say_schedule(int64_t iters_per_epoch) const;
  void cache_data();
  void choose_step_form();
  void lock_run_folder();
  void read_checkpoint();
  void build_model();
  void init_from_weights();
  // compact: the optimizer's state and an EMA run's raw weights in compact form (compact_state.h;
  // TrainOptions::compact_state).
  void save_checkpoint(const std::string& path, bool compact = false);
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
  CropChoice crop_;  // the run's crop and where it came from
  TrainingData trained_on_;  // stored with every checkpoint (training_data.h)
  ModelMeta meta_;
  fs::path out_;
  std::string last_path_, best_path_;
  std::unique_ptr<RunFolderLock> lock_;
  TrainState state_;             // what the next checkpoint records
  WeightsFile resumed_;          // the checkpoint resumed from (when have_resume_)
  bool have_resume_ = false;
  Network net_{nullptr}, ema_net_{nullptr}, scored_{nullptr};  // scored: what is validated and saved
  AuxHeads aux_{nullptr};
  Network teacher_{nullptr};  // distill_from's network (eval mode, on the device)
  std::unique_ptr<WeightsEma> ema_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<ForeachAdam> fused_;    // the optimizer's steps, when fused (opt_ holds the state)
  std::unique_ptr<DataCache> cache_;      // the decoded training set (data_cache host/device)
  bool cache_on_device_ = false;
  int sync_every_ = 1;                    // steps between reads of the loss (deferred steps)
  bool deferred_ = false;
  bool graph_step_ = false;               // the deferred step through GraphedStep (cuda_graph)
  std::unique_ptr<GradientSync> grad_sync_;
  bool sync_bn_on_ = false;
  Clock::time_point t_start_;
  TrainResult result_;
};

}  // namespace lightseg::detail
