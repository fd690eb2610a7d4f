#include "placement/request.hpp"
#include "placement/resources.hpp"
#include "placement/strategy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

TEST(Resources, ConvertsToFixedPointRoundingToTheNearestUnit) {
  EXPECT_EQ(to_units(0.2).value(), 2000);
  EXPECT_EQ(to_units(1).value(), 10000);
  EXPECT_EQ(to_units(0).value(), 0);
  EXPECT_EQ(to_units(0.33333).value(), 3333);
  EXPECT_EQ(to_units(1.23456).value(), 12346);
  EXPECT_EQ(to_units(0.00006).value(), 1);
  EXPECT_EQ(to_units(0.00004).value(), 0);
  EXPECT_EQ(to_units(64).value(), 640000);
}

TEST(Resources, RejectsNaNInfinityAndNegativeAmountsNamingTheValue) {
  auto nan = to_units(std::numeric_limits<double>::quiet_NaN(), "GPU");
  ASSERT_FALSE(nan.ok());
  EXPECT_TRUE(error_names(nan.error(), placement_errc::invalid_amount, "GPU is NaN"));
  auto inf = to_units(std::numeric_limits<double>::infinity(), "CPU");
  ASSERT_FALSE(inf.ok());
  EXPECT_TRUE(error_names(inf.error(), placement_errc::invalid_amount, "CPU is inf"));
  auto neg = to_units(-1.5, "GPU");
  ASSERT_FALSE(neg.ok());
  EXPECT_TRUE(error_names(neg.error(), placement_errc::invalid_amount, "-1.5"));
  auto huge = to_units(1e20, "memory");
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(error_names(huge.error(), placement_errc::invalid_amount, "1e+20"));
}

TEST(Resources, PositiveAmountsRejectZeroAndValuesRoundingToZero) {
  auto zero = to_positive_units(0, "GPU");
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(error_names(zero.error(), placement_errc::invalid_amount, "GPU is 0"));
  auto tiny = to_positive_units(0.00004, "GPU");
  ASSERT_FALSE(tiny.ok());
  EXPECT_TRUE(error_names(tiny.error(), placement_errc::invalid_amount, "4e-05"));
  EXPECT_EQ(to_positive_units(0.0001, "GPU").value(), 1);
}

TEST(Resources, FormatsUnitsAsShortDecimals) {
  EXPECT_EQ(format_units(2000), "0.2");
  EXPECT_EQ(format_units(10000), "1");
  EXPECT_EQ(format_units(10001), "1.0001");
  EXPECT_EQ(format_units(0), "0");
  EXPECT_EQ(format_units(-2500), "-0.25");
  EXPECT_EQ(format_units(640000), "64");
  EXPECT_EQ(format_units(std::numeric_limits<units>::min()).substr(0, 2), "-9");
}

TEST(Resources, ToStringListsGpuThenCpuThenMemoryThenCustomNames) {
  EXPECT_EQ(res({{"CPU", 1}, {"GPU", 0.2}}).to_string(), "GPU: 0.2, CPU: 1");
  EXPECT_EQ(res({{"zeta", 2}, {"memory", 1000}, {"alpha", 0.5}, {"CPU", 4}}).to_string(),
            "CPU: 4, memory: 1000, alpha: 0.5, zeta: 2");
  EXPECT_EQ(resource_set{}.to_string(), "nothing");
}

TEST(Resources, AddSubtractAndFitsAreExactInFixedPoint) {
  resource_set sum;
  for (int i = 0; i < 3; ++i)
    sum.add(res({{"GPU", 0.1}}));
  sum.add(res({{"GPU", 0.7}}));
  EXPECT_EQ(sum.get("GPU"), units_per_whole);
  EXPECT_EQ(sum, res({{"GPU", 1}}));
  // Binary floating point gets 0.1 + 0.2 != 0.3 wrong; fixed point does not.
  ASSERT_NE(0.1 + 0.2, 0.3);
  auto small = res({{"CPU", 0.1}});
  small.add(res({{"CPU", 0.2}}));
  EXPECT_EQ(small, res({{"CPU", 0.3}}));

  auto gpu = res({{"GPU", 1}});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(gpu.fits(res({{"GPU", 0.2}}))) << i;
    ASSERT_TRUE(gpu.subtract(res({{"GPU", 0.2}})).ok()) << i;
  }
  EXPECT_TRUE(gpu.empty());
  EXPECT_FALSE(gpu.fits(res({{"GPU", 0.2}})));
  EXPECT_TRUE(gpu.fits(resource_set{}));
}

