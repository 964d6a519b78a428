// A module's or an optimizer's state as bytes (torch's archive format) and back: the blobs of
// a checkpoint (the optimizer, the aux heads, the raw weights behind an EMA).
#pragma once

#include <string>

#include <torch/torch.h>

namespace lightseg {

// T: torch::nn::Module or torch::optim::Optimizer (anything with save(OutputArchive&)).
template <typename T>
std::string to_archive_bytes(const T& obj) {
  torch::serialize::OutputArchive ar;
  obj.save(ar);
  std::string buf;
  ar.save_to([&buf](const void* d, size_t n) {
    buf.append(static_cast<const char*>(d), n);
    return n;
  });
  return buf;
}

// Into an object of the same structure; tensors are read onto `device` (a module's land on
// its parameters' own device either way).
template <typename T>
void from_archive_bytes(T& obj, const std::string& bytes, torch::Device device = torch::kCPU) {
  torch::serialize::InputArchive ar;
  ar.load_from(bytes.data(), bytes.size(), device);
  obj.load(ar);
}

}  // namespace lightseg
