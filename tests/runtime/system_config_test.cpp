#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using rlforge::runtime::system_config;

namespace {

struct env_guard {
  std::string name;
  env_guard(std::string n, const char* value) : name(std::move(n)) {
    setenv(name.c_str(), value, 1);
  }
  ~env_guard() { unsetenv(name.c_str()); }
};

} // namespace

TEST(SystemConfig, DefaultsUseTheSharingSchedulerAndOneThreadPerCore) {
  system_config cfg;
  ASSERT_FALSE(cfg.parse_args({}));
  EXPECT_EQ(caf::get_or(cfg, "scheduler.policy", caf::atom("")), caf::atom("sharing"));
  EXPECT_GE(caf::get_or(cfg, "scheduler.max-threads", size_t{0}), size_t{1});
  EXPECT_EQ(cfg.gpus, 0);
  EXPECT_EQ(cfg.pg_timeout_s, 180);
}

TEST(SystemConfig, FlagsInBothFormsSetRlforgeOptions) {
  system_config cfg;
  ASSERT_FALSE(cfg.parse_args({"--gpus", "4", "--rlforge.cpus=3", "--node-id=n9",
                               "--scheduler.max-threads=3"}));
  EXPECT_EQ(cfg.gpus, 4);
  EXPECT_EQ(cfg.cpus, 3);
  EXPECT_EQ(cfg.node_id, "n9");
  EXPECT_EQ(caf::get_or(cfg, "scheduler.max-threads", size_t{0}), size_t{3});
  auto node = runtime::local_node_resources(cfg);
  EXPECT_EQ(node.gpus, 4);
  EXPECT_EQ(node.cpus, 3);
  EXPECT_GT(node.memory_bytes, 0);
  EXPECT_TRUE(node.virtual_gpus);
}

TEST(SystemConfig, EnvironmentSetsDefaultsAndFlagsOverrideIt) {
  env_guard timeout{"RLFORGE_PG_TIMEOUT_S", "7.5"};
  env_guard gpus{"RLFORGE_GPUS", "2"};
  system_config cfg;
  ASSERT_FALSE(cfg.parse_args({"--gpus=6"}));
  EXPECT_EQ(cfg.pg_timeout_s, 7.5);
  EXPECT_EQ(cfg.gpus, 6);
}

TEST(SystemConfig, RejectsBadEnvironmentValuesNamingThem) {
  env_guard timeout{"RLFORGE_PG_TIMEOUT_S", "soon"};
  system_config cfg;
  auto err = cfg.parse_args({});
  ASSERT_TRUE(err);
  EXPECT_TRUE(is(err, errc::invalid_argument));
  EXPECT_NE(error_message(err).find("RLFORGE_PG_TIMEOUT_S='soon'"), std::string::npos)
    << error_message(err);
}

TEST(SystemConfig, RejectsOutOfDomainValuesNamingThem) {
  struct bad_case {
    std::vector<std::string> args;
    std::string expected;
  };
  std::vector<bad_case> cases = {
    {{"--gpus=-1"}, "gpus must be >= 0, got -1"},
    {{"--cpus=-2"}, "cpus must be >= 0, got -2"},
    {{"--pg-timeout=0"}, "pg-timeout must be a finite number of seconds > 0"},
    {{"--call-timeout=-3"}, "call-timeout must be a finite number of seconds > 0"},
    {{"--log-level=loud"}, "got 'loud'"},
    {{"--log-format=yaml"}, "log-format must be text or json; got 'yaml'"},
    {{"--node-id="}, "node-id"},
  };
  for (auto& c : cases) {
    system_config cfg;
    auto err = cfg.parse_args(c.args);
    ASSERT_TRUE(err) << c.args[0];
    EXPECT_TRUE(is(err, errc::invalid_argument));
    EXPECT_NE(error_message(err).find(c.expected), std::string::npos)
      << c.args[0] << ": " << error_message(err);
  }
}

TEST(SystemConfig, RejectsUnknownArguments) {
  system_config cfg;
  auto err = cfg.parse_args({"--gpuz=3"});
  ASSERT_TRUE(err);
  EXPECT_TRUE(is(err, errc::invalid_argument));
}

TEST(Errc, RendersCodeAndMessage) {
  auto err = make_error(errc::timeout, "rank 1 did not answer");
  EXPECT_EQ(render_errc(err.code(), err.context()), "rlforge.timeout: rank 1 did not answer");
  EXPECT_TRUE(is(err, errc::timeout));
  EXPECT_FALSE(is(err, errc::internal));
  EXPECT_STREQ(to_string(errc::rank_failed), "rank_failed");
}

TEST(Errc, EmptyAndForeignErrorsHaveNoRlforgeMessage) {
  EXPECT_EQ(error_message(caf::error{}), "");
  EXPECT_FALSE(is(caf::error{}, errc::none));
  EXPECT_EQ(error_message(caf::make_error(caf::sec::request_timeout)), "");
}

TEST(Logging, JsonLinesAreOneEscapedObjectEach) {
  using rlforge::runtime::json_log_line;
  EXPECT_EQ(json_log_line("actors.dispatch", "info", 42, 1764277200123,
                          "event=weight_sync bytes=153088"),
            R"({"time":"2025-11-27T21:00:00.123Z","level":"info","logger":"actors.dispatch",)"
            R"("thread":42,"message":"event=weight_sync bytes=153088"})");
  // Quotes, backslashes, line breaks and other control bytes are escaped; UTF-8 passes through.
  auto line = json_log_line("l", "warn", 1, 0, "a \"b\" \\ c\nd\te\x01 \xc3\xa9");
  EXPECT_NE(line.find(R"("message":"a \"b\" \\ c\nd\te\u0001 )" "\xc3\xa9\"}"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find(R"("time":"1970-01-01T00:00:00.000Z")"), std::string::npos) << line;
  EXPECT_EQ(rlforge::runtime::check_log_format("json"), "");
  EXPECT_EQ(rlforge::runtime::check_log_format("text"), "");
  EXPECT_NE(rlforge::runtime::check_log_format("xml"), "");
}
