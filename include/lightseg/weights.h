// lightseg: the weights file (".lsw"), self-describing.
//
// Layout: 8-byte magic "LSEGWTS1", u64 little-endian header length, a JSON header
// {"format":"lightseg-weights","version":1,"arch":"lightseg","config":{...},"meta":{...},
//  "tensors":[{"name","dtype","shape","offset","bytes"}...],"blobs":[{"name","offset","bytes"}],
//  "extra":{...}}, then the raw little-endian data (offsets relative to the data start).
// Blobs carry opaque bytes (a checkpoint's optimizer state); "extra" any JSON (training state).
// Files are written atomically: a temporary file in the same folder, fsync, then rename.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

struct WeightsFile {
  NetworkConfig config;
  ModelMeta meta;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // in model order
  std::map<std::string, std::string> blobs;
  std::string extra = "{}";  // JSON text (a checkpoint's training state: train_state())
};

// Collects the model's parameters and buffers (CPU, contiguous copies).
WeightsFile make_weights(Network& net, const ModelMeta& meta);
void write_weights(const std::string& path, const WeightsFile& w);
WeightsFile read_weights(const std::string& path);
// The same from the file's bytes; `what` names the source in errors (read_weights: the path).
WeightsFile parse_weights(const std::string& bytes, const std::string& what);
// Copies the file's tensors into net. Throws naming the first mismatching parameter and both shapes.
void load_into(Network& net, const WeightsFile& w);

// Fine-tuning: copies every tensor of the file whose name and shape fit the model and leaves
// the others as the model has them (freshly initialised), e.g. the classifier of a model with
// another class count. Says what it did; throws on non-finite loaded values.
struct PartialLoad {
  std::vector<std::string> loaded;       // copied from the file
  std::vector<std::string> reshaped;     // in both, shapes differ: "name (file AxB, model CxD)"
  std::vector<std::string> missing;      // the model's, not in the file
  std::vector<std::string> unused;       // the file's, not in the model
  size_t model_tensors = 0;
  // "loaded 610 of 612 tensors; kept new: decoder.pw6.weight (file 11x64x1x1, model 2x64x1x1), ..."
  std::string summary() const;
};
PartialLoad load_matching(Network& net, const WeightsFile& w);

// Convenience: build the network a file describes and load it.
Network load_network(const std::string& path, ModelMeta* meta = nullptr);
void save_network(const std::string& path, Network& net, const ModelMeta& meta);

// The default weights (camvid.lsw), looked for in this order: the folder LIGHTSEG_MODELS names;
// next to the executable (build/bin/../../models, PREFIX/bin/../share/lightseg/models); the
// installed package's PREFIX/share/lightseg/models (a program built with find_package(lightseg)
// gets it through LIGHTSEG_INSTALLED_MODELS_DIR, below); the source tree lightseg was built from.
// Empty if none.
std::string default_weights_path();
// The installed package's models folder, for default_weights_path(). find_package(lightseg)
// defines LIGHTSEG_INSTALLED_MODELS_DIR for its users (relative to where the package lies, so a
// moved prefix still works), and this header registers it at start-up.
void set_installed_models_dir(const std::string& dir);
#ifdef LIGHTSEG_INSTALLED_MODELS_DIR
namespace detail {
inline const bool installed_models_dir_registered = (set_installed_models_dir(LIGHTSEG_INSTALLED_MODELS_DIR), true);
}  // namespace detail
#endif

}  // namespace lightseg
