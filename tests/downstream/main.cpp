// Segments one image with the installed library: segment_one WEIGHTS IMAGE OUT_COLOR.png;
// WEIGHTS "default": the default Predictor (the installed model), whose path goes to stderr.
#include <cstdio>
#include <exception>
#include <string>

#include <lightseg/lightseg.h>  // the umbrella header: the whole public face

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: segment_one WEIGHTS IMAGE OUT_COLOR.png\n");
    return 2;
  }
  try {
    lightseg::PredictorOptions o;
    if (std::string(argv[1]) == "default") std::fprintf(stderr, "default weights: %s\n", lightseg::default_weights_path().c_str());
    else o.weights = argv[1];
    lightseg::Predictor predictor(o);
    const lightseg::Prediction p = predictor.predict_file(argv[2]);
    const std::string png = lightseg::render(p.image, p.labels, predictor.meta().palette, lightseg::Render::Color);
    std::FILE* f = std::fopen(argv[3], "wb");
    if (!f || std::fwrite(png.data(), 1, png.size(), f) != png.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "cannot write %s\n", argv[3]);
      return 1;
    }
    int classes = 0;
    for (const auto& e : lightseg::legend(p.labels, predictor.meta())) classes += e.pixels > 0;
    std::printf("%ldx%ld, %d classes present, backend %s\n", static_cast<long>(p.labels.size(1)),
                static_cast<long>(p.labels.size(0)), classes, predictor.backend().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
