// The head's join and attach handshakes over a real loopback connection (two actor systems in
// one process): what is refused (another version, another wire format, other actor kinds,
// nonsense resources, a bad or duplicate node id), that the head keeps serving afterwards, that
// CAF refuses a client expecting another interface, that a dead node's id may join again, and
// that exit messages from other processes are ignored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "actors/head.hpp"
#include "actors/local_exit.hpp"
#include "actors/node_agent.hpp"
#include "actors/worker.hpp"
#include "actors/actor_kind.hpp"
#include "runtime/cluster_endpoint.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;

namespace {

class HeadProtocol : public ::testing::Test {
protected:
  void SetUp() override {
    register_worker_kinds();
    register_engine_kind();
    ASSERT_FALSE(head_cfg_.parse_args({}));
    ASSERT_FALSE(node_cfg_.parse_args({}));
    head_sys_ = std::make_unique<caf::actor_system>(head_cfg_);
    node_sys_ = std::make_unique<caf::actor_system>(node_cfg_);
    auto head = spawn_head(*head_sys_, {});
    ASSERT_TRUE(head) << head_sys_->render(head.error());
    head_ = *head;
    auto port = runtime::publish_actor(*head_sys_, head_, 0, "127.0.0.1");
    ASSERT_TRUE(port) << head_sys_->render(port.error());
    port_ = *port;
    auto remote = runtime::connect_actor<head_actor>(*node_sys_, {"127.0.0.1", port_}, "head");
    ASSERT_TRUE(remote) << node_sys_->render(remote.error());
    remote_ = *remote;
    agent_ = spawn_node_agent(*node_sys_, {});
  }

  void TearDown() override {
    stop_from_this_process(*node_sys_, agent_);
    stop_from_this_process(*head_sys_, head_);
    remote_ = head_actor{};
    agent_ = node_agent_actor{};
    head_ = head_actor{};
    node_sys_.reset();
    head_sys_.reset();
  }

  node_join_request good(const std::string& id) {
    node_join_request r;
    r.resources = {id, 4, int64_t{1} << 30, 2, true, {}};
    r.address = "127.0.0.1";
    r.port = 4242;
    r.version = rlforge_version();
    r.wire_types = wire_signature(*node_sys_);
    r.kinds = kind_interfaces();
    r.host = "test";
    r.pid = 1;
    return r;
  }

