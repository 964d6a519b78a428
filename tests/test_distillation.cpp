// Knowledge distillation (TrainOptions::distill_from, `train --distill-from`): the loss, and a
// student that learns its teacher's predictions.
#include <gtest/gtest.h>

#include "train_fixtures.h"
#include "data/transforms.h"
#include "train/losses.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

TEST(Distillation, TheLossIsZeroForTheTeachersOwnLogitsAndCountsLabelledPixelsOnly) {
  torch::manual_seed(2);
  auto teacher = torch::randn({2, 3, 8, 8}), student = torch::randn({2, 3, 8, 8});
  auto y = torch::randint(0, 3, {2, 8, 8}, torch::kLong);
  EXPECT_NEAR(distillation_loss(teacher, teacher, y, 1.0).item<double>(), 0.0, 1e-6);
  const double d1 = distillation_loss(student, teacher, y, 1.0).item<double>();
  EXPECT_GT(d1, 0.05);
  // T² · KL at temperature T: the same as the loss of the logits divided by T, times T²
  EXPECT_NEAR(distillation_loss(student, teacher, y, 2.0).item<double>(),
              4.0 * distillation_loss(student / 2, teacher / 2, y, 1.0).item<double>(), 1e-5);
  // unlabelled pixels (255) do not count: only the first image's
  auto half = y.clone();
  half[1].fill_(255);
  EXPECT_NEAR(distillation_loss(student, teacher, half, 1.0).item<double>(),
              distillation_loss(student.narrow(0, 0, 1), teacher.narrow(0, 0, 1), y.narrow(0, 0, 1), 1.0).item<double>(),
              1e-6);
  EXPECT_EQ(distillation_loss(student, teacher, torch::full_like(y, 255), 1.0).item<double>(), 0.0);
  // a gradient step on the student moves it toward the teacher; the teacher gets no gradient
  auto s = student.clone().requires_grad_(), t = teacher.clone().requires_grad_();
  distillation_loss(s, t, y, 1.0).backward();
  EXPECT_FALSE(t.grad().defined() && t.grad().abs().max().item<float>() > 0);
  EXPECT_LT(distillation_loss(student - 5.0 * s.grad(), teacher, y, 1.0).item<double>(), d1);
  EXPECT_THROW(distillation_loss(student, teacher.narrow(1, 0, 2), y, 1.0), std::invalid_argument);
}

TEST(Distillation, AStudentLearnsItsTeachersPredictionsAndAMismatchedTeacherIsRefused) {
  auto dir = fixtures::temp_dir("distill");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  // the teacher: wider, trained a few epochs
  auto ot = tiny(dir / "data", dir / "teacher");
  ot.network.c0 = 24;
  ot.network.c1 = 48;
  ot.network.c2 = 64;
  ot.epochs = 8;
  ot.val_every = 0;
  ASSERT_TRUE(train(ot, {}).finished);
  const std::string teacher_path = (dir / "teacher" / "last.lsw").string();
  ModelMeta meta;
  Network teacher = load_network(teacher_path, &meta);
  teacher->eval();
  // two students from the same start, with and without the teacher
  auto student = [&](const std::string& name, double weight) {
    auto o = tiny(dir / "data", dir / name);
    o.epochs = 12;
    o.val_every = 0;
    if (weight > 0) {
      o.distill_from = teacher_path;
      o.distill_weight = weight;
      o.distill_temperature = 2.0;
    }
    EXPECT_TRUE(train(o, {}).finished) << name;
    Network n = load_network((dir / name / "last.lsw").string());
    n->eval();
    return n;
  };
  Network plain = student("plain", 0), taught = student("taught", 2.0);
  // their disagreement with the teacher on the training images
  auto ds = SegDataset::open("list", (dir / "data").string(), "train");
  auto kl_to_teacher = [&](Network& n) {
    torch::NoGradGuard ng;
    double sum = 0;
    for (size_t i = 0; i < ds.size(); ++i) {
      auto [img, lab] = ds.load(i);
      auto x = normalize(img.permute({2, 0, 1}).to(torch::kFloat32), meta).unsqueeze(0);  // as in training
      sum += distillation_loss(n->forward(x), teacher->forward(x), lab.to(torch::kLong).unsqueeze(0), 1.0).item<double>();
    }
    return sum / static_cast<double>(ds.size());
  };
  // (measured: 0.017 against 0.089)
  const double kl_plain = kl_to_teacher(plain), kl_taught = kl_to_teacher(taught);
  EXPECT_LT(kl_taught, 0.5 * kl_plain) << "taught " << kl_taught << ", plain " << kl_plain;
  // a teacher of another class count is refused, naming both
  Network other(NetworkConfig{});  // 11 classes
  save_network((dir / "other.lsw").string(), other, ModelMeta::camvid());
  auto o = tiny(dir / "data", dir / "bad");
  o.epochs = 1;
  o.distill_from = (dir / "other.lsw").string();
  try {
    train(o, {});
    ADD_FAILURE() << "a teacher of 11 classes was accepted for 3";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("11 classes"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
