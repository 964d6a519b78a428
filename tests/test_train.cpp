// Training end to end on a tiny synthetic dataset: learning, bf16, non-finite steps, the
// auxiliary heads and EMA, the GPU path on the CPU, recipe options, the training state.
#include <gtest/gtest.h>

#include "train_fixtures.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

TEST(Train, OverfitsTinySyntheticDataset) {
  auto dir = fixtures::temp_dir("overfit");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto epochs = overfit(tiny(dir / "data", dir / "run"), 40);
  ASSERT_EQ(epochs.size(), 40u);
  EXPECT_LT(epochs.back().loss, epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.95);
  EXPECT_TRUE(fs::exists(dir / "run" / "best.lsw"));
  EXPECT_TRUE(fs::exists(dir / "run" / "curve.svg"));
  EXPECT_TRUE(fs::exists(dir / "run" / "log.jsonl"));
  // the checkpoint evaluates to the same number as the last epoch's record
  ModelMeta meta;
  Network net = load_network((dir / "run" / "best.lsw").string(), &meta);
  auto ev = evaluate(net, meta, SegDataset::open("list", (dir / "data").string(), "train"));
  EXPECT_NEAR(ev.pixel_accuracy(), epochs.back().pixel_acc, 1e-9);
  fs::remove_all(dir);
}

TEST(Train, Bf16AutocastOnTheCpuLearns) {
  // --precision bf16 on the CPU: convolutions run in bf16 under autocast, the weights and
  // their checkpoint stay float32, and the network still fits the tiny dataset.
  auto dir = fixtures::temp_dir("amp_cpu");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.amp_cpu = true;
  auto epochs = overfit(o, 25);
  ASSERT_EQ(epochs.size(), 25u);
  EXPECT_LT(epochs.back().loss, 0.5 * epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.9);
  auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_TRUE(train_state(w)->options.amp_cpu);
  ModelMeta meta;
  Network net = load_network((dir / "run" / "last.lsw").string(), &meta);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  fs::remove_all(dir);
}

