// Cluster settings of the runtime: HOST:PORT endpoints, the TLS directory (init and check), the
// system_config options and the version / wire-signature comparison of the join handshake.
#include <gtest/gtest.h>

#include <filesystem>

#include <caf/actor_system.hpp>

#include "runtime/cluster_endpoint.hpp"
#include "runtime/cluster_protocol.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "runtime/tls.hpp"
#include "tests/support/temp_dir.hpp"

using namespace rlforge;
using namespace rlforge::runtime;
namespace fs = std::filesystem;

namespace {

using rlforge::test_support::temp_dir;

std::string message_of(const caf::error& err) {
  return error_message(err);
}

} // namespace

TEST(ClusterEndpoint, ParsesHostAndPortAndRefusesNonsense) {
  auto a = parse_endpoint("10.0.0.7:6380");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "10.0.0.7");
  EXPECT_EQ(a->port, 6380);
  auto v6 = parse_endpoint("[::1]:7");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(to_string(*v6), "[::1]:7");
  EXPECT_EQ(to_string(*a), "10.0.0.7:6380");
  for (auto* bad : {"host", "host:", ":6380", "host:0", "host:65536", "host:12x", "::1:80",
                    "[::1]6380"}) {
    auto r = parse_endpoint(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(message_of(r.error()).find(bad), std::string::npos) << message_of(r.error());
  }
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.1.2.3"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
}

TEST(ClusterTlsFiles, InitWritesACaAndACertificateThatVerifyAndNeverOverwrites) {
  temp_dir d;
  ASSERT_FALSE(init_tls(d.str()));
  EXPECT_FALSE(check_tls(d.str()));
  auto files = tls_files_in(d.str());
  EXPECT_EQ(fs::status(files.key).permissions() & (fs::perms::group_all | fs::perms::others_all),
            fs::perms::none);
  auto again = init_tls(d.str());
  ASSERT_TRUE(again);
  EXPECT_TRUE(is(again, errc::already_exists));
  EXPECT_NE(message_of(again).find("ca.pem"), std::string::npos) << message_of(again);
}

TEST(ClusterTlsFiles, CheckNamesTheFileAndTheProblem) {
  temp_dir a, b;
  ASSERT_FALSE(init_tls(a.str()));
  ASSERT_FALSE(init_tls(b.str()));
  auto fa = tls_files_in(a.str()), fb = tls_files_in(b.str());
  // Another CA's key with this certificate.
  fs::copy_file(fb.key, fa.key, fs::copy_options::overwrite_existing);
  auto wrong_key = check_tls(a.str());
  ASSERT_TRUE(wrong_key);
  EXPECT_NE(message_of(wrong_key).find("does not belong"), std::string::npos)
    << message_of(wrong_key);
  // A certificate (with its key) signed by another CA.
  fs::copy_file(fb.cert, fa.cert, fs::copy_options::overwrite_existing);
  auto other_ca = check_tls(a.str());
  ASSERT_TRUE(other_ca);
  EXPECT_NE(message_of(other_ca).find("does not verify against CA"), std::string::npos)
    << message_of(other_ca);
  // A file that is not PEM, and a missing one.
  { std::ofstream(fa.cert) << "not a certificate"; }
  auto garbage = check_tls(a.str());
  ASSERT_TRUE(garbage);
  EXPECT_NE(message_of(garbage).find(fa.cert), std::string::npos) << message_of(garbage);
  fs::remove(fa.ca_cert);
  auto missing = check_tls(a.str());
  ASSERT_TRUE(missing);
  EXPECT_NE(message_of(missing).find(fa.ca_cert), std::string::npos) << message_of(missing);
}

TEST(ClusterConfig, ClusterOptionsAreCheckedAndTlsLoadsTheOpensslModule) {
  {
    system_config cfg;
    auto err = cfg.parse_args({"--cluster", "nohost"});
    ASSERT_TRUE(err);
    EXPECT_NE(message_of(err).find("'nohost' is not HOST:PORT"), std::string::npos);
  }
  {
    system_config cfg;
    auto err = cfg.parse_args({"--heartbeat-ms", "5"});
    ASSERT_TRUE(err);
    EXPECT_NE(message_of(err).find("heartbeat-ms must be in 10..60000, got 5"), std::string::npos);
  }
  {
    system_config cfg;
    auto err = cfg.parse_args({"--heartbeat-ms", "500", "--dead-after-ms", "600"});
    ASSERT_TRUE(err);
    EXPECT_NE(message_of(err).find("dead-after-ms must be at least twice"), std::string::npos);
  }
  {
    system_config cfg;
    ASSERT_FALSE(cfg.parse_args({}));
    EXPECT_EQ(cfg.head_grace_ms, 30000);
    ASSERT_FALSE(cfg.parse_args({"--head-grace-ms", "0"}));
    EXPECT_EQ(cfg.head_grace_ms, 0);
    auto err = cfg.parse_args({"--head-grace-ms", "3600001"});
    ASSERT_TRUE(err);
    EXPECT_NE(message_of(err).find("head-grace-ms must be in 0..3600000, got 3600001"),
              std::string::npos);
  }
  {
    system_config cfg;
    auto err = cfg.parse_args({"--tls", "/nonexistent/rlforge-tls"});
    ASSERT_TRUE(err);
    EXPECT_NE(message_of(err).find("/nonexistent/rlforge-tls/ca.pem"), std::string::npos)
      << message_of(err);
  }
  temp_dir d;
  ASSERT_FALSE(init_tls(d.str()));
  system_config cfg;
  ASSERT_FALSE(cfg.parse_args({"--tls", d.str(), "--cluster", "127.0.0.1:6380"}));
  EXPECT_TRUE(cfg.tls());
  EXPECT_EQ(cfg.cluster, "127.0.0.1:6380");
  caf::actor_system sys{cfg};
  EXPECT_TRUE(sys.has_openssl_manager());
  // Without a TLS directory the default stays plain and embedded.
  system_config plain;
  ASSERT_FALSE(plain.parse_args({}));
  EXPECT_FALSE(plain.tls());
  EXPECT_TRUE(plain.cluster.empty());
}

TEST(ClusterVersions, AMismatchNamesTheFirstDifference) {
  system_config cfg;
  ASSERT_FALSE(cfg.parse_args({}));
  caf::actor_system sys{cfg};
  auto own = wire_signature(sys);
  ASSERT_FALSE(own.empty());
  EXPECT_TRUE(describe_mismatch("node 'n1'", "head", rlforge_version(), own, own).empty());
  auto old = describe_mismatch("node 'n1'", "head", "0.0.1", own, own);
  EXPECT_NE(old.find("node 'n1' runs rlforge 0.0.1, the head runs "), std::string::npos) << old;
  auto changed = own;
  changed[1] = "rlforge::node_resources: node_resources(\"\", 0)";
  auto diff = describe_mismatch("node 'n1'", "head", rlforge_version(), changed, own);
  EXPECT_NE(diff.find("differs in rlforge::node_resources"), std::string::npos) << diff;
  auto shorter = own;
  shorter.pop_back();
  auto lack = describe_mismatch("driver 'd'", "head", rlforge_version(), shorter, own);
  EXPECT_NE(lack.find("driver 'd' lacks 'interface rendezvous_store_actor'"), std::string::npos) << lack;
}
