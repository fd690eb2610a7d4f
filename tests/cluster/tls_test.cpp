// Cluster TLS (caf::openssl, mutual certificates): `rlforge head --init-tls DIR` writes a CA and
// the cluster certificate; a head, nodes and drivers with it work, and a group spanning two
// nodes meets for its Gloo all-reduce through its store actor over those TLS connections (no
// rendezvous port); a node without a certificate, or with one signed by another CA, is refused
// before any of its messages is processed (it never joins; the head's registry does not change).
#include <gtest/gtest.h>

#include <filesystem>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "runtime/errc.hpp"
#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

int init_tls(const std::string& dir, const std::string& log, std::string* out = nullptr) {
  child_process p({rlforge_binary(), "head", "--init-tls", dir}, log);
  auto rc = p.wait_exit(60s);
  if (out)
    *out = p.log();
  return rc ? *rc : -2;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

} // namespace

TEST(ClusterTls, OnlyProcessesWithTheClustersCertificateJoin) {
  // The CA directory lives next to the cluster's logs.
  auto scratch = fs::temp_directory_path() / ("rlforge_tls_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  struct cleanup {
    fs::path p;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup_scratch{scratch};
  auto ca = (scratch / "cluster").string(), other = (scratch / "other").string();
  ASSERT_EQ(init_tls(ca, (scratch / "init1.log").string()), 0);
  for (auto* f : {"ca.pem", "ca-key.pem", "cert.pem", "key.pem"})
    EXPECT_TRUE(fs::exists(fs::path{ca} / f)) << f;
  EXPECT_EQ(fs::status(fs::path{ca} / "key.pem").permissions() & fs::perms::others_read,
            fs::perms::none);
  std::string again;
  EXPECT_EQ(init_tls(ca, (scratch / "init2.log").string(), &again), 1);
  EXPECT_NE(again.find("exists already"), std::string::npos) << again;
  ASSERT_EQ(init_tls(other, (scratch / "init3.log").string()), 0);

  test_cluster cluster{"tls", {"--tls", ca}};
  auto& trusted = cluster.add_node("trusted", 1, 1, {"--tls", ca});
  ASSERT_TRUE(trusted.wait_for_log("joined cluster", 1ms)) << cluster.logs();
  auto& trusted2 = cluster.add_node("trusted2", 1, 1, {"--tls", ca});
  ASSERT_TRUE(trusted2.wait_for_log("joined cluster", 1ms)) << cluster.logs();
  // No certificate: refused during the TLS handshake.
  auto& plain = cluster.add_node("plain", 1, 1, {"--connect-timeout", "3"});
  ASSERT_EQ(plain.wait_exit(30s), 1) << plain.log();
  EXPECT_NE(plain.log().find("handshake"), std::string::npos) << plain.log();
  // A certificate signed by another CA: refused too.
  auto& stranger = cluster.add_node("stranger", 1, 1, {"--tls", other, "--connect-timeout", "3"});
  ASSERT_EQ(stranger.wait_exit(30s), 1) << stranger.log();
  EXPECT_NE(stranger.log().find("handshake"), std::string::npos) << stranger.log();
  // The head logs each refused handshake with the peer's address (when the peer has not hung
  // up already) and OpenSSL's reason.
  auto head_log = cluster.head().log();
  EXPECT_GE(count_of(head_log, "tls_refused peer=127.0.0.1:"), 2u) << head_log;
  // The refused handshakes did not disturb the trusted node's connection (CAF 0.17 would drop
  // it without runtime/openssl_error_queue.hpp).
  EXPECT_EQ(trusted.log().find("lost the head"), std::string::npos) << cluster.logs();
  // A driver with the certificate sees only the trusted node and runs ranks on it.
  test_driver driver{cluster.endpoint(), {"--tls", ca}};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto status = driver.status();
  ASSERT_EQ(status["nodes"].size(), 2u) << status.dump(2);
  EXPECT_FALSE(node_status(status, "trusted").is_null()) << status.dump(2);
  EXPECT_FALSE(node_status(status, "trusted2").is_null()) << status.dump(2);
  auto pg = driver.pgs().create({"tls", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error()) << cluster.logs();
  auto group = driver.spawn_group("g", "ref", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  EXPECT_TRUE(group->call_all(actors::rank_ops::ping.id, caf::message{}, 10s));
  // The ranks on the two nodes met through the group's store actor over TLS: they all-reduce.
  auto sums = group->call_mesh(actors::rank_ops::all_reduce.id,
                               {caf::make_message(tensor_list{f32_blob({1, 2})}),
                                caf::make_message(tensor_list{f32_blob({10, 20})})},
                               30s);
  ASSERT_TRUE(sums) << driver.sys().render(sums.error()) << cluster.logs();
  for (auto& m : *sums)
    EXPECT_EQ(floats(m.get_as<tensor_list>(0).at(0)), (std::vector<float>{11, 22}));
  group->stop();
  // A driver without the certificate cannot attach.
  test_driver intruder{cluster.endpoint()};
  EXPECT_NE(intruder.error().find("handshake"), std::string::npos) << intruder.error();
  // One signed by another CA neither.
  test_driver stranger_driver{cluster.endpoint(), {"--tls", other}};
  EXPECT_NE(stranger_driver.error().find("handshake"), std::string::npos)
    << stranger_driver.error();
}
