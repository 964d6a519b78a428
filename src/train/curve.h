// The training-curve picture (internal): loss and val mIoU by epoch, as SVG (curve.svg of a run folder).
#pragma once

#include <string>
#include <vector>

#include "lightseg/train.h"

namespace lightseg {

// Writes the training curve (loss on the left axis, val mIoU on the right, by epoch) as SVG.
void write_curve_svg(const std::string& path, const std::vector<EpochRecord>& history, const std::string& title);

}  // namespace lightseg
