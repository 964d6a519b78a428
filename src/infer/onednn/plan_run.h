// Running a plan: its steps in order (timed one by one when profiling), the labels' variant
// that ends in the fused upsampling + argmax, and the profile's report.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

torch::Tensor Plan::run(const torch::Tensor& images, dnnl::stream& strm) {
  const int64_t K = f_.channels[f_.output];
  auto out = torch::empty({N_, K, H_, W_}, torch::TensorOptions().dtype(torch::kFloat32).memory_format(
                                               torch::MemoryFormat::ChannelsLast));
  input_ = images.data_ptr<float>();
  output_ = out.data_ptr<float>();
  if (!profile_) {
    for (auto& s : steps_) s(strm);
    strm.wait();
    return out;
  }
  step_seconds_.resize(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    steps_[i](strm);
    strm.wait();
    step_seconds_[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ++profiled_runs_;
  return out;
}

torch::Tensor Plan::labels(const torch::Tensor& images, dnnl::stream& strm) {
  auto out = torch::empty({N_, H_, W_}, torch::kInt64);
  input_ = images.data_ptr<float>();
  for (size_t i = 0; i + 1 < steps_.size(); ++i) steps_[i](strm);
  strm.wait();
  run_labels(*output_resize_, out.data_ptr<int64_t>());
  return out;
}

std::string Plan::report() const {
  if (profiled_runs_ == 0) return "";
  double total = 0;
  for (double s : step_seconds_) total += s;
  char b[512];
  std::snprintf(b, sizeof b, "onednn plan %lldx%lldx%lld: %lld calls, %.3f ms per call\n", static_cast<long long>(N_),
                static_cast<long long>(H_), static_cast<long long>(W_), static_cast<long long>(profiled_runs_),
                1e3 * total / profiled_runs_);
  std::string r = b;
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::snprintf(b, sizeof b, "  %7.3f ms %5.1f%%  %s\n", 1e3 * step_seconds_[i] / profiled_runs_,
                  100.0 * step_seconds_[i] / total, labels_[i].c_str());
    r += b;
  }
  return r;
}
