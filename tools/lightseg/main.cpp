// lightseg: the command-line front end. Each subcommand lives in its own cmd_*.cpp and only
// calls the library; errors are printed as "error: ..." with a non-zero exit code.
#include <cstdio>
#include <exception>

#include "args.h"
#include "lightseg/runtime.h"

int main(int argc, char** argv) {
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
