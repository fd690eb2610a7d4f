#include "backends/threads.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "backends/error.hpp"

using namespace rlforge::backends;

TEST(Threads, SetIntraOpThreadsTakesEffectOnTheCallingThread) {
  std::thread t([] {
    set_intra_op_threads(2);
    EXPECT_EQ(intra_op_threads(), 2);
    set_intra_op_threads(1);
    EXPECT_EQ(intra_op_threads(), 1);
  });
  t.join();
}

TEST(Threads, RejectsZeroAndNegativeCounts) {
  for (int n : {0, -1, -8}) {
    try {
      set_intra_op_threads(n);
      FAIL() << "expected an error for " << n;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(n)), std::string::npos) << e.what();
    }
  }
}
