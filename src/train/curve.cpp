// The training-curve picture: loss (left axis) and val mIoU (right axis) by epoch, as SVG.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "train/curve.h"
#include "lightseg/weights.h"
#include "lightseg/file_io.h"

namespace lightseg {

void write_curve_svg(const std::string& path, const std::vector<EpochRecord>& h, const std::string& title) {
  const double W = 720, H = 400, L = 60, R = 60, T = 40, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  int max_epoch = 1;
  double max_loss = 1e-9;
  for (const auto& r : h) {
    max_epoch = std::max(max_epoch, r.epoch);
    max_loss = std::max(max_loss, r.loss);
  }
  auto X = [&](double e) { return L + pw * (max_epoch > 1 ? (e - 1) / (max_epoch - 1) : 0.5); };
  auto YL = [&](double v) { return T + ph * (1 - v / max_loss); };
  auto YM = [&](double v) { return T + ph * (1 - v); };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='" << W / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  // grid and axes
  for (int i = 0; i <= 5; ++i) {
    double y = T + ph * i / 5.0;
    s << "<line x1='" << L << "' y1='" << y << "' x2='" << L + pw << "' y2='" << y << "' stroke='#ddd'/>\n";
    s.precision(3);
    s << "<text x='" << L - 6 << "' y='" << y + 4 << "' text-anchor='end' fill='#c0392b'>" << max_loss * (1 - i / 5.0) << "</text>\n";
    s.precision(2);
    s << "<text x='" << L + pw + 6 << "' y='" << y + 4 << "' fill='#2471a3'>" << 1 - i / 5.0 << "</text>\n";
    s.precision(1);
  }
  s << "<rect x='" << L << "' y='" << T << "' width='" << pw << "' height='" << ph << "' fill='none' stroke='#333'/>\n";
  // Whole epochs, evenly spaced: a step of 1, 2, 5, 10, 20, 50, ... giving at most 8 ticks.
  int step = 1;
  for (int k = 0; (max_epoch - 1) / step > 7; ++k) step = (k % 3 == 1 ? 5 : 2) * step / (k % 3 == 1 ? 2 : 1);
  for (int e = 1; e <= max_epoch; e += step)
    s << "<text x='" << X(e) << "' y='" << T + ph + 18 << "' text-anchor='middle'>" << e << "</text>\n";
  s << "<text x='" << L + pw / 2 << "' y='" << H - 10 << "' text-anchor='middle'>epoch</text>\n";
  s << "<text x='14' y='" << T + ph / 2 << "' fill='#c0392b' transform='rotate(-90 14 " << T + ph / 2
    << ")' text-anchor='middle'>train loss</text>\n";
  s << "<text x='" << W - 14 << "' y='" << T + ph / 2 << "' fill='#2471a3' transform='rotate(90 " << W - 14 << " "
    << T + ph / 2 << ")' text-anchor='middle'>val mIoU</text>\n";
  s.precision(2);
  s << "<polyline fill='none' stroke='#c0392b' stroke-width='2' points='";
  for (const auto& r : h) s << X(r.epoch) << "," << YL(r.loss) << " ";
  s << "'/>\n<polyline fill='none' stroke='#2471a3' stroke-width='2' points='";
  for (const auto& r : h)
    if (r.miou >= 0) s << X(r.epoch) << "," << YM(r.miou) << " ";
  s << "'/>\n";
  for (const auto& r : h)
    if (r.miou >= 0) s << "<circle cx='" << X(r.epoch) << "' cy='" << YM(r.miou) << "' r='2.5' fill='#2471a3'/>\n";
  s << "</svg>\n";
  write_file_atomic(path, s.str());
}

}  // namespace lightseg
