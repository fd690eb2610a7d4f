// The head's state file (actors/head_store.hpp): the registry and the placement log read back
// as written, in order; a new file holds nothing; a file that is not a state file is refused,
// naming it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/head_store.hpp"

using namespace rlforge;
using namespace rlforge::actors;

namespace {

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("rlforge_head_store_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

placement_op op_of(const std::string& kind, std::string group, uint64_t id) {
  placement_op op{kind, {}};
  caf::binary_serializer sink{nullptr, op.args};
  EXPECT_FALSE(sink(group, id));
  return op;
}

} // namespace

TEST(HeadStore, TheRegistryAndTheLogReadBackAsWritten) {
  const auto path = temp_file("state.db");
  std::filesystem::remove(path);
  head_registry r;
  r.cluster_id = "c0ffee";
  r.version = "1.2.3";
  r.wire = {"a", "b"};
  stored_node n;
  n.request.resources.node_id = "n1";
  n.request.resources.gpus = 2;
  n.request.address = "127.0.0.1";
  n.request.port = 4242;
  r.nodes = {n, {n.request, false, "lost its connection"}};
  r.drivers = {driver_hello{"d1", "1.2.3", {"a"}, "host", 7}};
  group_record g;
  g.name = "policy";
  g.kind = "policy";
  g.placement_group = "training";
  g.rank_nodes = {"n1"};
  r.groups = {{"d1", g, ""}};
  r.pg_owner = {{"training", "d1"}};
  {
    head_store store{path};
    EXPECT_FALSE(store.registry());
    EXPECT_TRUE(store.placement_log().empty());
    store.save(r);
    store.append(op_of("reserve", "training", 1));
    store.append(op_of("release", "training", 1));
    r.cluster_id = "c0ffee2"; // a later save replaces the registry
    store.save(r);
  }
  head_store again{path};
  auto back = again.registry();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cluster_id, "c0ffee2");
  EXPECT_EQ(back->version, r.version);
  EXPECT_EQ(back->wire, r.wire);
  ASSERT_EQ(back->nodes.size(), 2u);
  EXPECT_EQ(back->nodes[0].request.resources, n.request.resources);
  EXPECT_EQ(back->nodes[0].request.port, 4242);
  EXPECT_FALSE(back->nodes[1].alive);
  EXPECT_EQ(back->nodes[1].death, "lost its connection");
  ASSERT_EQ(back->drivers.size(), 1u);
  EXPECT_EQ(back->drivers[0], r.drivers[0]);
  ASSERT_EQ(back->groups.size(), 1u);
  EXPECT_EQ(back->groups[0].record, g);
  EXPECT_EQ(back->pg_owner, r.pg_owner);
  auto log = again.placement_log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].kind, "reserve");
  EXPECT_EQ(log[1].kind, "release");
  std::string group;
  uint64_t id = 0;
  caf::binary_deserializer source{nullptr, log[1].args};
  ASSERT_FALSE(source(group, id));
  EXPECT_EQ(group, "training");
  EXPECT_EQ(id, 1u);
  // One file: no write-ahead log or shared-memory file beside it.
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path + "-shm"));
  std::filesystem::remove(path);
}

TEST(HeadStore, WhatIsNotAStateFileIsRefusedNamingIt) {
  const auto path = temp_file("garbage.db");
  {
    std::ofstream out(path);
    out << "not SQLite " << std::string(300, 'x');
  }
  try {
    head_store store{path};
    FAIL() << "opened a file that is not a state file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string{e.what()}.find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("not a head state file"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  try {
    head_store store{"/nonexistent/dir/state.db"};
    FAIL() << "opened a file in a directory that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string{e.what()}.find("/nonexistent/dir/state.db: cannot open it"),
              std::string::npos)
        << e.what();
  }
}
