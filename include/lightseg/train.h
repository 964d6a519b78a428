// lightseg: training.
//
// Basic usage:
//   lightseg::TrainOptions o;  o.data = "data/camvid"; o.out_dir = "runs/camvid";
//   lightseg::TrainCallbacks cb;  cb.on_iteration = [](const TrainProgress& p) { ... };
//   lightseg::train(o, cb);
//
// A run folder holds: last.lsw (every epoch, and on --time-limit mid-epoch), best.lsw (by val
// mIoU), log.jsonl (one line per epoch), curve.svg (loss and val mIoU by epoch),
// class_weights.json (cache), .lock (held by the one trainer of the folder while it runs;
// a second train() on the folder throws). Checkpoints are weights files with the optimizer state and the
// training state inside; they load anywhere a weights file does.
//
// Determinism: the shuffle of epoch e is a function of (seed, e) and the augmentation of
// sample i in epoch e a function of (seed, e, i), so a resumed run replays exactly what an
// uninterrupted run would have done, whatever the thread timing.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

// The largest crop a run takes from its images when none is set (CamVid's image size).
constexpr int64_t kDefaultCropH = 360, kDefaultCropW = 480;

struct TrainOptions {
  // data
  std::string data, dataset = "camvid", train_split = "train", val_split = "val";
  // Sequence-disjoint validation (dataset.h, split_by_groups): when val_groups is set, the
  // samples of train_split and val_split are pooled, those of the listed groups (drives, videos,
  // scenes; by the rule group_by, "" = the dataset's default) are validated on and the others
  // trained on. CamVid's seqval protocol: val_groups ["0006R0"] (configs/camvid-seqval.json).
  // JSON: "val_groups": ["0006R0"] or "0006R0,0001TP".
  std::vector<std::string> val_groups;
  std::string group_by;
  std::string out_dir;
  // schedule
  int epochs = 500;
  int batch = 8;
  // The training crop; 0x0 (the default): from the images, each side the smallest image's (of
  // up to 32 sampled), at most kDefaultCropH x kDefaultCropW, rounded down to a multiple of 8.
  // The run stores the crop it chose, so a resumed run keeps it.
  int64_t crop_h = 0, crop_w = 0;
  std::string optimizer = "adam";  // adam | adamw | sgd
  double lr = 1e-3, weight_decay = 2e-4, momentum = 0.9;
  bool nesterov = false;
  bool bn_weight_decay = false;    // weight decay on BN/PReLU parameters and biases
  double warmup_epochs = 1.0, warmup_start = 0.1, poly_power = 0.9;
  // augmentation
  double scale_min = 0.75, scale_max = 2.0, jitter = 0.0;
  // blur: the probability of a Gaussian blur (sigma uniform in [0.5, 1.5] pixels); noise: the
  // largest std of additive Gaussian noise (each sample's uniform in [0, noise], 0..255 units)
  double blur = 0.0, noise = 0.0;
  bool flip = true;
  // loss
  std::string loss = "wce";        // wce (class-weighted CE) | ce | ohem
  double ohem_thresh = 0.7, ohem_min_kept = 1.0 / 16;
  std::vector<float> class_weights;  // empty: computed from the training labels (wce / ohem)
  // How they are computed: "enet" 1/ln(1.10 + p) or "median" median(p)/p (median-frequency
  // balancing, stronger for thin and rare classes); p = a class's share of the training pixels.
  std::string class_weighting = "enet";
  // Deep supervision: > 0 adds aux_weight × (the same loss) of small heads on the two semantic
  // branches' outputs (C1.3, C1.5); training only, not part of the saved network.
  double aux_weight = 0;
  // > 0: keep an exponential moving average of the weights (parameters and BatchNorm
  // statistics), decay min(ema_decay, (1+n)/(10+n)) at update n; validation, best.lsw and
  // last.lsw's inference tensors use it (the raw weights ride along in the checkpoint).
  double ema_decay = 0;
  // Knowledge distillation: a trained network (any configuration of the same classes; e.g. a
  // wider one) whose softened predictions the student also learns: the loss gains
  // distill_weight × distillation_loss (T² · KL at temperature distill_temperature, over the
  // labelled pixels). The teacher runs in eval mode on each augmented batch; not saved.
  std::string distill_from;
  double distill_weight = 1.0, distill_temperature = 1.0;
  // run control
  double time_limit_min = 0;       // 0 = none; stops cleanly after writing a checkpoint
  bool resume = false;
  torch::Device device = torch::kCPU;  // JSON: "cpu", "cuda", "cuda:N"
  int val_every = 1;
  uint64_t seed = 1;
  int workers = 2, prefetch = 4;
  bool channels_last = true;
  bool amp = true;                 // bf16 autocast on CUDA
  bool amp_cpu = false;            // bf16 autocast on the CPU (worth it with AVX512-BF16 or AMX)
  int64_t max_iters = 0;           // > 0: cap iterations per epoch (smoke tests)
  // Where the decoded training set is kept: "off" (decoded per batch on loader threads: the
  // CPU's recipe path), "host" (decoded once into memory, batches augmented there), "device"
  // (decoded once onto the training device, batches augmented there in a few tensor
  // operations), "auto" (device on CUDA, off on the CPU). The random draws are the same in
  // all: the augmentation is a function of (seed, epoch, sample) whichever runs it.
  std::string data_cache = "auto";
  // Adam/AdamW in a few multi-tensor kernels per step (same maths and state): "on", "off",
  // "auto" (on on CUDA). SGD always runs torch's.
  std::string fused_optimizer = "auto";
  // Read the loss and the non-finite-step check every N steps instead of every step (no host
  // synchronisation in between; needs the fused optimizer, no EMA, one process). 0: auto (20
  // on CUDA, 1 on the CPU).
  int sync_every = 0;
  // The deferred step (above) captured once as a CUDA graph and replayed (one launch per step):
  // "on" or "off". Needs the deferred step, a loss other than OHEM; on the CPU the step runs as
  // it would be captured (fixed input buffers, the learning rate on the device), uncaptured.
  std::string cuda_graph = "off";
  // The checkpoint written when this invocation stops (time limit or a stop request) in compact
  // form, for a run whose state goes into version control between sessions: Adam's second
  // moments as 8-bit log codes, its first moments left out (they restart at zero on resume and
  // rebuild within ~10 steps), an EMA run's raw weights as an int8 difference from the average
  // (src/train/compact_state.h), so the aux recipe's state is ~3.1 MB instead of ~7.6 MB. Per
  // invocation (--compact-state), not stored with the run.
  bool compact_state = false;
  std::string init_weights;        // start from these weights (fine-tuning)
  NetworkConfig network;
  // distributed: this process's rank and the number of ranks (the collective is passed to train())
  int rank = 0, world = 1;
  bool sync_bn = false;            // SyncBN: BatchNorm statistics over all ranks
  bool overlap_allreduce = true;   // start bucket all-reduces from autograd hooks during backward
  double bucket_mb = 1.0;
  bool verify_sync = false;        // after every step, check that all ranks hold identical weights (tests)