TEST(Train, NonFiniteStepsAreSkippedAndRepeatedOnesStopTheRun) {
  // A NaN gradient (a bf16 overflow, a bad batch) skips that step: no update, and the BatchNorm
  // statistics its forward pass changed are put back; five in a row are divergence.
  auto dir = fixtures::temp_dir("nonfinite");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.epochs = 2;  // 2 steps per epoch
  o.val_every = 0;
  std::map<std::string, torch::Tensor> weights_before, buffers_before;
  int step = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& net) {
    ++step;
    if (step == 3)  // BatchNorm statistics as step 4's forward pass found them
      for (const auto& b : net->named_buffers()) buffers_before[b.key()] = b.value().detach().clone();
    if (step == 4) {  // the weights step 4 must leave alone; then poison one gradient
      for (const auto& p : net->named_parameters()) weights_before[p.key()] = p.value().detach().clone();
      net->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
    }
  };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.history.size(), 2u);
  EXPECT_EQ(r.history[0].skipped_steps, 0);
  EXPECT_EQ(r.history[1].skipped_steps, 1);
  EXPECT_TRUE(std::isfinite(r.history[1].loss));
  ModelMeta meta;
  Network net = load_network((dir / "a" / "last.lsw").string(), &meta);
  ASSERT_FALSE(weights_before.empty());
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), weights_before.at(p.key()))) << p.key();
  int changed_by_forward = 0;
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(torch::equal(b.value(), buffers_before.at(b.key()))) << b.key();
    changed_by_forward += b.value().is_floating_point() ? 1 : 0;
  }
  EXPECT_GT(changed_by_forward, 0);
  EXPECT_EQ(train_state(read_weights((dir / "a" / "last.lsw").string()))->history[1].skipped_steps, 1);

  // NaN from the second step on: five skips in a row end the run with a clear error
  auto o2 = tiny(dir / "data", dir / "b");
  o2.epochs = 10;
  o2.val_every = 0;
  step = 0;
  TrainCallbacks bad;
  bad.after_backward = [&](Network& n) {
    if (++step >= 2) n->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::infinity());
  };
  try {
    train(o2, bad);
    ADD_FAILURE() << "a run of non-finite steps must stop training";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
  EXPECT_EQ(step, 6);  // one good step, five skipped
  // the last checkpoint (end of epoch 2) is intact and finite
  Network n2 = load_network((dir / "b" / "last.lsw").string(), &meta);
  for (const auto& p : n2->parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  fs::remove_all(dir);
}


TEST(Train, AuxHeadsHelpTrainingAndStayOutOfTheSavedNetwork) {
  // --aux-weight: heads on M1 (C1.3) and M2 (C1.5) join the loss during training only; the
  // saved weights are exactly the network's tensors, and they give the trainer's logits.
  auto dir = fixtures::temp_dir("aux");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.aux_weight = 0.4;
  Network trained{nullptr};
  int64_t nonzero = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& n) { trained = n; };
  auto epochs = overfit(o, 25, cb);
  ASSERT_EQ(epochs.size(), 25u);
  EXPECT_LT(epochs.back().loss, 0.5 * epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.9);
  const auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_DOUBLE_EQ(train_state(w)->options.aux_weight, 0.4);
  // the inference tensors: those of a plain network, name for name, and none of the heads'
  ModelMeta meta;
  Network plain(w.config);
  const auto ref = make_weights(plain, meta);
  ASSERT_EQ(w.tensors.size(), ref.tensors.size());
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    EXPECT_EQ(w.tensors[i].first, ref.tensors[i].first);
    EXPECT_EQ(w.tensors[i].second.sizes(), ref.tensors[i].second.sizes()) << ref.tensors[i].first;
  }
  // the heads ride along as a blob (for --resume), with trained, non-zero weights
  ASSERT_TRUE(w.blobs.count("aux_heads"));
  AuxHeads heads(w.config.c1, w.config.c2, w.config.num_classes);
  from_archive_bytes(*heads, w.blobs.at("aux_heads"));
  for (const auto& p : heads->parameters()) nonzero += p.abs().sum().item<double>() > 0;
  EXPECT_EQ(nonzero, static_cast<int64_t>(heads->parameters().size()));
  // a plain load gives the trainer's network: same logits
  Network loaded = load_network((dir / "run" / "last.lsw").string(), &meta);
  ASSERT_TRUE(trained);
  trained->eval();
  torch::NoGradGuard ng;
  torch::manual_seed(5);
  auto x = torch::randn({2, 3, 64, 64});
  auto want = trained->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::allclose(loaded->forward(x), want, 1e-4, 1e-5));
  // the training variant computes forward()'s logits, op for op
  auto b = trained->forward_with_branches(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::equal(b.logits, want));
  EXPECT_EQ(b.M1.size(1), w.config.c1);
  EXPECT_EQ(b.M2.size(1), w.config.c2);
  fs::remove_all(dir);
}

