// lightseg: real-time semantic segmentation with the network of claims 1–7 (docs/NETWORK.md).
// One header for the library's public face (target lightseg::lightseg_core):
//
//   #include <lightseg/lightseg.h>
//
//   // Segment: images in, label maps out (claim 8's processing unit).
//   lightseg::Predictor predictor;                            // the shipped models/camvid.lsw
//   lightseg::Prediction r = predictor.predict_file("street.png");
//   std::string png = lightseg::render(r.image, r.labels, predictor.meta().palette,
//                                      lightseg::Render::Overlay);
//
//   // Any backend or device: PredictorOptions::engine (EngineOptions: backend, device, dtype).
//   lightseg::PredictorOptions o;
//   o.weights = "my.lsw";
//   o.engine.device = torch::kCUDA;
//   lightseg::Predictor on_gpu(o);
//
//   // Train, then score a split.
//   lightseg::TrainOptions t;
//   t.data = "data/camvid"; t.out_dir = "runs/camvid"; t.epochs = 300;
//   lightseg::train(t);
//   lightseg::ModelMeta meta;
//   lightseg::Network net = lightseg::load_network("runs/camvid/last.lsw", &meta);
//   auto val = lightseg::SegDataset::open("camvid", "data/camvid", "val");
//   double miou = lightseg::evaluate(net, meta, val).miou();
//
// The HTTP service (lightseg::lightseg_serve) is in <lightseg/serve.h>, ONNX export
// (lightseg::lightseg_export) in <lightseg/export.h>. Everything under src/ is internal.
#pragma once

#include "lightseg/config.h"      // NetworkConfig (the claims' elements), ModelMeta (classes, palette)
#include "lightseg/dataset.h"     // SegDataset: CamVid, Cityscapes, list layouts
#include "lightseg/distributed.h" // DistConfig, Collective: data-parallel training
#include "lightseg/engine.h"      // make_engine: the inference backends
#include "lightseg/eval.h"        // evaluate: confusion matrix, mIoU over a split
#include "lightseg/features.h"    // what this build has (CUDA, oneDNN, OpenCV...)
#include "lightseg/file_io.h"     // read_file, write_file_atomic (a reader never sees half a file)
#include "lightseg/image_io.h"    // decode/encode PNG and JPEG, InputError, check_image
#include "lightseg/metrics.h"     // ConfusionMatrix
#include "lightseg/network.h"     // Network: the model (torch::nn::Module)
#include "lightseg/palette.h"     // colour masks, overlays, render(), legend()
#include "lightseg/predictor.h"   // Predictor: images in, label maps out
#include "lightseg/runtime.h"     // init_runtime: threads and allocator settings
#include "lightseg/train.h"       // TrainOptions, train(), TrainState
#include "lightseg/weights.h"     // .lsw weights files