  caf::expected<join_reply> join(const node_join_request& r) {
    caf::scoped_actor self{*node_sys_};
    caf::expected<join_reply> out{caf::error{}};
    self->request(remote_, 10s, join_atom::value, r, agent_)
      .receive([&](join_reply& x) { out = std::move(x); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  std::string refusal(const node_join_request& r) {
    auto x = join(r);
    EXPECT_FALSE(x) << "accepted " << caf::deep_to_string(r.resources);
    return x ? std::string{} : error_message(x.error());
  }

  nlohmann::json status() {
    caf::scoped_actor self{*node_sys_};
    std::string out;
    self->request(remote_, 10s, cluster_status_atom::value)
      .receive([&](std::string& s) { out = s; }, [&](caf::error&) {});
    return nlohmann::json::parse(out.empty() ? "{}" : out);
  }

  runtime::system_config head_cfg_, node_cfg_;
  std::unique_ptr<caf::actor_system> head_sys_, node_sys_;
  head_actor head_, remote_;
  node_agent_actor agent_;
  uint16_t port_ = 0;
};

} // namespace

TEST_F(HeadProtocol, AcceptsANodeOfTheSameBuild) {
  auto r = join(good("n1"));
  ASSERT_TRUE(r) << node_sys_->render(r.error());
  EXPECT_EQ(r->version, rlforge_version());
  EXPECT_EQ(r->heartbeat_ms, 200);
  auto s = status();
  ASSERT_EQ(s["nodes"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["nodes"][0]["id"], "n1");
  EXPECT_EQ(s["nodes"][0]["total"]["GPU"], 2.0);
}

TEST_F(HeadProtocol, RefusesAnotherBuildNamingTheDifference) {
  auto old = good("n1");
  old.version = "0.0.9";
  auto msg = refusal(old);
  EXPECT_NE(msg.find("node 'n1' runs rlforge 0.0.9, the head runs " + std::string{rlforge_version()}),
            std::string::npos)
    << msg;
  auto wire = good("n1");
  wire.wire_types[1] = "rlforge::node_resources: node_resources(\"\", 0, 0)";
  msg = refusal(wire);
  EXPECT_NE(msg.find("differs in rlforge::node_resources"), std::string::npos) << msg;
  auto kinds = good("n1");
  kinds.kinds.erase(std::find(kinds.kinds.begin(), kinds.kinds.end(), "engine"));
  kinds.kinds.push_back("my.kind");
  msg = refusal(kinds);
  EXPECT_NE(msg.find("lacks kinds [engine]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[my.kind]"), std::string::npos) << msg;
  // A node whose engine takes other arguments for one op is refused, naming that op.
  auto ops = good("n1");
  auto generate = std::find_if(ops.kinds.begin(), ops.kinds.end(), [](const std::string& k) {
    return k.rfind("engine.generate<", 0) == 0;
  });
  ASSERT_NE(generate, ops.kinds.end());
  const std::string declared =
      "engine.generate<generate>(std::vector<sample_request>) -> (std::vector<sample_output>)";
  EXPECT_EQ(*generate, declared);
  *generate = "engine.generate<generate>(std::vector<sample_request>, int64) -> "
              "(std::vector<sample_output>)";
  msg = refusal(ops);
  EXPECT_NE(msg.find("other actor kinds or ops"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lacks kinds [" + declared + "]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[engine.generate<generate>(std::vector<sample_request>, int64) -> "
                     "(std::vector<sample_output>)]"),
            std::string::npos)
      << msg;
  // So is one whose op answers another type.
  auto results = good("n1");
  auto version = std::find(results.kinds.begin(), results.kinds.end(),
                           "engine.weight_version<weight_ver>() -> (int64)");
  ASSERT_NE(version, results.kinds.end());
  *version = "engine.weight_version<weight_ver>() -> (int32)";
  msg = refusal(results);
  EXPECT_NE(msg.find("lacks kinds [engine.weight_version<weight_ver>() -> (int64)]"),
            std::string::npos)
      << msg;
  // And one whose op goes by another wire id (its calls would reach no handler).
  auto ids = good("n1");
  auto stats = std::find(ids.kinds.begin(), ids.kinds.end(), "engine.stats<stats>() -> (string)");
  ASSERT_NE(stats, ids.kinds.end());
  *stats = "engine.stats<statistics>() -> (string)";
  msg = refusal(ids);
  EXPECT_NE(msg.find("lacks kinds [engine.stats<stats>() -> (string)]"), std::string::npos) << msg;
  // The head keeps serving: the same node of the right build joins.
  EXPECT_TRUE(join(good("n1")));
}

TEST_F(HeadProtocol, RefusesNonsenseResourcesAndBadIdsAndKeepsServing) {
  auto negative_gpus = good("a");
  negative_gpus.resources.gpus = -2;
  EXPECT_NE(refusal(negative_gpus).find("node 'a'"), std::string::npos);
  auto negative_cpus = good("b");
  negative_cpus.resources.cpus = -1;
  EXPECT_NE(refusal(negative_cpus).find("node 'b'"), std::string::npos);
  auto memory = good("c");
  memory.resources.memory_bytes = -5;
  EXPECT_NE(refusal(memory).find("memory must be >= 0"), std::string::npos);
  auto custom = good("d");
  custom.resources.custom["accel"] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(refusal(custom).find("node 'd'"), std::string::npos);
  EXPECT_NE(refusal(good("")).find("the node id is empty"), std::string::npos);
  EXPECT_NE(refusal(good("bad id!")).find("may only hold"), std::string::npos);
  auto no_address = good("e");
  no_address.address.clear();
  EXPECT_NE(refusal(no_address).find("no address"), std::string::npos);
  // Nothing of that changed the head.
  EXPECT_TRUE(status()["nodes"].empty());
  ASSERT_TRUE(join(good("ok")));
  EXPECT_EQ(status()["nodes"].size(), 1u);
}

TEST_F(HeadProtocol, RefusesADuplicateIdWhileTheNodeLivesButNotAfterItDied) {
  // A real agent joins through its runner's message.
  auto agent = spawn_node_agent(*node_sys_, {{"twin", 2, 0, 1, true, {}}, "127.0.0.1", 10s});
  {
    caf::scoped_actor self{*node_sys_};
    caf::error failure;
    self->request(agent, 10s, use_head_atom::value, caf::actor_cast<caf::actor>(remote_),
                  uint16_t{1234})
      .receive([](join_reply&) {}, [&](caf::error& e) { failure = e; });
    ASSERT_FALSE(failure) << node_sys_->render(failure);
  }
  auto msg = refusal(good("twin"));
  EXPECT_NE(msg.find("node 'twin' is already in the cluster"), std::string::npos) << msg;
  // The agent goes away: the head declares the node dead; its id is free again.
  stop_from_this_process(*node_sys_, agent);
  bool dead = false;
  for (int i = 0; i < 100 && !dead; ++i) {
    auto s = status();
    for (auto& n : s["nodes"])
      dead = dead || (n["id"] == "twin" && n["alive"] == false);
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(dead) << status().dump(2);
  EXPECT_TRUE(join(good("twin")));
}

TEST_F(HeadProtocol, CafRefusesAClientThatExpectsAnotherInterface) {
  auto wrong = runtime::connect_actor<node_agent_actor>(*node_sys_, {"127.0.0.1", port_},
                                                        "the head");
  ASSERT_FALSE(wrong);
  auto msg = error_message(wrong.error());
  EXPECT_NE(msg.find("another protocol"), std::string::npos) << msg;
}

TEST_F(HeadProtocol, AttachChecksTheDriversBuildToo) {
  driver_hello hello{"d1", "0.0.9", wire_signature(*node_sys_), "test", 1};
  caf::scoped_actor self{*node_sys_};
  auto session = node_sys_->spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t) {}};
  });
  caf::error failure;
  self->request(remote_, 10s, attach_atom::value, hello, session)
    .receive([](join_reply&) {}, [&](caf::error& e) { failure = e; });
  ASSERT_TRUE(failure);
  EXPECT_NE(error_message(failure).find("driver 'd1' runs rlforge 0.0.9"), std::string::npos);
  hello.version = rlforge_version();
  failure = caf::error{};
  self->request(remote_, 10s, attach_atom::value, hello, session)
    .receive([](join_reply&) {}, [&](caf::error& e) { failure = e; });
  EXPECT_FALSE(failure) << node_sys_->render(failure);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_F(HeadProtocol, IgnoresExitMessagesFromOtherProcessesAndForeignOrders) {
  // (CAF 0.17 makes exit_reason::kill unconditional; every other reason from a peer is dropped.)
  ASSERT_TRUE(status().contains("cluster_id"));
  caf::anon_send_exit(remote_, caf::exit_reason::user_shutdown);
  {
    caf::scoped_actor peer{*node_sys_};
    peer->send_exit(remote_, caf::exit_reason::user_shutdown);
  }
  std::this_thread::sleep_for(200ms);
  {
    caf::scoped_actor self{*head_sys_};
    bool alive = false;
    self->request(head_, 10s, cluster_status_atom::value)
      .receive([&](std::string&) { alive = true; }, [&](caf::error&) {});
    EXPECT_TRUE(alive) << "the head died from a remote exit";
  }
  // A node agent only takes its head from its own process.
  auto published = runtime::publish_actor(*node_sys_, agent_, 0, "127.0.0.1");
  ASSERT_TRUE(published);
  auto foreign = runtime::connect_actor<node_agent_actor>(*head_sys_, {"127.0.0.1", *published},
                                                          "the agent");
  ASSERT_TRUE(foreign) << error_message(foreign.error());
  caf::scoped_actor self{*head_sys_};
  caf::error failure;
  self->request(*foreign, 10s, use_head_atom::value, caf::actor_cast<caf::actor>(head_),
                uint16_t{1})
    .receive([](join_reply&) {}, [&](caf::error& e) { failure = e; });
  ASSERT_TRUE(failure);
  EXPECT_NE(error_message(failure).find("only its own process picks its head"), std::string::npos);
  // Nor does it spawn ranks before it joined a head.
  caf::error spawn_failure;
  self->request(*foreign, 10s, spawn_ranks_atom::value, std::string{"policy"},
                std::vector<rank_info>{rank_info{}}, caf::actor{}, std::string{"x"})
      .receive([](std::vector<caf::actor>&) {}, [&](caf::error& e) { spawn_failure = e; });
  ASSERT_TRUE(spawn_failure);
  EXPECT_NE(error_message(spawn_failure).find("not part of a cluster"), std::string::npos);
}