TEST(Train, EmaWeightsAreTheClosedFormAverageAndAreWhatIsScoredAndSaved) {
  // --ema-decay d: after update n, ema = d_n·ema + (1−d_n)·raw with d_n = min(d, (1+n)/(10+n)),
  // starting from the initial weights, over parameters and BatchNorm statistics; validation,
  // best.lsw and last.lsw use the average, the raw weights ride along for --resume.
  auto dir = fixtures::temp_dir("ema");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 3;  // 2 steps per epoch: 6 updates, d_n = 0.1, 0.18, 0.25, then 0.3 (the cap)
  o.ema_decay = 0.3;
  o.val_split = "train";
  o.val_every = 3;
  o.loss = "ce";
  // What the optimizer steps on: the raw weights before each step (= after the previous one)
  // and the BatchNorm statistics as each step's forward pass left them.
  std::vector<std::map<std::string, torch::Tensor>> params_before, buffers_after_forward;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& n) {
    std::map<std::string, torch::Tensor> p, b;
    for (const auto& t : n->named_parameters()) p[t.key()] = t.value().detach().to(torch::kDouble).clone();
    for (const auto& t : n->named_buffers()) b[t.key()] = t.value().detach().to(torch::kDouble).clone();
    params_before.push_back(p);
    buffers_after_forward.push_back(b);
  };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(params_before.size(), 6u);
  const auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_EQ(train_state(w)->ema_steps, 6);
  ASSERT_TRUE(w.blobs.count("raw_weights"));
  Network raw(w.config);
  from_archive_bytes(*raw, w.blobs.at("raw_weights"));
  // the start: the network as initialised (its BatchNorm statistics before any forward pass)
  torch::manual_seed(o.seed);
  NetworkConfig cfg = o.network;
  cfg.num_classes = 3;
  Network init(cfg);
  std::map<std::string, torch::Tensor> ema;
  for (const auto& t : init->named_parameters()) {
    ema[t.key()] = t.value().detach().to(torch::kDouble);
    EXPECT_TRUE(torch::equal(ema[t.key()], params_before[0].at(t.key()))) << t.key();
  }
  for (const auto& t : init->named_buffers()) ema[t.key()] = t.value().detach().to(torch::kDouble);
  for (size_t k = 0; k < 6; ++k) {
    const double d = std::min(0.3, (1.0 + k) / (10.0 + k));
    for (const auto& t : raw->named_parameters()) {
      const auto& after = k + 1 < 6 ? params_before[k + 1].at(t.key()) : t.value().detach().to(torch::kDouble);
      ema[t.key()] = d * ema[t.key()] + (1 - d) * after;
    }
    for (const auto& t : raw->named_buffers()) {
      const auto& now = buffers_after_forward[k].at(t.key());
      ema[t.key()] = t.value().is_floating_point() ? d * ema[t.key()] + (1 - d) * now : now;
    }
  }
  // the raw weights the blob holds are the last step's, i.e. not the average
  double raw_vs_ema = 0;
  for (const auto& [name, t] : w.tensors) {
    const auto& want = ema.at(name);
    const auto got = t.to(torch::kDouble);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-6 * (1 + want.abs().max().item<double>())) << name;
    for (const auto& p : raw->named_parameters())
      if (p.key() == name) raw_vs_ema = std::max(raw_vs_ema, (p.value().to(torch::kDouble) - got).abs().max().item<double>());
  }
  EXPECT_GT(raw_vs_ema, 1e-4);
  // validation scored the average; best.lsw (written by that validation) holds it too
  ModelMeta meta;
  Network saved = load_network((dir / "run" / "last.lsw").string(), &meta);
  auto ev = evaluate(saved, meta, SegDataset::open("list", (dir / "data").string(), "train"));
  ASSERT_EQ(r.history.size(), 3u);
  EXPECT_NEAR(ev.miou(), r.history.back().miou, 1e-9);
  EXPECT_LT(max_diff((dir / "run" / "last.lsw").string(), (dir / "run" / "best.lsw").string()), 1e-12);
  fs::remove_all(dir);
}


TEST(Train, TheGpuPathTrainsAsTheRecipePath) {
  // Same draws, same maths: host and device caches give the same weights; the foreach Adam
  // those of torch's Adam (to float rounding); deferred checks those of per-step ones.
  auto dir = fixtures::temp_dir("gpu_path_same");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto run = [&](const std::string& name, const std::string& cache, const std::string& fused, int sync_every) {
    auto o = tiny(dir / "data", dir / name);
    o.epochs = 2;
    o.val_every = 0;
    o.scale_min = o.scale_max = 1.0;  // unscaled: batched and per-sample images agree to 1e-6
    o.data_cache = cache;
    o.fused_optimizer = fused;
    o.sync_every = sync_every;
    auto r = train(o, {});
    EXPECT_TRUE(r.finished);
    return (dir / name / "last.lsw").string();
  };
  const auto recipe = run("recipe", "off", "off", 1), host = run("host", "host", "off", 1);
  const auto device = run("device", "device", "off", 1), fused = run("fused", "device", "on", 1);
  const auto deferred = run("deferred", "device", "on", 4);
  EXPECT_EQ(max_diff(host, device), 0);
  EXPECT_LT(max_diff(recipe, device), 1e-3);
  EXPECT_LT(max_diff(device, fused), 1e-5);
  EXPECT_LT(max_diff(fused, deferred), 1e-5);
  fs::remove_all(dir);
}

