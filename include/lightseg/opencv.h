// Optional: cv::Mat in and out of the Predictor, for applications that already use OpenCV.
// Header-only; the lightseg libraries do not depend on OpenCV (lightseg.h does not include
// this). Include it where you link OpenCV (core):
//
//   #include <lightseg/lightseg.h>
//   #include <lightseg/opencv.h>
//
//   lightseg::Predictor predictor;
//   cv::Mat frame = ...;                                    // BGR (as cv::imread, cv::VideoCapture give)
//   lightseg::MatPrediction r = lightseg::predict(predictor, frame);
//   // r.labels: CV_8UC1 class ids at the frame's size; r.confidence: CV_32FC1 when asked
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

#include <opencv2/core.hpp>

#include "lightseg/predictor.h"

namespace lightseg {

// A cv::Mat as the predictor's image: H×W×3 uint8 RGB from BGR (CV_8UC3) or BGRA (CV_8UC4, alpha
// dropped), H×W uint8 from gray (CV_8UC1). Always a copy (ROIs and strided Mats are fine).
// Throws std::invalid_argument for an empty Mat, another depth or another channel count.
inline torch::Tensor tensor_from_mat(const cv::Mat& m) {
  if (m.empty()) throw std::invalid_argument("lightseg::tensor_from_mat: the cv::Mat is empty");
  if (m.depth() != CV_8U || m.dims != 2)
    throw std::invalid_argument("lightseg::tensor_from_mat: want an 8-bit 2-D image (CV_8UC1/3/4), got type " +
                                std::to_string(m.type()) + " with " + std::to_string(m.dims) + " dims");
  const int c = m.channels();
  if (c != 1 && c != 3 && c != 4)
    throw std::invalid_argument("lightseg::tensor_from_mat: want 1 (gray), 3 (BGR) or 4 (BGRA) channels, got " +
                                std::to_string(c));
  const int64_t h = m.rows, w = m.cols;
  if (c == 1) {
    auto t = torch::empty({h, w}, torch::kUInt8);
    for (int y = 0; y < m.rows; ++y) std::memcpy(t.data_ptr<uint8_t>() + y * w, m.ptr<uint8_t>(y), static_cast<size_t>(w));
    return t;
  }
  auto t = torch::empty({h, w, 3}, torch::kUInt8);
  uint8_t* dst = t.data_ptr<uint8_t>();
  for (int y = 0; y < m.rows; ++y) {
    const uint8_t* src = m.ptr<uint8_t>(y);
    for (int x = 0; x < m.cols; ++x, src += c, dst += 3) {
      dst[0] = src[2];
      dst[1] = src[1];
      dst[2] = src[0];
    }
  }
  return t;
}

// An H×W uint8 label map (or float32 confidence) as a cv::Mat (CV_8UC1 / CV_32FC1), a copy.
inline cv::Mat mat_from_tensor(const torch::Tensor& t) {
  if (!t.defined()) return {};
  if (t.dim() != 2) throw std::invalid_argument("lightseg::mat_from_tensor: want an H×W tensor");
  auto c = t.to(torch::kCPU).contiguous();
  int type;
  if (c.scalar_type() == torch::kUInt8) type = CV_8UC1;
  else if (c.scalar_type() == torch::kFloat32) type = CV_32FC1;
  else throw std::invalid_argument("lightseg::mat_from_tensor: want uint8 labels or float32 confidence");
  cv::Mat m(static_cast<int>(c.size(0)), static_cast<int>(c.size(1)), type);
  std::memcpy(m.data, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  return m;
}

struct MatPrediction {
  cv::Mat labels;      // CV_8UC1 class ids, at the input's size
  cv::Mat confidence;  // CV_32FC1 probability of the chosen class (when asked), else empty
  double inference_ms = 0;
};

// Predictor::predict for a cv::Mat (BGR, BGRA or gray; see tensor_from_mat).
inline MatPrediction predict(const Predictor& p, const cv::Mat& image, bool confidence = false,
                             const Augmentation& aug = {}) {
  Prediction r = p.predict(tensor_from_mat(image), confidence, aug);
  return {mat_from_tensor(r.labels), mat_from_tensor(r.confidence), r.inference_ms};
}

}  // namespace lightseg
