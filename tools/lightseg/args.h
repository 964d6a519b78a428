// The one argument table shared by every subcommand: each option has one name, one meaning
// and one help text everywhere; a subcommand picks the options it takes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

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
};

enum class Opt { Threads, Device, Weights, Config, Size, Json, Data, Dataset, Split, Out };

void add_options(CLI::App* sub, Args& a, const std::vector<Opt>& which);
// "360x480" → {360, 480}; throws on bad text or sizes < 32.
std::pair<int64_t, int64_t> parse_size(const std::string& s);

extern int g_argc;     // the process's command line (train --nproc re-executes it)
extern char** g_argv;

// Subcommands (one file each).
void add_info(CLI::App& app, Args& a);
void add_train(CLI::App& app, Args& a);
void add_eval(CLI::App& app, Args& a);
// --weights or the shipped default; throws a clear error when neither exists.
std::string resolve_weights(const std::string& given);

}  // namespace lightseg::cli