TEST(Train, DeferredNonFiniteChecksSkipTheStepAndStopARun) {
  // sync_every > 1: the skip is decided on the device; the same outcome as the per-step check
  auto dir = fixtures::temp_dir("nonfinite_deferred");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.epochs = 2;
  o.val_every = 0;
  o.data_cache = "device";
  o.fused_optimizer = "on";
  o.sync_every = 2;
  std::map<std::string, torch::Tensor> weights_before, buffers_before;
  int step = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& net) {
    ++step;
    if (step == 3)
      for (const auto& b : net->named_buffers()) buffers_before[b.key()] = b.value().detach().clone();
    if (step == 4) {
      for (const auto& p : net->named_parameters()) weights_before[p.key()] = p.value().detach().clone();
      net->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
    }
  };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.history.size(), 2u);
  EXPECT_EQ(r.history[0].skipped_steps, 0);
  EXPECT_EQ(r.history[1].skipped_steps, 1);
  EXPECT_TRUE(std::isfinite(r.history[1].loss));
  ModelMeta meta;
  Network net = load_network((dir / "a" / "last.lsw").string(), &meta);
  ASSERT_FALSE(weights_before.empty());
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), weights_before.at(p.key()))) << p.key();
  for (const auto& b : net->named_buffers()) EXPECT_TRUE(torch::equal(b.value(), buffers_before.at(b.key()))) << b.key();
  auto o2 = o;
  o2.out_dir = (dir / "b").string();
  o2.epochs = 10;
  step = 0;
  TrainCallbacks bad;
  bad.after_backward = [&](Network& n) {
    if (++step >= 2) n->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::infinity());
  };
  try {
    train(o2, bad);
    ADD_FAILURE() << "a run of non-finite steps must stop training";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
  EXPECT_EQ(step, 6);  // read every 2 steps: the fifth skip in a row (step 6) is seen at once
  fs::remove_all(dir);
}

TEST(Train, RecipeOptionsComeFromTheTrainObjectAndAreChecked) {
  TrainOptions o;
  EXPECT_EQ(o.aux_weight, 0.0);  // off by default: the default recipe trains as before
  EXPECT_EQ(o.ema_decay, 0.0);
  o.apply_json_string(R"({"aux_weight": 0.4, "ema_decay": 0.999})");
  EXPECT_DOUBLE_EQ(o.aux_weight, 0.4);
  EXPECT_DOUBLE_EQ(o.ema_decay, 0.999);
  TrainOptions back;
  back.apply_json_string(o.to_json_string());  // how a resumed run gets them from its checkpoint
  EXPECT_DOUBLE_EQ(back.aux_weight, 0.4);
  EXPECT_DOUBLE_EQ(back.ema_decay, 0.999);
  o.data = o.out_dir = "x";
  EXPECT_NO_THROW(o.validate());
  o.ema_decay = 1.0;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.ema_decay = 0;
  o.aux_weight = -0.1;
  EXPECT_THROW(o.validate(), std::invalid_argument);
}

