// lightseg train: parse arguments, call lightseg::train, show progress.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "lightseg/distributed.h"
#include "lightseg/runtime.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "progress.h"

namespace lightseg::cli {

// main() stores argv here: --nproc re-executes the same command line for each worker.
int g_argc = 0;
char** g_argv = nullptr;

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// Every flag of `lightseg train` that sets a train option is a row here: the flag, the
// TrainOptions key it sets (through TrainOptions::set, as --set KEY=VALUE would), its help.
// The defaults shown come from TrainOptions itself, so they cannot drift from the library's.
enum class Kind { Value, On, Off };  // Value: --flag VALUE; On/Off: --flag sets true/false
struct TrainFlag {
  const char* flag;
  const char* key;
  const char* help;
  Kind kind = Kind::Value;
};
const TrainFlag kTrainFlags[] = {
    {"--epochs", "epochs", "Epochs in total"},
    {"--batch", "batch", "Batch size (per process)"},
    {"--crop", "crop", "Training crop HxW"},
    {"--lr", "lr", "Base learning rate"},
    {"--weight-decay", "weight_decay", "Weight decay"},
    {"--optimizer", "optimizer", "adam, adamw or sgd"},
    {"--loss", "loss", "wce (class-weighted CE), ce or ohem"},
    {"--aux-weight", "aux_weight",
     "Deep supervision: weight of the auxiliary heads' losses on the two semantic branches (0: off; e.g. 0.4)"},
    {"--ema-decay", "ema_decay",
     "Keep an EMA of the weights with this decay, scored and saved instead of the raw ones (0: off; e.g. 0.999)"},
    {"--distill-from", "distill_from",
     "Knowledge distillation from these trained weights (same classes; e.g. a wider network): the loss gains "
     "distill_weight x T^2 KL at distill_temperature (--set; defaults 1, 1)"},
    {"--val-every", "val_every", "Evaluate on the val split every N epochs (0: never)"},
    {"--train-split", "train_split", "Split(s) to train on: one name, several joined by commas, or trainval (= train,val)"},
    {"--val-split", "val_split", "Split scored every --val-every epochs"},
    {"--val-groups", "val_groups",
     "Sequence-disjoint validation: pool --train-split and --val-split, validate on the images of these groups "
     "(comma list, e.g. 0006R0: a CamVid drive), train on the others"},
    {"--group-by", "group_by",
     "A sample's group for --val-groups: prefix (file name up to the first _), dir (parent folder), regex:PATTERN "
     "(first capture group in the file name) or file:PATH (\"image group\" lines); default: dir for cityscapes, else prefix"},
    {"--class-weighting", "class_weighting", "Class weights of wce/ohem: enet (1/ln(1.10+p)) or median (median-frequency balancing)"},
    {"--seed", "seed", "Random seed"},
    {"--workers", "workers", "Data-loading threads"},
    {"--max-iters", "max_iters", "Cap iterations per epoch (smoke tests; 0: none)"},
    {"--init-weights", "init_weights", "Start from these weights (fine-tuning)"},
    {"--data-cache", "data_cache",
     "Decoded training set: off (decoded per batch by --workers), host (in memory), device (on the training "
     "device, batches augmented there), auto (device on CUDA, off on the CPU)"},
    {"--fused-optimizer", "fused_optimizer", "Adam/AdamW in a few multi-tensor kernels per step: on, off, auto (on on CUDA)"},
    {"--sync-every", "sync_every",
     "Read the loss and the non-finite-step check every N steps (no host sync between; 0: 20 on CUDA, 1 on the CPU)"},
    {"--cuda-graph", "cuda_graph",
     "The training step captured once as a CUDA graph and replayed: on, off (needs the deferred step: fused optimizer, "
     "--sync-every > 1, no EMA, one process; not OHEM)"},
    {"--sync-bn", "sync_bn", "Synchronise BatchNorm statistics across ranks (SyncBN)", Kind::On},
    {"--verify-sync", "verify_sync", "Check after every step that all ranks hold identical weights", Kind::On},
    {"--no-overlap", "overlap_allreduce", "All-reduce gradients after backward instead of during it", Kind::Off},
};

// What the flags hold until the callback applies them, in the order of kTrainFlags.
struct TrainArgs {
  std::vector<std::string> values = std::vector<std::string>(std::size(kTrainFlags));
  bool switches[std::size(kTrainFlags)] = {};
  std::vector<CLI::Option*> options = std::vector<CLI::Option*>(std::size(kTrainFlags));
  std::vector<std::string> overrides;  // --set KEY=VALUE
  double time_limit = 0;               // not a stored option: each invocation sets its own
  bool compact_state = false;          // nor this (TrainOptions::compact_state)
  bool resume = false;
  // distributed: where this process is (the launcher's business, not the run's)
  int nproc = 0, rank = -1, world = -1, local_rank = -1, master_port = -1;
  std::string master_addr;
  double dist_timeout = 300;
};

// KEY=VALUE for TrainOptions::set: VALUE as JSON of the key's type (a string option gets a
// JSON string, so "--train-split 1" is the split named "1"; "--crop 360x480" is [360, 480]).
std::string assignment(const TrainFlag& f, const std::string& value, const nlohmann::json& defaults) {
  if (std::string(f.key) == "crop") {
    auto [h, w] = parse_size(value);
    return "crop=[" + std::to_string(h) + "," + std::to_string(w) + "]";
  }
  const nlohmann::json& d = defaults.at(f.key);
  const bool text = d.is_string() || std::string(f.key) == "val_groups";  // "0006R0,0001TP" is a string
  return std::string(f.key) + "=" + (text ? nlohmann::json(value).dump() : value);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("cannot find a free port for --nproc");
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// --nproc N: run N local workers (this same command without --nproc, with torchrun's
// environment), wait for all; if one fails, stop the others and fail.
int spawn_local_workers(int n, int threads_total, int argc, char** argv) {
  const int port = free_port();
  const int per = std::max(1, threads_total / n);
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--nproc") { ++i; continue; }
    if (a.rfind("--nproc=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("OMP_NUM_THREADS", std::to_string(per).c_str(), 1);
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(const_cast<char*>(a.c_str()));
      cargs.push_back(nullptr);
      ::execv("/proc/self/exe", cargs.data());
      std::perror("execv");
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::signal(SIGINT, SIG_IGN);  // the workers get the terminal's signals themselves
  int failed = 0, remaining = n;
  while (remaining > 0) {
    int status = 0;
    pid_t p = ::waitpid(-1, &status, 0);
    if (p < 0) break;
    --remaining;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !failed) {
      failed = 1;
      std::fprintf(stderr, "error: a training worker (pid %d) failed; stopping the others\n", static_cast<int>(p));
      for (pid_t q : pids)
        if (q != p) ::kill(q, SIGTERM);
    }
  }
  return failed;
}
}  // namespace

void add_train(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("train", "Train the network (CamVid, Cityscapes or a list dataset)");
  add_options(sub, a, {Opt::Data, Opt::Dataset, Opt::Config, Opt::Device, Opt::Threads, Opt::Out, Opt::Precision});
  sub->get_option("--out")->required()->description("Run folder (checkpoints, log.jsonl, curve.svg)");
  sub->get_option("--precision")
      ->description("auto, fp32 or bf16 (bf16 autocast). auto: bf16 on CUDA and on CPUs that compute bf16 natively "
                    "(AVX512-BF16/AMX), else fp32. Unset: the run's stored choice (--resume), the config's "
                    "(amp/amp_cpu), else auto");
  static TrainArgs t;
  const nlohmann::json defaults = nlohmann::json::parse(TrainOptions{}.to_json_string());
  for (size_t i = 0; i < std::size(kTrainFlags); ++i) {
    const TrainFlag& f = kTrainFlags[i];
    if (f.kind == Kind::Value) {
      const nlohmann::json& d = defaults.at(f.key);
      std::string shown = d.is_string() ? d.get<std::string>() : d.is_array() && d.empty() ? "" : d.dump();
      if (std::string(f.key) == "crop")
        shown = "from the images, at most " + std::to_string(kDefaultCropH) + "x" + std::to_string(kDefaultCropW);
      const char* type = d.is_number_integer() ? "INT" : d.is_number() ? "FLOAT" : std::string(f.key) == "crop" ? "HxW" : "TEXT";
      t.options[i] = sub->add_option(f.flag, t.values[i], f.help)->default_str(shown)->type_name(type);
    }
  }
  sub->add_option("--time-limit", t.time_limit, "Stop cleanly (checkpoint written) after this many minutes");
  sub->add_flag("--compact-state", t.compact_state,
                "When this invocation stops (--time-limit, Ctrl-C), write last.lsw compactly: Adam's second moments as "
                "8-bit log codes, its first moments left out (they restart at zero on resume), an EMA run's raw weights "
                "as an int8 difference from the average: about 40 % of the full size, for a run state kept in version "
                "control");
  sub->add_flag("--resume", t.resume, "Continue the run in --out where it stopped (its stored options are the defaults)");
  sub->add_option("--set", t.overrides,
                  "Override any option of the config: KEY=VALUE, e.g. --set lr=5e-4 --set network.c0=16 "
                  "--set network.stage2.dilations=[2,4,8,8,16,16] (VALUE is JSON or a word); after --config, "
                  "before the other flags");
  auto* dist = sub->add_option_group("distributed", "Data-parallel training (c10d: Gloo on CPU, NCCL on CUDA). "
                                                      "Defaults come from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.");
  dist->add_option("--nproc", t.nproc, "Spawn N local worker processes (threads are split between them)");
  dist->add_option("--rank", t.rank, "This process's rank (RANK)");
  dist->add_option("--world-size", t.world, "Number of processes in all (WORLD_SIZE)");
  dist->add_option("--local-rank", t.local_rank, "Rank on this machine (LOCAL_RANK; selects the GPU)");
  dist->add_option("--master-addr", t.master_addr, "Rendezvous host (MASTER_ADDR)");
  dist->add_option("--master-port", t.master_port, "Rendezvous port (MASTER_PORT)");
  for (size_t i = 0; i < std::size(kTrainFlags); ++i)
    if (kTrainFlags[i].kind != Kind::Value) t.options[i] = dist->add_flag(kTrainFlags[i].flag, t.switches[i], kTrainFlags[i].help);
  dist->add_option("--dist-timeout", t.dist_timeout, "Seconds before a rank gives up on a dead or stuck peer")->capture_default_str();
  sub->callback([&a, sub]() {
    if (a.precision != "fp32" && a.precision != "bf16" && a.precision != "auto")
      throw std::invalid_argument("train --precision must be auto, fp32 or bf16 (fp16 would need loss scaling), got '" +
                                  a.precision + "'");
    if (t.nproc > 1) {
      const int total = a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency());
      if (spawn_local_workers(t.nproc, total, g_argc, g_argv) != 0) throw std::runtime_error("distributed training failed");
      return;
    }
    DistConfig dc = DistConfig::from_env();
    if (t.rank >= 0) dc.rank = t.rank;
    if (t.world > 0) dc.world = t.world;
    if (t.local_rank >= 0) dc.local_rank = t.local_rank;
    if (!t.master_addr.empty()) dc.master_addr = t.master_addr;
    if (t.master_port > 0) dc.master_port = t.master_port;
    dc.timeout = std::chrono::milliseconds(static_cast<int64_t>(t.dist_timeout * 1000));
    const int threads = init_runtime(a.threads);
    // Precedence: the checkpoint's options (--resume), then --config, then --set, then flags.
    TrainOptions o;
    const std::string last = (std::filesystem::path(a.out) / "last.lsw").string();
    bool resumed = false;
    if (t.resume && std::filesystem::exists(last))
      if (auto state = train_state(read_weights(last))) o = state->options, resumed = true;
    // Where the crop and the precision come from, for the schedule line (later sources win).
    std::string crop_from = resumed ? "the run's stored crop" : "", precision_from = resumed ? "the run's stored choice" : "";
    if (!a.config.empty()) {
      o.apply_config_file(a.config);
      std::ifstream cf(a.config);
      const auto cfg = nlohmann::json::parse(cf, nullptr, false, true);  // applied above: valid
      const auto* tr = cfg.is_object() && cfg.contains("train") ? &cfg.at("train") : nullptr;
      if (tr && tr->contains("crop")) crop_from = "config " + a.config;
      if (tr && (tr->contains("amp") || tr->contains("amp_cpu"))) precision_from = "config " + a.config;
    }
    for (const auto& kv : t.overrides) {
      o.set(kv);
      const std::string key = kv.substr(kv.rfind("train.", 0) == 0 ? 6 : 0, kv.find('=') - (kv.rfind("train.", 0) == 0 ? 6 : 0));
      if (key == "crop") crop_from = "--set " + kv;
      if (key == "amp" || key == "amp_cpu") precision_from = "--set " + kv;
    }
    const nlohmann::json defaults = nlohmann::json::parse(TrainOptions{}.to_json_string());
    for (size_t i = 0; i < std::size(kTrainFlags); ++i) {
      const TrainFlag& f = kTrainFlags[i];
      if (!t.options[i]->count()) continue;
      if (f.kind == Kind::Value) o.set(assignment(f, t.values[i], defaults));
      else o.set(std::string(f.key) + (f.kind == Kind::On ? "=true" : "=false"));
    }
    o.data = a.data;
    o.out_dir = a.out;
    if (sub->count("--dataset") || o.dataset.empty()) o.dataset = a.dataset;
    if (sub->count("--device")) o.device = torch::Device(a.device);
    for (size_t i = 0; i < std::size(kTrainFlags); ++i)
      if (std::string(kTrainFlags[i].key) == "crop" && t.options[i]->count()) crop_from = "--crop";
    // A new run without a choice takes auto: bf16 where the device computes it natively.
    const bool precision_auto = sub->count("--precision") ? a.precision == "auto" : precision_from.empty();
    if (sub->count("--precision") || precision_auto) {
      o.amp = a.precision != "fp32" || precision_auto;
      o.amp_cpu = (a.precision == "bf16" && !precision_auto) || (precision_auto && cpu_has_native_bf16());
      precision_from = sub->count("--precision") ? "--precision " + a.precision : "auto, the default";
      if (precision_auto)
        precision_from += o.device.is_cuda() ? ": CUDA computes bf16"
                          : cpu_has_native_bf16() ? ": this CPU computes bf16 natively (AVX512-BF16)"
                                                  : ": no native bf16 on this CPU (AVX512-BF16/AMX), emulated bf16 is slower";
    }
    o.crop_origin = crop_from;
    o.precision_origin = precision_from;
    if (!o.device.is_cuda() && o.amp_cpu && !cpu_has_native_bf16())
      std::fprintf(stderr, "warning: bf16 training on a CPU without native bf16 (AVX512-BF16/AMX): it is emulated "
                           "and about 10x slower than fp32 here; --precision auto or fp32 picks fp32\n");
    o.time_limit_min = t.time_limit;
    o.compact_state = t.compact_state;
    o.resume = t.resume;
    o.rank = dc.rank;
    o.world = dc.world;
    if (o.val_every > 0 && o.val_groups.empty()) {
      std::string ts = "," + (o.train_split == "trainval" ? std::string("train,val") : o.train_split) + ",";
      if (ts.find("," + o.val_split + ",") != std::string::npos)
        std::fprintf(stderr, "note: the val split '%s' is also trained on: its mIoU is not a held-out score "
                             "(--val-every 0 to skip it)\n", o.val_split.c_str());
    }
    std::shared_ptr<Collective> col;
    if (dc.enabled()) {
      if (o.device.is_cuda() && !o.device.has_index()) o.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dc.local_rank));
      col = Collective::create(dc, o.device);
    }

    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    ProgressLine line;
    TrainCallbacks cb;
    const std::string who = dc.enabled() ? "train[" + std::to_string(dc.rank) + "/" + std::to_string(dc.world) + "]: " : "train: ";
    cb.on_message = [&](const std::string& m) { line.print(who + m); };
    cb.stop_requested = [] { return g_stop != 0; };
    if (col)
      cb.on_message("distributed: rank " + std::to_string(dc.rank) + " of " + std::to_string(dc.world) + ", " +
                    col->backend() + ", SyncBN " + (o.sync_bn ? "on" : "off") + ", all-reduce " +
                    (o.overlap_allreduce ? "overlapped with backward" : "after backward"));
    cb.on_iteration = [&](const TrainProgress& p) {
      char b[256];
      std::snprintf(b, sizeof b, "epoch %d/%d  iter %ld/%ld  loss %.4f  lr %.2e  %.2f img/s  data wait %.0f%%%s  ETA %s",
                    p.epoch, p.epochs, static_cast<long>(p.iter), static_cast<long>(p.iters), p.loss, p.lr,
                    p.images_per_s, 100 * p.data_wait_share,
                    p.allreduce_share > 0 ? ("  all-reduce " + std::to_string(static_cast<int>(100 * p.allreduce_share)) + "%").c_str() : "",
                    fmt_duration(p.eta_s).c_str());
      line.update(b);
    };
    cb.on_epoch = [&](const EpochRecord& r) {
      char b[256];
      if (r.miou >= 0)
        std::snprintf(b, sizeof b, "epoch %d done: loss %.4f  val mIoU %.4f  pixel acc %.4f  %.0fs  %.2f img/s", r.epoch,
                      r.loss, r.miou, r.pixel_acc, r.seconds, r.images_per_s);
      else
        std::snprintf(b, sizeof b, "epoch %d done: loss %.4f  %.0fs  %.2f img/s", r.epoch, r.loss, r.seconds, r.images_per_s);
      std::string msg = b;
      if (r.skipped_steps > 0)
        msg += "  (" + std::to_string(r.skipped_steps) + " non-finite step" + (r.skipped_steps > 1 ? "s" : "") +
               " skipped)";
      line.print(msg);
    };
    if (o.rank != 0) cb.on_iteration = nullptr;
    line.print(who + o.dataset + " from " + o.data + " → " + o.out_dir + "  (" + std::to_string(threads) +
               " threads; the schedule follows)");
    auto r = train(o, cb, col);
    line.done();
    if (o.rank != 0) return;
    const bool scored = r.best_miou >= 0;  // no val split scored (--val-every 0, or none): no best.lsw either
    if (r.finished && scored)
      std::printf("finished %d epochs; best val mIoU %.4f; weights: %s/best.lsw (last epoch: last.lsw)\n", r.epochs_done,
                  r.best_miou, a.out.c_str());
    else if (r.finished)
      std::printf("finished %d epochs (no val scored); weights of the last epoch: %s/last.lsw\n", r.epochs_done, a.out.c_str());
    else if (scored)
      std::printf("stopped after %d epochs (resume with --resume); best val mIoU %.4f\n", r.epochs_done, r.best_miou);
    else
      std::printf("stopped after %d epochs (resume with --resume)\n", r.epochs_done);
  });
}

}  // namespace lightseg::cli
