// tinker/types.hpp and tinker/error.hpp: dtype names, tensor sizes, the error category.
#include "tests/tinker/test_support.hpp"

namespace rlforge::tinker::test {
namespace {

TEST(TinkerTypes, DtypeNamesRoundTrip) {
  for (auto t : {dtype::float32, dtype::int64, dtype::int32, dtype::bfloat16})
    EXPECT_EQ(parse_dtype(to_string(t)), t);
  EXPECT_STREQ(to_string(dtype::bfloat16), "bfloat16");
  EXPECT_TRUE(is_floating(dtype::bfloat16));
  EXPECT_FALSE(is_floating(dtype::int32));
}

TEST(TinkerTypes, ParseDtypeRefusesUnknownNames) {
  for (const char* bad : {"float64", "Float32", "", "int8"})
    expect_user_error([&] { parse_dtype(bad); }, {"unknown dtype", std::string("\"") + bad});
}

TEST(TinkerTypes, NumelIsTheShapeProduct) {
  tensor_data t;
  EXPECT_EQ(t.numel(), 1); // a scalar
  t.shape = {2, 3};
  EXPECT_EQ(t.numel(), 6);
  t.shape = {4, 0};
  EXPECT_EQ(t.numel(), 0);
}

TEST(TinkerErrors, CategoriesMapToHttpStatusAndFutureCategory) {
  EXPECT_EQ(http_status(error_category::user), 400);
  EXPECT_EQ(http_status(error_category::not_found), 404);
  EXPECT_EQ(http_status(error_category::server), 500);
  EXPECT_STREQ(future_category(error_category::user), "user");
  EXPECT_STREQ(future_category(error_category::not_found), "user");
  EXPECT_STREQ(future_category(error_category::server), "server");
  request_error e(error_category::not_found, "model 'x' does not exist");
  EXPECT_EQ(e.category(), error_category::not_found);
  EXPECT_STREQ(e.what(), "model 'x' does not exist");
  expect_error([] { fail_server("disk full"); }, error_category::server, {"disk full"});
}

} // namespace
} // namespace rlforge::tinker::test