// --set KEY=VALUE (mmsegmentation's --cfg-options): any train option or network key.
TEST(Train, SetOverridesAnyOptionByKey) {
  TrainOptions o;
  o.set("lr=5e-4");
  EXPECT_DOUBLE_EQ(o.lr, 5e-4);
  o.set("train.loss=ohem");  // a bare word is a string
  EXPECT_EQ(o.loss, "ohem");
  o.set("crop=[256,512]");
  EXPECT_EQ(o.crop_h, 256);
  EXPECT_EQ(o.crop_w, 512);
  o.set("network.c0=16");
  EXPECT_EQ(o.network.c0, 16);
  EXPECT_EQ(o.network.c1, 64);  // the rest stays
  o.set("network.stage2.layers=4");  // the dilation schedule follows the new count
  EXPECT_EQ(o.network.stage2.layers, 4);
  EXPECT_EQ(o.network.stage2.dilations.size(), 4u);
  o.set("network.stage2.dilations=[1,2,3,4]");
  EXPECT_EQ(o.network.stage2.dilations, (std::vector<int>{1, 2, 3, 4}));
  for (const char* bad : {"nonsense=1", "lr", "=3", "network.c9=1", "network.stage3.layers=2", "lr=fast",
                          "network.stage2.layers=3" /* = stage1's: C5.1 */, "a.b=1"}) {
    try {
      TrainOptions p;
      p.set(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  TrainOptions p;
  try {
    p.set("nonsense=1");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense"), std::string::npos) << e.what();
  }
}



// The training state of a checkpoint: read from the layout every checkpoint so far has used,
// written back with the other keys of the weights' extra JSON kept.
TEST(Train, TrainStateReadsTheCheckpointLayoutAndRoundTrips) {
  WeightsFile w;
  EXPECT_FALSE(train_state(w));  // plain weights
  w.extra = R"({"note": "kept", "train": {"epoch": 3, "batch": 5, "global_step": 41, "world": 2, "best_miou": 0.5,
                "part_loss": 2.5, "part_count": 5, "history": [{"epoch": 1, "loss": 1.5, "lr": 0.001,
                "val_miou": null, "val_pixel_acc": null}], "options": {"lr": 0.002, "crop": [64, 96]}}})";
  auto s = train_state(w);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->epoch, 3);
  EXPECT_EQ(s->batch, 5);
  EXPECT_EQ(s->global_step, 41);
  EXPECT_EQ(s->world, 2);
  EXPECT_DOUBLE_EQ(s->best_miou, 0.5);
  EXPECT_DOUBLE_EQ(s->part_loss, 2.5);
  EXPECT_EQ(s->part_count, 5);
  EXPECT_EQ(s->ema_steps, 0);  // absent: no EMA
  ASSERT_EQ(s->history.size(), 1u);
  EXPECT_DOUBLE_EQ(s->history[0].loss, 1.5);
  EXPECT_LT(s->history[0].miou, 0);  // not scored that epoch
  EXPECT_DOUBLE_EQ(s->options.lr, 0.002);
  EXPECT_EQ(s->options.crop_w, 96);
  EXPECT_EQ(s->options.epochs, TrainOptions{}.epochs);
  s->epoch = 4;
  s->ema_steps = 9;
  set_train_state(w, *s);
  auto back = train_state(w);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->epoch, 4);
  EXPECT_EQ(back->ema_steps, 9);
  EXPECT_EQ(back->history.size(), 1u);
  EXPECT_EQ(back->options.to_json_string(), s->options.to_json_string());
  EXPECT_EQ(nlohmann::json::parse(w.extra)["note"], "kept");
  w.extra = R"({"train": {"epoch": 1.5}})";
  EXPECT_THROW(train_state(w), std::invalid_argument);
  w.extra = R"({"train": {"options": {"lr": "fast"}}})";
  EXPECT_THROW(train_state(w), std::invalid_argument);
}

// TrainOptions::device is a torch::Device like every other option struct's; JSON keeps the text.
TEST(Train, DeviceIsATorchDeviceWithATextForm) {
  TrainOptions o;
  EXPECT_TRUE(o.device.is_cpu());
  o.set("device=cuda:1");
  EXPECT_EQ(o.device, torch::Device(torch::kCUDA, 1));
  EXPECT_NE(o.to_json_string().find(R"("device":"cuda:1")"), std::string::npos) << o.to_json_string();
  TrainOptions back;
  back.apply_json_string(o.to_json_string());
  EXPECT_EQ(back.device, o.device);
  for (const char* bad : {"device=gpu", "device=cuda:x", "device=3"}) {
    try {
      o.set(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
    }
  }
}
