// Segmentation metrics from one confusion matrix accumulated over a whole split.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace lightseg {

class ConfusionMatrix {
 public:
  explicit ConfusionMatrix(int num_classes, int ignore_index = 255);
  // pred, target: same shape, integer ids; target == ignore_index is skipped.
  // Ids outside 0..K-1 (other than the ignore id in target) are an error.
  void update(const torch::Tensor& pred, const torch::Tensor& target);
  void merge(const ConfusionMatrix& other);
  void reset();

  int num_classes() const { return k_; }
  // rows = ground truth, cols = prediction (int64 K×K)
  const torch::Tensor& matrix() const { return m_; }
  // TP / (TP + FP + FN) per class; NaN for a class absent from both ground truth and prediction.
  std::vector<double> iou() const;
  // Mean over classes whose IoU is defined (a class with ground truth but no correct pixel counts as 0).
  double miou() const;
  double pixel_accuracy() const;
  int64_t pixels() const;

 private:
  int k_, ignore_;
  torch::Tensor m_;
};

}  // namespace lightseg
