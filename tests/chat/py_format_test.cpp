// chat/py_format.hpp: Python's float repr and json.dumps string escaping.
#include "chat/py_format.hpp"

#include <cmath>
#include <limits>

#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

using detail::float_repr;
using detail::json_quote;

TEST(ChatPyFormat, FloatReprMatchesPython) {
  EXPECT_EQ(float_repr(1.0), "1.0");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1.5e16), "1.5e+16");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(0.00001), "1e-05");
  EXPECT_EQ(float_repr(-2.5e-10), "-2.5e-10");
  EXPECT_EQ(float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(float_repr(5e-324), "5e-324");
  EXPECT_EQ(float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(float_repr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(float_repr(std::nan("")), "nan");
}

TEST(ChatPyFormat, JsonQuoteEscapesLikePythonsJsonModule) {
  EXPECT_EQ(json_quote("a\"b\\c\n\r\t\b\f\x01\x1f\x7f/", false),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f/\"");
  EXPECT_EQ(json_quote("é😀", false), "\"é😀\"");
  EXPECT_EQ(json_quote("é😀\x7f", true), "\"\\u00e9\\ud83d\\ude00\\u007f\"");
}

} // namespace
} // namespace rlforge::chat::test
