// lightseg: the command-line front end. Each subcommand lives in its own cmd_*.cpp and only
// calls the library; errors are printed as "error: ..." with a non-zero exit code.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "args.h"
#include "lightseg/runtime.h"

// GNU OpenMP read its wait policy when it was loaded, before main(): lightseg's short-spin
// default (lightseg/runtime.h) takes effect in a fresh image of this program with it set.
static void reexec_with_thread_wait_defaults(char** argv) {
  try {
    lightseg::reexec_with_thread_wait_defaults(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::exit(2);
  }
}

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], lightseg::cli::kBusyLoopArg) == 0)  // bench --contention's busy processes
    lightseg::cli::run_busy_loop_child(std::atoi(argv[2]));
  reexec_with_thread_wait_defaults(argv);
  CLI::App app{"lightseg: real-time semantic segmentation (C++/LibTorch)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lightseg 0.1.0");
  lightseg::cli::Args args;
  lightseg::cli::g_argc = argc;
  lightseg::cli::g_argv = argv;
  lightseg::cli::add_info(app, args);
  lightseg::cli::add_train(app, args);
  lightseg::cli::add_eval(app, args);
  lightseg::cli::add_segment(app, args);
  lightseg::cli::add_serve(app, args);
  lightseg::cli::add_bench(app, args);
  lightseg::cli::add_export(app, args);
  lightseg::cli::add_calibrate(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
