#include "lightseg/metrics.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace lightseg {

ConfusionMatrix::ConfusionMatrix(int k, int ignore) : k_(k), ignore_(ignore) {
  if (k <= 0) throw std::invalid_argument("confusion matrix needs at least one class");
  reset();
}

void ConfusionMatrix::reset() { m_ = torch::zeros({k_, k_}, torch::kLong); }

void ConfusionMatrix::update(const torch::Tensor& pred, const torch::Tensor& target) {
  if (pred.sizes() != target.sizes())
    throw std::invalid_argument("prediction " + c10::str(pred.sizes()) + " and label " + c10::str(target.sizes()) +
                                " differ in size");
  auto p = pred.reshape(-1).to(torch::kCPU, torch::kLong);
  auto t = target.reshape(-1).to(torch::kCPU, torch::kLong);
  auto valid = (t != ignore_) & (t >= 0) & (t < k_);
  if ((((t != ignore_) & ~valid)).any().item<bool>())
    throw std::invalid_argument("label contains ids outside 0.." + std::to_string(k_ - 1) + " that are not the ignore id");
  p = p.masked_select(valid);
  t = t.masked_select(valid);
  if (((p < 0) | (p >= k_)).any().item<bool>())
    throw std::invalid_argument("prediction contains ids outside 0.." + std::to_string(k_ - 1));
  m_ += torch::bincount(t * k_ + p, {}, k_ * k_).view({k_, k_});
}

void ConfusionMatrix::merge(const ConfusionMatrix& o) {
  if (o.k_ != k_) throw std::invalid_argument("cannot merge confusion matrices of different sizes");
  m_ += o.m_;
}

std::vector<double> ConfusionMatrix::iou() const {
  auto m = m_.to(torch::kDouble);
  auto tp = m.diagonal();
  auto gt = m.sum(1), pr = m.sum(0);
  std::vector<double> r(k_);
  for (int c = 0; c < k_; ++c) {
    double denom = gt[c].item<double>() + pr[c].item<double>() - tp[c].item<double>();
    r[c] = denom > 0 ? tp[c].item<double>() / denom : std::numeric_limits<double>::quiet_NaN();
  }
  return r;
}

double ConfusionMatrix::miou() const {
  double s = 0;
  int n = 0;
  for (double v : iou())
    if (!std::isnan(v)) {
      s += v;
      ++n;
    }
  return n ? s / n : 0.0;
}

int64_t ConfusionMatrix::pixels() const { return m_.sum().item<int64_t>(); }

double ConfusionMatrix::pixel_accuracy() const {
  const int64_t n = pixels();
  return n ? static_cast<double>(m_.diagonal().sum().item<int64_t>()) / n : 0.0;
}

}  // namespace lightseg
