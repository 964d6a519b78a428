// curve.svg's epoch axis: whole epochs, evenly spaced, none skipped (a 7-epoch run once read
// "1 2 3 5 6 7").
#include <regex>

#include <gtest/gtest.h>

#include "lightseg/file_io.h"
#include "train/curve.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

std::vector<int> epoch_ticks(int epochs) {
  std::vector<EpochRecord> h;
  for (int e = 1; e <= epochs; ++e) {
    EpochRecord r;
    r.epoch = e;
    r.loss = 1.0 / e;
    r.miou = e % 2 ? 0.1 * (e % 10) : -1;
    h.push_back(r);
  }
  const auto dir = fixtures::temp_dir("curve_svg");
  const auto path = (dir / "curve.svg").string();
  write_curve_svg(path, h, "test");
  const std::string svg = read_file(path);
  fs::remove_all(dir);
  // the x-axis labels: the middle-anchored texts on the line below the plot (y = 40 + 310 + 18)
  std::vector<int> ticks;
  const std::regex tick("y='368.0' text-anchor='middle'>([0-9]+)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
    ticks.push_back(std::stoi((*it)[1]));
  return ticks;
}

}  // namespace

TEST(CurveSvg, EpochTicksAreWholeEvenlySpacedAndNoneSkipped) {
  EXPECT_EQ(epoch_ticks(7), (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(epoch_ticks(1), (std::vector<int>{1}));
  EXPECT_EQ(epoch_ticks(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(epoch_ticks(20), (std::vector<int>{1, 6, 11, 16}));
  for (int n : {2, 9, 13, 40, 101, 500, 1234}) {
    const auto t = epoch_ticks(n);
    ASSERT_GE(t.size(), 2u) << n;
    EXPECT_LE(t.size(), 8u) << n;
    EXPECT_EQ(t.front(), 1) << n;
    EXPECT_LE(t.back(), n) << n;
    EXPECT_GT(t.back() + (t[1] - t[0]), n) << n << ": the last step before the end is missing";
    for (size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i] - t[i - 1], t[1] - t[0]) << n << ": uneven spacing";
  }
}