  // Where a choice came from, for the schedule line a run prints at start (not stored): e.g.
  // crop_origin "--crop", "config"; precision_origin "auto: this CPU computes bf16 natively".
  std::string crop_origin, precision_origin;

  // The JSON text of every option (the "train" object of a config; indent < 0: one line).
  std::string to_json_string(int indent = -1) const;
  // Applies the keys of a "train" object (JSON text) onto *this; unknown keys are an error.
  void apply_json_string(const std::string& text, const std::string& what = "train options");
  // A config file: {"network": {...}, "train": {...}} (either optional), or a bare network object.
  void apply_config_file(const std::string& path);
  // One override "KEY=VALUE" (mmsegmentation's --cfg-options): KEY is a train option
  // ("lr", or "train.lr") or a network key ("network.c0", "network.stage2.dilations"); VALUE
  // is JSON ("1e-3", "[4, 8]", "true") or else taken as a string ("ohem"). Throws
  // std::invalid_argument naming the key.
  void set(const std::string& key_equals_value);
  void validate() const;
};

struct TrainProgress {
  int epoch = 0, epochs = 0;        // 1-based epoch
  int64_t iter = 0, iters = 0;      // 1-based iteration within the epoch
  double loss = 0, lr = 0, images_per_s = 0, eta_s = 0, data_wait_share = 0;
  double allreduce_share = 0;       // share of the epoch's time spent in gradient all-reduce
};

struct EpochRecord {
  int epoch = 0;                    // 1-based
  double loss = 0, lr = 0, seconds = 0, images_per_s = 0, data_wait_share = 0, allreduce_share = 0;
  double miou = -1, pixel_acc = -1; // -1 when not evaluated this epoch
  int64_t skipped_steps = 0;        // steps skipped for a non-finite loss or gradients
  // One line of log.jsonl, and back.
  std::string to_json_string() const;
  static EpochRecord from_json_string(const std::string& text);
};

struct TrainCallbacks {
  std::function<void(const TrainProgress&)> on_iteration;
  std::function<void(const EpochRecord&)> on_epoch;
  std::function<void(const std::string&)> on_message;
  // after backward, before the optimizer step (gradient all-reduce goes here)
  std::function<void(Network&)> after_backward;
  // return true to stop cleanly (checkpoint written), e.g. after SIGINT/SIGTERM
  std::function<bool()> stop_requested;
  // test hook: return true to stop at once without writing anything (simulates a kill)
  std::function<bool(int epoch, int64_t iter)> kill_now;
};

struct TrainResult {
  int epochs_done = 0;
  bool finished = false, stopped_by_time = false, killed = false;
  double best_miou = -1;
  std::vector<EpochRecord> history;
};

// What a checkpoint (RUN/last.lsw) holds besides the weights: where the run stands and how
// it was configured. best.lsw holds the same, taken at its epoch (with val_miou).
struct TrainState {
  int epoch = 0;                   // epochs completed
  int64_t batch = 0;               // batches of the next epoch already done (a mid-epoch stop)
  int64_t global_step = 0;         // optimizer steps so far (the LR schedule's position)
  int world = 1;                   // ranks of the run that wrote it
  double best_miou = -1;           // best val mIoU so far (-1: none)
  double val_miou = -1;            // best.lsw: the val mIoU it was kept for
  // The unfinished epoch's sums so far (its log line then covers the whole epoch).
  double part_loss = 0, part_seconds = 0, part_wait = 0;
  int64_t part_count = 0, part_images = 0, part_skipped = 0;
  int64_t ema_steps = 0;           // EMA updates so far (its warm-up)
  TrainOptions options;
  std::vector<EpochRecord> history;
};
struct WeightsFile;
// The training state of a weights file (a checkpoint's), or nullopt for plain weights.
// Throws std::invalid_argument naming the key when the state is malformed.
std::optional<TrainState> train_state(const WeightsFile& w);
// Stores s as w's training state (other keys of w.extra are kept).
void set_train_state(WeightsFile& w, const TrainState& s);

class Collective;
// With o.world > 1, `collective` is the process group of all ranks (see distributed.h).
TrainResult train(const TrainOptions& o, const TrainCallbacks& cb = {}, std::shared_ptr<Collective> collective = nullptr);

}  // namespace lightseg
