// The one argument table shared by every subcommand: each option has one name, one meaning
// and one help text everywhere; a subcommand picks the options it takes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/core/ScalarType.h>

#include "lightseg/engine.h"

namespace lightseg::cli {

struct Args {
  int threads = 0;                 // --threads
  std::string device = "cpu";      // --device
  std::string weights;             // --weights
  std::string config;              // --config
  std::string size = "360x480";    // --size HxW
  bool json = false;               // --json
  std::string data;                // --data
  std::string dataset = "camvid";  // --dataset
  std::string split = "val";       // --split
  std::string out;                 // --out
  std::string host = "127.0.0.1";  // --host
  int port = 8080;                 // --port
  std::string backend = "auto";    // --backend
  int batch = 1;                   // --batch (inference)
  int iters = 50;                  // --iters
  std::string precision = "fp32";  // --precision
  std::string onnx;                // --onnx
  int opset = 13;                  // --opset
  bool dynamic = false;            // --dynamic
  std::vector<double> scales{1.0};  // --scales (test-time augmentation)
  bool flip = false;                // --flip
  std::string input_size;           // --input-size HxW|N (PredictorOptions::input_size)
};

enum class Opt { Threads, Device, Weights, Config, Size, Json, Data, Dataset, Split, Out, Host, Port,
               Backend, Batch, Iters, Precision, Onnx, Opset, Dynamic, Tta, InputSize };

void add_options(CLI::App* sub, Args& a, const std::vector<Opt>& which);
// "360x480" → {360, 480}; throws on bad text or sizes < 32.
std::pair<int64_t, int64_t> parse_size(const std::string& s);
// --precision text → compute type: fp32 → kFloat32, bf16 → kBFloat16, fp16 → kHalf.
c10::ScalarType precision_type(const std::string& p);
// --backend, --device, --precision, --scales, --flip as the options of make_engine.
EngineOptions engine_options(const Args& a);

extern int g_argc;     // the process's command line (train --nproc re-executes it)
extern char** g_argv;

// Subcommands (one file each).
void add_info(CLI::App& app, Args& a);
void add_train(CLI::App& app, Args& a);
void add_eval(CLI::App& app, Args& a);
void add_segment(CLI::App& app, Args& a);
void add_serve(CLI::App& app, Args& a);
void add_bench(CLI::App& app, Args& a);
// `bench --contention N`'s busy processes: this program run as `lightseg <kBusyLoopArg> FD PID`
// writes a byte to FD (its parent, bench's process PID, waits for it) and loops until killed
// (main() checks for it first thing).
constexpr const char* kBusyLoopArg = "--bench-busy-loop-child";
[[noreturn]] void run_busy_loop_child(int ready_fd);
void add_export(CLI::App& app, Args& a);
void add_calibrate(CLI::App& app, Args& a);
// --weights or the shipped default; throws a clear error when neither exists.
std::string resolve_weights(const std::string& given);

}  // namespace lightseg::cli
