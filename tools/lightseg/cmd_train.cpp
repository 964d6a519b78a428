// lightseg train: parse arguments, call lightseg::train, show progress.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "args.h"
#include "lightseg/runtime.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "progress.h"

namespace lightseg::cli {

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct TrainArgs {
  int epochs = 500, batch = 8, val_every = 1, workers = 2;
  std::string crop = "360x480", optimizer = "adam", loss = "wce", init_weights;
  double lr = 1e-3, weight_decay = 2e-4, time_limit = 0;
  uint64_t seed = 1;
  bool resume = false;
  int64_t max_iters = 0;
};
}  // namespace

void add_train(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("train", "Train the network (CamVid, Cityscapes or a list dataset)");
  add_options(sub, a, {Opt::Data, Opt::Dataset, Opt::Config, Opt::Device, Opt::Threads});
  static TrainArgs t;
  sub->add_option("--out", a.out, "Run folder (checkpoints, log.jsonl, curve.svg)")->required();
  auto* o_epochs = sub->add_option("--epochs", t.epochs, "Epochs in total")->capture_default_str();
  auto* o_batch = sub->add_option("--batch", t.batch, "Batch size (per process)")->capture_default_str();
  auto* o_crop = sub->add_option("--crop", t.crop, "Training crop HxW")->capture_default_str();
  auto* o_lr = sub->add_option("--lr", t.lr, "Base learning rate")->capture_default_str();
  auto* o_wd = sub->add_option("--weight-decay", t.weight_decay, "Weight decay")->capture_default_str();
  auto* o_opt = sub->add_option("--optimizer", t.optimizer, "adam, adamw or sgd")->capture_default_str();
  auto* o_loss = sub->add_option("--loss", t.loss, "wce (class-weighted CE), ce or ohem")->capture_default_str();
  auto* o_tl = sub->add_option("--time-limit", t.time_limit, "Stop cleanly (checkpoint written) after this many minutes");
  sub->add_flag("--resume", t.resume, "Continue the run in --out where it stopped");
  auto* o_ve = sub->add_option("--val-every", t.val_every, "Evaluate on the val split every N epochs (0: never)")->capture_default_str();
  auto* o_seed = sub->add_option("--seed", t.seed, "Random seed")->capture_default_str();
  auto* o_workers = sub->add_option("--workers", t.workers, "Data-loading threads")->capture_default_str();
  auto* o_mi = sub->add_option("--max-iters", t.max_iters, "Cap iterations per epoch (smoke tests)");
  auto* o_init = sub->add_option("--init-weights", t.init_weights, "Start from these weights (fine-tuning)");
  sub->callback([&a, sub, o_epochs, o_batch, o_crop, o_lr, o_wd, o_opt, o_loss, o_tl, o_ve, o_seed, o_workers, o_mi, o_init]() {
    const int threads = init_runtime(a.threads);
    TrainOptions o;
    const std::string last = (std::filesystem::path(a.out) / "last.lsw").string();
    if (t.resume && std::filesystem::exists(last)) {
      auto w = read_weights(last);
      if (w.extra.contains("train") && w.extra["train"].contains("options")) o.apply_json(w.extra["train"]["options"]);
    }
    if (!a.config.empty()) {
      auto j = read_json_file(a.config);
      o.network = NetworkConfig::from_json(j);
      if (j.contains("train")) o.apply_json(j.at("train"));
    }
    o.data = a.data;
    o.out_dir = a.out;
    if (sub->count("--dataset") || o.dataset.empty()) o.dataset = a.dataset;
    if (sub->count("--device")) o.device = a.device;
    if (o_epochs->count()) o.epochs = t.epochs;
    if (o_batch->count()) o.batch = t.batch;
    if (o_crop->count()) std::tie(o.crop_h, o.crop_w) = parse_size(t.crop);
    if (o_lr->count()) o.lr = t.lr;
    if (o_wd->count()) o.weight_decay = t.weight_decay;
    if (o_opt->count()) o.optimizer = t.optimizer;
    if (o_loss->count()) o.loss = t.loss;
    o.time_limit_min = o_tl->count() ? t.time_limit : 0;
    if (o_ve->count()) o.val_every = t.val_every;
    if (o_seed->count()) o.seed = t.seed;
    if (o_workers->count()) o.workers = t.workers;
    if (o_mi->count()) o.max_iters = t.max_iters;
    if (o_init->count()) o.init_weights = t.init_weights;
    o.resume = t.resume;

    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    ProgressLine line;
    TrainCallbacks cb;
    cb.on_message = [&](const std::string& m) { line.print("train: " + m); };
    cb.stop_requested = [] { return g_stop != 0; };
    cb.on_iteration = [&](const TrainProgress& p) {
      char b[256];
      std::snprintf(b, sizeof b, "epoch %d/%d  iter %ld/%ld  loss %.4f  lr %.2e  %.2f img/s  data wait %.0f%%  ETA %s",
                    p.epoch, p.epochs, static_cast<long>(p.iter), static_cast<long>(p.iters), p.loss, p.lr,
                    p.images_per_s, 100 * p.data_wait_share, fmt_duration(p.eta_s).c_str());
      line.update(b);
    };
    cb.on_epoch = [&](const EpochRecord& r) {
      char b[256];
      if (r.miou >= 0)
        std::snprintf(b, sizeof b, "epoch %d done: loss %.4f  val mIoU %.4f  pixel acc %.4f  %.0fs  %.2f img/s", r.epoch,
                      r.loss, r.miou, r.pixel_acc, r.seconds, r.images_per_s);
      else
        std::snprintf(b, sizeof b, "epoch %d done: loss %.4f  %.0fs  %.2f img/s", r.epoch, r.loss, r.seconds, r.images_per_s);
      line.print(b);
    };
    line.print("train: " + o.dataset + " from " + o.data + " → " + o.out_dir + "  (" + std::to_string(threads) +
               " threads, batch " + std::to_string(o.batch) + ", crop " + std::to_string(o.crop_h) + "x" +
               std::to_string(o.crop_w) + ", " + std::to_string(o.epochs) + " epochs)");
    auto r = train(o, cb);
    line.done();
    if (r.finished)
      std::printf("finished %d epochs; best val mIoU %.4f; weights: %s/best.lsw\n", r.epochs_done, r.best_miou, a.out.c_str());
    else
      std::printf("stopped after %d epochs (resume with --resume); best val mIoU %.4f\n", r.epochs_done, r.best_miou);
  });
}

}  // namespace lightseg::cli