TEST(Resources, SubtractFailsWithoutChangesNamingTheResource) {
  auto have = res({{"GPU", 1}, {"CPU", 2}});
  auto ok = have.subtract(res({{"CPU", 1}, {"GPU", 1.5}}));
  ASSERT_FALSE(ok.ok());
  EXPECT_TRUE(error_names(ok.error(), placement_errc::insufficient_resources, "GPU: 1.5"));
  EXPECT_EQ(have, res({{"GPU", 1}, {"CPU", 2}}));
}

TEST(Resources, SetRejectsEmptyNamesAndBadAmounts) {
  resource_set r;
  auto empty = r.set("", 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, placement_errc::invalid_resource_name);
  auto negative = r.set("CPU", -2);
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(error_names(negative.error(), placement_errc::invalid_amount, "-2"));
  auto zero_units = r.set_units("GPU", 0);
  ASSERT_FALSE(zero_units.ok());
  EXPECT_TRUE(error_names(zero_units.error(), placement_errc::invalid_amount, "GPU is 0"));
  EXPECT_TRUE(r.empty());
}

TEST(Resources, MakeResourcesRejectsDuplicatesAndBadValues) {
  auto dup = make_resources({{"GPU", 1}, {"GPU", 2}});
  ASSERT_FALSE(dup.ok());
  EXPECT_TRUE(error_names(dup.error(), placement_errc::invalid_resource_name, "GPU"));
  auto nan = make_resources({{"CPU", std::nan("")}});
  ASSERT_FALSE(nan.ok());
  EXPECT_TRUE(error_names(nan.error(), placement_errc::invalid_amount, "NaN"));
  auto runtime = make_resources(std::vector<std::pair<std::string, double>>{{"GPU", 0}});
  ASSERT_FALSE(runtime.ok());
  EXPECT_TRUE(error_names(runtime.error(), placement_errc::invalid_amount, "GPU is 0"));
}

TEST(Strategy, ParsesTheFourNamesCaseInsensitively) {
  EXPECT_EQ(parse_strategy("pack").value(), placement_strategy::pack);
  EXPECT_EQ(parse_strategy("SPREAD").value(), placement_strategy::spread);
  EXPECT_EQ(parse_strategy("strict_pack").value(), placement_strategy::strict_pack);
  EXPECT_EQ(parse_strategy("STRICT_SPREAD").value(), placement_strategy::strict_spread);
  for (auto s : {placement_strategy::pack, placement_strategy::spread,
                 placement_strategy::strict_pack, placement_strategy::strict_spread})
    EXPECT_EQ(parse_strategy(to_string(s)).value(), s);
}

TEST(Strategy, RejectsUnknownNamesListingTheValidOnes) {
  auto bad = parse_strategy("scatter");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(error_names(bad.error(), placement_errc::unknown_strategy, "'scatter'"));
  EXPECT_NE(bad.error().message.find("pack, spread, strict_pack, strict_spread"),
            std::string::npos);
  EXPECT_FALSE(parse_strategy("").ok());
  EXPECT_FALSE(parse_strategy("strict-pack").ok());
}

TEST(Request, RejectsEmptyRequestsAndEmptyBundles) {
  auto none = make_request("pack", {});
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(error_names(none.error(), placement_errc::empty_request, "no bundles"));
  auto empty = make_request("spread", {res({{"GPU", 1}}), resource_set{}});
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(error_names(empty.error(), placement_errc::empty_bundle, "bundle 1"));
}

TEST(Request, RejectsFractionalGpuAboveOneAndUnknownStrategies) {
  auto frac = make_request("pack", {res({{"GPU", 1.5}})});
  ASSERT_FALSE(frac.ok());
  EXPECT_TRUE(error_names(frac.error(), placement_errc::invalid_bundle, "GPU: 1.5"));
  auto strategy = make_request("packed", {res({{"GPU", 1}})});
  ASSERT_FALSE(strategy.ok());
  EXPECT_TRUE(error_names(strategy.error(), placement_errc::unknown_strategy, "'packed'"));
  auto good = make_request("strict_spread", {res({{"GPU", 2}}), res({{"GPU", 0.5}})});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->strategy, placement_strategy::strict_spread);
  EXPECT_EQ(good->bundles.size(), 2u);
}
