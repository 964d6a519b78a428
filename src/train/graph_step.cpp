#include "train/graph_step.h"

#include "lightseg/features.h"

#if LIGHTSEG_HAVE_TORCH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace lightseg {

std::string graph_step_unavailable(const TrainOptions& o, bool deferred, bool has_after_backward) {
  if (!deferred) return "the deferred step (fused optimizer, sync_every > 1, no EMA, one process)";
  if (o.loss == "ohem") return "a loss without data-dependent shapes (OHEM selects pixels on the host)";
  if (has_after_backward) return "no per-step callback";
  return "";
}

bool cuda_graphs_compiled() { return LIGHTSEG_HAVE_TORCH_CUDA != 0; }

#if LIGHTSEG_HAVE_TORCH_CUDA
struct GraphedStep::Graph {
  at::cuda::CUDAGraph graph;
};
#else
struct GraphedStep::Graph {};
#endif

GraphedStep::GraphedStep(TrainStep& step, ForeachAdam& fused, int warmup_steps)
    : step_(step), fused_(fused), warmup_(warmup_steps) {
  fused_.use_device_learning_rates();
}

GraphedStep::~GraphedStep() = default;

std::string GraphedStep::state() const {
  if (captured_) return "captured";
  if (given_up_) return "eager";
  return calls_ < warmup_ ? "warming up" : "eager";
}

void GraphedStep::run(const torch::Tensor& images, const torch::Tensor& labels) {
  ++calls_;
  fused_.load_learning_rates();
  const bool same_shape = x_.defined() && images.sizes() == x_.sizes() && labels.sizes() == y_.sizes() &&
                          images.scalar_type() == x_.scalar_type() && labels.scalar_type() == y_.scalar_type();
  if (!x_.defined()) {
    // the fixed inputs, in the batch's memory format (channels_last stays channels_last)
    x_ = torch::empty_like(images);
    y_ = torch::empty_like(labels);
  } else if (!same_shape) {  // e.g. a last, smaller batch: not the captured shape
    step_.run(images, labels);
    return;
  }
  {
    torch::NoGradGuard ng;
    x_.copy_(images);
    y_.copy_(labels);
  }
  if (captured_) {
#if LIGHTSEG_HAVE_TORCH_CUDA
    graph_->graph.replay();
    ++replays_;
#endif
    return;
  }
  const bool can_capture = cuda_graphs_compiled() && images.is_cuda() && !given_up_;
  if (!can_capture || calls_ <= warmup_) {
    step_.run(x_, y_);
    return;
  }
  capture(images, labels);
}

void GraphedStep::capture(const torch::Tensor& images, const torch::Tensor& labels) {
#if LIGHTSEG_HAVE_TORCH_CUDA
  (void)images;
  (void)labels;
  // As torch.cuda.graph does: on a side stream, after the work queued so far; autocast's cast
  // cache off (its casts must be made inside the graph); thread-local capture mode, so that the
  // loader's threads may use CUDA meanwhile. The capture runs the step once (its update counts).
  torch::cuda::synchronize();
  auto side = c10::cuda::getStreamFromPool();
  const bool cache = at::autocast::is_autocast_cache_enabled();
  try {
    graph_ = std::make_unique<Graph>();
    {
      c10::cuda::CUDAStreamGuard guard(side);
      at::autocast::set_autocast_cache_enabled(false);
      graph_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        step_.run(x_, y_);
      } catch (...) {
        try {
          graph_->graph.capture_end();
        } catch (...) {
        }
        throw;
      }
      graph_->graph.capture_end();
      at::autocast::set_autocast_cache_enabled(cache);
    }
    torch::cuda::synchronize();
    // the capture recorded the step without running it: run it now
    graph_->graph.replay();
    ++replays_;
    captured_ = true;
  } catch (const std::exception& e) {
    at::autocast::set_autocast_cache_enabled(cache);
    graph_.reset();
    given_up_ = true;
    failure_ = e.what();
    const auto nl = failure_.find('\n');
    if (nl != std::string::npos) failure_.resize(nl);
    torch::cuda::synchronize();
    step_.run(x_, y_);  // this step, eagerly; the later ones too
  }
#else
  (void)images;
  (void)labels;
  step_.run(x_, y_);
#endif
}

}  // namespace lightseg
