// <lightseg/opencv.h>: cv::Mat in (BGR, BGRA, gray, ROIs), labels out as CV_8UC1, the same
// labels as Predictor::predict on the equivalent RGB tensor; bad Mats are clear errors.
#include <gtest/gtest.h>

#include "lightseg/features.h"
#include "predictor_fixtures.h"

#if LIGHTSEG_HAVE_OPENCV
#include <opencv2/imgproc.hpp>

#include "lightseg/opencv.h"
#endif

using namespace lightseg;
namespace fx = lightseg::fixtures;

TEST(OpenCvHeader, MatInLabelsOut) {
#if LIGHTSEG_HAVE_OPENCV
  fx::one_thread();
  Predictor p(fx::random_network(), ModelMeta::camvid());
  const int H = 40, W = 56;
  torch::Tensor rgb = fx::shapes_sample(H, W, 5).first.contiguous();
  cv::Mat bgr;
  cv::cvtColor(cv::Mat(H, W, CV_8UC3, rgb.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);

  EXPECT_TRUE(torch::equal(tensor_from_mat(bgr), rgb)) << "BGR → RGB";
  MatPrediction r = predict(p, bgr, /*confidence=*/true);
  const Prediction ref = p.predict(rgb, true);
  ASSERT_EQ(r.labels.type(), CV_8UC1);
  ASSERT_EQ(r.labels.rows, H);
  ASSERT_EQ(r.labels.cols, W);
  EXPECT_EQ(std::memcmp(r.labels.data, ref.labels.contiguous().data_ptr<uint8_t>(), H * W), 0);
  ASSERT_EQ(r.confidence.type(), CV_32FC1);
  EXPECT_FLOAT_EQ(r.confidence.at<float>(3, 4), ref.confidence[3][4].item<float>());
  EXPECT_TRUE(predict(p, bgr).confidence.empty());

  cv::Mat bgra;
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  EXPECT_TRUE(torch::equal(tensor_from_mat(bgra), rgb)) << "BGRA → RGB, alpha dropped";

  cv::Mat gray;
  cv::cvtColor(bgr, gray, cv::COLOR_BGR2GRAY);
  auto g = tensor_from_mat(gray);
  ASSERT_EQ(g.sizes(), (std::vector<int64_t>{H, W}));
  EXPECT_EQ(g[7][9].item<uint8_t>(), gray.at<uint8_t>(7, 9));
  EXPECT_EQ(predict(p, gray).labels.size(), cv::Size(W, H));

  // A region of a bigger frame (rows with a stride).
  cv::Mat big(H + 10, W + 20, CV_8UC3, cv::Scalar(1, 2, 3));
  bgr.copyTo(big(cv::Rect(20, 10, W, H)));
  EXPECT_TRUE(torch::equal(tensor_from_mat(big(cv::Rect(20, 10, W, H))), rgb));

  EXPECT_THROW(tensor_from_mat(cv::Mat()), std::invalid_argument);
  EXPECT_THROW(tensor_from_mat(cv::Mat(8, 8, CV_32FC3)), std::invalid_argument);
  EXPECT_THROW(tensor_from_mat(cv::Mat(8, 8, CV_8UC2)), std::invalid_argument);
  try {
    predict(p, cv::Mat(8, 8, CV_16UC1));
    FAIL() << "a 16-bit Mat was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("8-bit"), std::string::npos) << e.what();
  }
#else
  GTEST_SKIP() << "built without OpenCV: <lightseg/opencv.h> needs it";
#endif
}
