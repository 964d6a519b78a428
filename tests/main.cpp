#include <gtest/gtest.h>

#include "lightseg/runtime.h"

int main(int argc, char** argv) {
  lightseg::init_runtime();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
