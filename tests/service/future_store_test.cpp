#include "service/future_store.hpp"

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sqlite3.h>
#include <unistd.h>

using namespace rlforge::service;
namespace fs = std::filesystem;

namespace {

using rlforge::test_support::temp_dir;

/// Runs `f`, expects a store_error with `code` whose message contains `needle`.
template <class F> void expect_store_error(F&& f, store_errc code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no store_error thrown; expected one containing '" << needle << "'";
  } catch (const store_error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

/// One SQL query on a separate, raw connection to `path`: the first column of the first row.
std::string raw_query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  std::string out;
  char* err = nullptr;
  sqlite3_exec(
      db, sql.c_str(),
      [](void* p, int, char** v, char**) {
        *static_cast<std::string*>(p) = v[0] ? v[0] : "NULL";
        return 0;
      },
      &out, &err);
  EXPECT_EQ(err, nullptr) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
  return out;
}

std::string binary_bytes() {
  std::string b;
  for (int i = 0; i < 1000; ++i)
    b.push_back(static_cast<char>(i * 37 % 256)); // includes NUL bytes
  return b;
}

} // namespace

// ---- futures --------------------------------------------------------------------------------

TEST(FutureStore, SubmitCompleteAndGet) {
  temp_dir dir;
  auto store = future_store::open(dir.file("s.db"));
  EXPECT_EQ(store->failed_at_open(), 0u);
  auto r = store->submit("forward_backward", "m1", 1, "key-1", "h1");
  EXPECT_TRUE(r.created);
  EXPECT_FALSE(r.conflict);
  EXPECT_EQ(r.request_id.rfind("req-", 0), 0u);
  EXPECT_EQ(r.request_id.size(), 4u + 32u);
  auto f = store->get(r.request_id);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->state, future_state::pending);
  EXPECT_EQ(f->request_type, "forward_backward");
  EXPECT_EQ(f->model_id, "m1");
  EXPECT_EQ(f->seq_id, 1);
  EXPECT_EQ(f->idempotency_key, "key-1");
  EXPECT_EQ(f->payload_hash, "h1");
  EXPECT_GT(f->created_ms, 0);
  EXPECT_EQ(f->completed_ms, 0);
  auto bytes = binary_bytes();
  store->complete(r.request_id, bytes, "application/x-protobuf");
  f = store->get(r.request_id);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->state, future_state::complete);
  EXPECT_EQ(f->result, bytes);
  EXPECT_EQ(f->result_content_type, "application/x-protobuf");
  EXPECT_GE(f->completed_ms, f->created_ms);
  EXPECT_EQ(store->count_futures(future_state::complete), 1u);
  EXPECT_EQ(store->count_futures(future_state::pending), 0u);
}

TEST(FutureStore, EmptyResultIsStoredAsEmpty) {
  auto store = future_store::open(":memory:");
  auto r = store->submit("optim_step", "", -1, "", "h");
  store->complete(r.request_id, "", "application/json");
  auto f = store->get(r.request_id);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->state, future_state::complete);
  EXPECT_EQ(f->result, "");
}

TEST(FutureStore, FailRecordsMessageAndCategory) {
  auto store = future_store::open(":memory:");
  auto r = store->submit("optim_step", "m", 2, "", "h");
  store->fail(r.request_id, "learning rate must be positive", "user");
  auto f = store->get(r.request_id);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->state, future_state::failed);
  EXPECT_EQ(f->error, "learning rate must be positive");
  EXPECT_EQ(f->category, "user");
  EXPECT_EQ(f->result, "");
  EXPECT_EQ(store->count_futures(future_state::failed), 1u);
}

TEST(FutureStore, RequestIdsAreDistinct) {
  auto store = future_store::open(":memory:");
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i)
    ids.insert(store->submit("sample", "s", -1, "", "h").request_id);
  EXPECT_EQ(ids.size(), 200u);
}

TEST(FutureStore, SameIdempotencyKeySameHashReturnsOriginal) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("optim_step", "m", -1, "stainless-python-retry-1", "h");
  auto b = store->submit("optim_step", "m", -1, "stainless-python-retry-1", "h");
  EXPECT_TRUE(a.created);
  EXPECT_FALSE(b.created);
  EXPECT_FALSE(b.conflict);
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(store->count_futures(future_state::pending), 1u);
}

TEST(FutureStore, SameIdempotencyKeyOtherHashConflicts) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("optim_step", "m", -1, "k", "h1");
  auto b = store->submit("optim_step", "m", -1, "k", "h2");
  EXPECT_FALSE(b.created);
  EXPECT_TRUE(b.conflict);
  EXPECT_EQ(b.request_id, a.request_id);
  EXPECT_NE(b.message.find("idempotency key 'k'"), std::string::npos) << b.message;
  EXPECT_EQ(store->count_futures(future_state::pending), 1u);
}

TEST(FutureStore, SameModelSeqIdSameHashReturnsOriginal) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("forward_backward", "m", 3, "k1", "h");
  // A retry after a lost connection: new idempotency key, same (model_id, seq_id) and payload.
  auto b = store->submit("forward_backward", "m", 3, "k2", "h");
  EXPECT_FALSE(b.created);
  EXPECT_FALSE(b.conflict);
  EXPECT_EQ(a.request_id, b.request_id);
  // The same seq_id of another model is a different request.
  auto c = store->submit("forward_backward", "other", 3, "", "h");
  EXPECT_TRUE(c.created);
  EXPECT_NE(c.request_id, a.request_id);
}

TEST(FutureStore, SameModelSeqIdOtherHashConflicts) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("forward_backward", "m", 3, "", "h1");
  auto b = store->submit("optim_step", "m", 3, "", "h2");
  EXPECT_TRUE(b.conflict);
  EXPECT_FALSE(b.created);
  EXPECT_EQ(b.request_id, a.request_id);
  EXPECT_NE(b.message.find("seq_id 3 of model 'm'"), std::string::npos) << b.message;
}

TEST(FutureStore, NoSeqIdNoKeyAlwaysCreates) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("create_model", "", -1, "", "h");
  auto b = store->submit("create_model", "", -1, "", "h");
  EXPECT_TRUE(a.created);
  EXPECT_TRUE(b.created);
  EXPECT_NE(a.request_id, b.request_id);
}

TEST(FutureStore, RetryOfFinishedRequestReturnsItsResult) {
  auto store = future_store::open(":memory:");
  auto a = store->submit("optim_step", "m", 4, "k", "h");
  store->complete(a.request_id, "{\"metrics\":{}}", "application/json");
  auto b = store->submit("optim_step", "m", 4, "k", "h");
  EXPECT_FALSE(b.created);
  EXPECT_EQ(b.request_id, a.request_id);
  EXPECT_EQ(store->get(b.request_id)->result, "{\"metrics\":{}}");
}

TEST(FutureStore, RejectsBadSubmitArguments) {
  auto store = future_store::open(":memory:");
  expect_store_error([&] { store->submit("", "m", 1, "", "h"); }, store_errc::invalid,
                     "empty request type");
  expect_store_error([&] { store->submit("optim_step", "m", 1, "", ""); }, store_errc::invalid,
                     "empty payload hash");
  expect_store_error([&] { store->submit("optim_step", "m", -2, "", "h"); }, store_errc::invalid,
                     "seq_id -2");
  EXPECT_EQ(store->count_futures(future_state::pending), 0u);
}

TEST(FutureStore, CompleteOrFailOfUnknownOrFinishedIdThrows) {
  auto store = future_store::open(":memory:");
  expect_store_error([&] { store->complete("req-nope", "x", "application/json"); },
                     store_errc::not_found, "'req-nope'");
  expect_store_error([&] { store->fail("req-nope", "x", "user"); }, store_errc::not_found,
                     "'req-nope'");
  auto r = store->submit("optim_step", "m", 1, "", "h");
  store->complete(r.request_id, "first", "application/json");
  expect_store_error([&] { store->complete(r.request_id, "second", "application/json"); },
                     store_errc::conflict, "already complete");
  expect_store_error([&] { store->fail(r.request_id, "late", "server"); }, store_errc::conflict,
                     "already complete");
  auto f = store->get(r.request_id);
  EXPECT_EQ(f->result, "first");
  EXPECT_EQ(f->error, "");
  auto g = store->submit("optim_step", "m", 2, "", "h");
  store->fail(g.request_id, "bad", "user");
  expect_store_error([&] { store->complete(g.request_id, "x", "application/json"); },
                     store_errc::conflict, "already failed");
  EXPECT_FALSE(store->get("req-nope"));
}

TEST(FutureStore, FailRejectsUnknownCategory) {
  auto store = future_store::open(":memory:");
  auto r = store->submit("optim_step", "m", 1, "", "h");
  expect_store_error([&] { store->fail(r.request_id, "x", "fatal"); }, store_errc::invalid,
                     "'fatal'");
  EXPECT_EQ(store->get(r.request_id)->state, future_state::pending);
  store->fail(r.request_id, "x", "unknown");
  EXPECT_EQ(store->get(r.request_id)->category, "unknown");
}

TEST(FutureStore, PurgeDeletesOnlyFinishedFuturesBeforeTheCutoff) {
  auto store = future_store::open(":memory:");
  auto done = store->submit("optim_step", "m", 1, "k1", "h").request_id;
  auto failed = store->submit("optim_step", "m", 2, "k2", "h").request_id;
  auto pending = store->submit("optim_step", "m", 3, "k3", "h").request_id;
  store->complete(done, "r", "application/json");
  store->fail(failed, "e", "user");
  auto finished_at = store->get(done)->completed_ms;
  EXPECT_EQ(store->purge_finished_futures(finished_at - 1000), 0u);
  EXPECT_TRUE(store->get(done));
  EXPECT_EQ(store->purge_finished_futures(future_store::now_ms() + 1000), 2u);
  EXPECT_FALSE(store->get(done));
  EXPECT_FALSE(store->get(failed));
  ASSERT_TRUE(store->get(pending));
  EXPECT_EQ(store->get(pending)->state, future_state::pending);
  // A retry of a purged request is a new request.
  auto again = store->submit("optim_step", "m", 1, "k1", "h");
  EXPECT_TRUE(again.created);
  EXPECT_NE(again.request_id, done);
}

// ---- restart, file format -------------------------------------------------------------------

TEST(FutureStore, RestartKeepsResultsAndFailsPendingRequests) {
  temp_dir dir;
  auto path = dir.file("s.db");
  auto bytes = binary_bytes();
  std::string done, failed, pending1, pending2;
  {
    auto store = future_store::open(path);
    done = store->submit("forward_backward", "m", 1, "k1", "h1").request_id;
    store->complete(done, bytes, "application/x-protobuf");
    failed = store->submit("optim_step", "m", 2, "k2", "h2").request_id;
    store->fail(failed, "bad lr", "user");
    pending1 = store->submit("forward_backward", "m", 3, "k3", "h3").request_id;
    pending2 = store->submit("sample", "samp", 0, "", "h4").request_id;
  }
  auto store = future_store::open(path);
  EXPECT_EQ(store->failed_at_open(), 2u);
  auto d = store->get(done);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->state, future_state::complete);
  EXPECT_EQ(d->result, bytes);
  EXPECT_EQ(d->result_content_type, "application/x-protobuf");
  auto f = store->get(failed);
  EXPECT_EQ(f->error, "bad lr");
  EXPECT_EQ(f->category, "user");
  for (const auto& id : {pending1, pending2}) {
    auto p = store->get(id);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->state, future_state::failed);
    EXPECT_EQ(p->error, restart_failure_message);
    EXPECT_EQ(p->category, "server");
    EXPECT_GT(p->completed_ms, 0);
  }
  // Retries after the restart still find the originals.
  auto retry = store->submit("forward_backward", "m", 1, "k1", "h1");
  EXPECT_FALSE(retry.created);
  EXPECT_EQ(retry.request_id, done);
  // A third open finds nothing pending.
  store.reset();
  EXPECT_EQ(future_store::open(path)->failed_at_open(), 0u);
}

TEST(FutureStore, FileIsInWalMode) {
  temp_dir dir;
  auto path = dir.file("s.db");
  auto store = future_store::open(path);
  store->submit("optim_step", "m", 1, "", "h");
  // journal_mode=WAL is persistent: a second connection sees it.
  EXPECT_EQ(raw_query(path, "PRAGMA journal_mode"), "wal");
  EXPECT_TRUE(fs::exists(path + "-wal"));
  EXPECT_EQ(raw_query(path, "SELECT version FROM schema_version"), "1");
  EXPECT_EQ(raw_query(path, "SELECT count(*) FROM futures"), "1");
}

TEST(FutureStore, RefusesNonSqliteFile) {
  temp_dir dir;
  auto path = dir.file("notes.txt");
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i)
      out << "this is a text file, not a database\n";
  }
  expect_store_error([&] { future_store::open(path); }, store_errc::database,
                     "not an SQLite database");
  // The file is left as it was.
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "this is a text file, not a database");
}

TEST(FutureStore, RefusesCorruptFile) {
  temp_dir dir;
  auto path = dir.file("s.db");
  {
    auto store = future_store::open(path);
    store->submit("optim_step", "m", 1, "", "h");
  }
  ASSERT_FALSE(fs::exists(path + "-wal")); // the last close checkpointed the WAL into the file
  {
    // Keep SQLite's 100-byte file header, scribble over the schema page behind it.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    std::string junk(1900, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  expect_store_error([&] { future_store::open(path); }, store_errc::database, path);
  expect_store_error([&] { future_store::open(path); }, store_errc::database, "malformed");
}

TEST(FutureStore, RefusesForeignSqliteFile) {
  temp_dir dir;
  auto path = dir.file("other.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  expect_store_error([&] { future_store::open(path); }, store_errc::database,
                     "no schema_version table");
}

TEST(FutureStore, RefusesNewerSchemaVersion) {
  temp_dir dir;
  auto path = dir.file("s.db");
  future_store::open(path);
  raw_query(path, "UPDATE schema_version SET version = 7");
  expect_store_error([&] { future_store::open(path); }, store_errc::database,
                     "schema version 7, this build reads only 1 (written by a newer rlforge?)");
  raw_query(path, "INSERT INTO schema_version VALUES (1)");
  expect_store_error([&] { future_store::open(path); }, store_errc::database, "2 rows");
}

TEST(FutureStore, RefusesUnwritablePaths) {
  temp_dir dir;
  expect_store_error([&] { future_store::open(dir.file("missing/dir/s.db")); },
                     store_errc::database, "missing/dir/s.db");
  // A directory is no database file.
  expect_store_error([&] { future_store::open(dir.path().string()); }, store_errc::database,
                     dir.path().string());
  // A regular file used as a directory.
  std::ofstream(dir.file("plain")) << "x";
  expect_store_error([&] { future_store::open(dir.file("plain/s.db")); }, store_errc::database,
                     "plain/s.db");
  expect_store_error([&] { future_store::open(""); }, store_errc::invalid, "empty");
}

// ---- concurrency ----------------------------------------------------------------------------

TEST(FutureStore, ManyThreadsSubmitAndComplete) {
  temp_dir dir;
  auto store = future_store::open(dir.file("s.db"));
  constexpr int threads = 8;
  constexpr int per_thread = 1000;
  std::vector<std::vector<std::string>> ids(threads);
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        auto model = "model-" + std::to_string(t);
        for (int i = 0; i < per_thread; ++i) {
          auto r = store->submit("forward_backward", model, i, "", "h" + std::to_string(i));
          if (!r.created)
            ++errors;
          ids[t].push_back(r.request_id);
          if (i % 2 == 0)
            store->complete(r.request_id, model + "/" + std::to_string(i), "application/json");
          else
            store->fail(r.request_id, model + "/" + std::to_string(i), "server");
          if (!store->get(r.request_id))
            ++errors;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++errors;
      }
    });
  }
  for (auto& th : pool)
    th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(store->count_futures(future_state::complete), threads * per_thread / 2u);
  EXPECT_EQ(store->count_futures(future_state::failed), threads * per_thread / 2u);
  std::set<std::string> unique;
  for (int t = 0; t < threads; ++t) {
    ASSERT_EQ(ids[t].size(), static_cast<size_t>(per_thread));
    for (int i = 0; i < per_thread; ++i) {
      unique.insert(ids[t][i]);
      auto f = store->get(ids[t][i]);
      ASSERT_TRUE(f);
      auto expected = "model-" + std::to_string(t) + "/" + std::to_string(i);
      EXPECT_EQ(i % 2 == 0 ? f->result : f->error, expected);
    }
  }
  EXPECT_EQ(unique.size(), static_cast<size_t>(threads * per_thread));
}

// ---- sessions and models --------------------------------------------------------------------

TEST(FutureStoreSessions, CreateHeartbeatGet) {
  auto store = future_store::open(":memory:");
  auto id = store->create_session("[\"a\",\"b\"]", "{\"user\":\"x\"}");
  EXPECT_EQ(id.rfind("sess-", 0), 0u);
  auto s = store->get_session(id);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->tags_json, "[\"a\",\"b\"]");
  EXPECT_EQ(s->user_metadata_json, "{\"user\":\"x\"}");
  EXPECT_GT(s->created_ms, 0);
  auto before = s->last_heartbeat_ms;
  store->heartbeat(id);
  EXPECT_GE(store->get_session(id)->last_heartbeat_ms, before);
  EXPECT_NE(store->create_session(), id);
  auto empty = store->get_session(store->create_session("", ""));
  EXPECT_EQ(empty->tags_json, "[]");
  EXPECT_EQ(empty->user_metadata_json, "{}");
}

TEST(FutureStoreSessions, ListsSessionsAndTheirSamplingSessionsOldestFirst) {
  auto store = future_store::open(":memory:");
  EXPECT_TRUE(store->list_sessions().empty());
  auto a = store->create_session("[\"x\"]", "{}");
  auto b = store->create_session();
  auto all = store->list_sessions();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].session_id, a);
  EXPECT_EQ(all[0].tags_json, "[\"x\"]");
  EXPECT_EQ(all[1].session_id, b);
  sampling_session_record s;
  s.session_id = b;
  s.base_model = "tiny-llama";
  s.sampling_session_seq_id = 0;
  auto s0 = store->create_sampling_session(s);
  s.sampling_session_seq_id = 1;
  auto s1 = store->create_sampling_session(s);
  sampling_session_record anon;
  anon.base_model = "tiny-llama";
  auto free = store->create_sampling_session(anon);
  auto of_b = store->list_sampling_sessions(b);
  ASSERT_EQ(of_b.size(), 2u);
  EXPECT_EQ(of_b[0].id, s0);
  EXPECT_EQ(of_b[1].id, s1);
  EXPECT_TRUE(store->list_sampling_sessions(a).empty());
  EXPECT_TRUE(store->list_sampling_sessions("sess-nope").empty());
  auto none = store->list_sampling_sessions("");
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].id, free);
}

TEST(FutureStoreSessions, RejectsBadInput) {
  auto store = future_store::open(":memory:");
  expect_store_error([&] { store->heartbeat("sess-nope"); }, store_errc::not_found, "'sess-nope'");
  expect_store_error([&] { store->create_session("[1,", "{}"); }, store_errc::invalid,
                     "tags is not valid JSON");
  expect_store_error([&] { store->create_session("{}", "{}"); }, store_errc::invalid,
                     "tags must be a JSON array");
  expect_store_error([&] { store->create_session("[]", "[]"); }, store_errc::invalid,
                     "user_metadata must be a JSON object");
  EXPECT_FALSE(store->get_session("sess-nope"));
}

TEST(FutureStoreModels, InsertGetListDelete) {
  auto store = future_store::open(":memory:");
  auto sess = store->create_session();
  EXPECT_EQ(store->next_model_id(sess), sess + ":train:0");
  model_record m;
  m.model_id = store->next_model_id(sess);
  m.session_id = sess;
  m.model_seq_id = 0;
  m.base_model = "tiny-llama";
  m.lora_config_json = "{\"rank\":8}";
  m.role = "policy";
  store->insert_model(m);
  EXPECT_EQ(store->next_model_id(sess), sess + ":train:1");
  model_record critic = m;
  critic.model_id = future_store::model_id_for(sess, 1);
  critic.model_seq_id = 1;
  critic.role = "critic";
  store->insert_model(critic);
  auto got = store->get_model(m.model_id);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->session_id, sess);
  EXPECT_EQ(got->base_model, "tiny-llama");
  EXPECT_EQ(got->lora_config_json, "{\"rank\":8}");
  EXPECT_EQ(got->role, "policy");
  EXPECT_FALSE(got->deleted);
  EXPECT_GT(got->created_ms, 0);
  auto all = store->list_models(sess);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].model_id, m.model_id);
  EXPECT_EQ(all[1].model_id, critic.model_id);
  EXPECT_EQ(all[1].role, "critic");
  store->mark_model_deleted(m.model_id);
  EXPECT_TRUE(store->get_model(m.model_id)->deleted);
  EXPECT_EQ(store->list_models(sess).size(), 1u);
  EXPECT_EQ(store->list_models(sess, true).size(), 2u);
  EXPECT_EQ(store->list_models("", true).size(), 2u);
  EXPECT_EQ(store->list_models(store->create_session()).size(), 0u);
  // Deleted models keep their seq ids: the next one is still 2.
  EXPECT_EQ(store->next_model_id(sess), sess + ":train:2");
}

TEST(FutureStoreModels, RejectsBadInput) {
  auto store = future_store::open(":memory:");
  auto sess = store->create_session();
  model_record m;
  m.model_id = sess + ":train:0";
  m.session_id = sess;
  m.base_model = "b";
  auto bad = m;
  bad.model_id = "";
  expect_store_error([&] { store->insert_model(bad); }, store_errc::invalid, "empty model id");
  bad = m;
  bad.base_model = "";
  expect_store_error([&] { store->insert_model(bad); }, store_errc::invalid, "empty base model");
  bad = m;
  bad.role = "judge";
  expect_store_error([&] { store->insert_model(bad); }, store_errc::invalid, "'judge'");
  bad = m;
  bad.lora_config_json = "{rank: 8}";
  expect_store_error([&] { store->insert_model(bad); }, store_errc::invalid,
                     "lora_config is not valid JSON");
  bad = m;
  bad.session_id = "sess-nope";
  expect_store_error([&] { store->insert_model(bad); }, store_errc::not_found, "'sess-nope'");
  EXPECT_TRUE(store->list_models("", true).empty());
  store->insert_model(m);
  expect_store_error([&] { store->insert_model(m); }, store_errc::conflict, "already taken");
  store->mark_model_deleted(m.model_id);
  expect_store_error([&] { store->insert_model(m); }, store_errc::conflict, "already taken");
  expect_store_error([&] { store->mark_model_deleted(m.model_id); }, store_errc::conflict,
                     "already deleted");
  expect_store_error([&] { store->mark_model_deleted("nope"); }, store_errc::not_found, "'nope'");
  expect_store_error([&] { store->next_model_id("sess-nope"); }, store_errc::not_found,
                     "'sess-nope'");
  EXPECT_FALSE(store->get_model("nope"));
}

// ---- sampling sessions ----------------------------------------------------------------------

TEST(FutureStoreSampling, CreateGetUpdateAndRetry) {
  auto store = future_store::open(":memory:");
  auto sess = store->create_session();
  sampling_session_record base;
  base.session_id = sess;
  base.sampling_session_seq_id = 0;
  base.base_model = "tiny-llama";
  auto id = store->create_sampling_session(base);
  EXPECT_EQ(id.rfind("samp-", 0), 0u);
  // The client's retry of the same sampling_session_seq_id gets the same session.
  EXPECT_EQ(store->create_sampling_session(base), id);
  auto got = store->get_sampling_session(id);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->base_model, "tiny-llama");
  EXPECT_EQ(got->model_id, "");
  EXPECT_EQ(got->session_id, sess);
  EXPECT_GT(got->created_ms, 0);

  model_record m;
  m.model_id = future_store::model_id_for(sess, 0);
  m.session_id = sess;
  m.base_model = "tiny-llama";
  store->insert_model(m);
  sampling_session_record trained;
  trained.session_id = sess;
  trained.sampling_session_seq_id = 1;
  trained.model_id = m.model_id;
  trained.model_path = "tinker://" + m.model_id + "/sampler_weights/s1";
  trained.weights_version = 3;
  trained.weights_dir = "/ckpt/s1";
  auto id2 = store->create_sampling_session(trained);
  EXPECT_NE(id2, id);
  store->update_sampling_weights(id2, 4, "/ckpt/s2");
  auto t = store->get_sampling_session(id2);
  EXPECT_EQ(t->weights_version, 4);
  EXPECT_EQ(t->weights_dir, "/ckpt/s2");
  EXPECT_EQ(t->model_path, trained.model_path);
  // Session-less sampling sessions are never merged.
  sampling_session_record anon;
  anon.base_model = "tiny-llama";
  EXPECT_NE(store->create_sampling_session(anon), store->create_sampling_session(anon));
}

TEST(FutureStoreSampling, RejectsBadInput) {
  auto store = future_store::open(":memory:");
  sampling_session_record s;
  expect_store_error([&] { store->create_sampling_session(s); }, store_errc::invalid,
                     "neither a model id nor a base model");
  s.base_model = "b";
  s.weights_version = -1;
  expect_store_error([&] { store->create_sampling_session(s); }, store_errc::invalid,
                     "weights version -1");
  s.weights_version = 0;
  s.session_id = "sess-nope";
  expect_store_error([&] { store->create_sampling_session(s); }, store_errc::not_found,
                     "'sess-nope'");
  s.session_id = "";
  s.model_id = "nope";
  expect_store_error([&] { store->create_sampling_session(s); }, store_errc::not_found,
                     "no model 'nope'");
  expect_store_error([&] { store->update_sampling_weights("samp-nope", 1, "d"); },
                     store_errc::not_found, "'samp-nope'");
  s.model_id = "";
  auto id = store->create_sampling_session(s);
  expect_store_error([&] { store->update_sampling_weights(id, -5, "d"); }, store_errc::invalid,
                     "-5");
  EXPECT_EQ(store->get_sampling_session(id)->weights_version, 0);
  EXPECT_FALSE(store->get_sampling_session("samp-nope"));
}

// ---- checkpoints ----------------------------------------------------------------------------

TEST(FutureStoreCheckpoints, InsertGetListDelete) {
  auto store = future_store::open(":memory:");
  checkpoint_record a;
  a.tinker_path = "tinker://m1/weights/step1";
  a.model_id = "m1";
  a.kind = checkpoint_kind::weights;
  a.name = "step1";
  a.dir = "/ckpt/m1/step1";
  a.size_bytes = 1234;
  a.created_ms = 1000;
  a.expires_ms = 5000;
  store->insert_checkpoint(a);
  checkpoint_record b = a;
  b.tinker_path = "tinker://m1/sampler_weights/s";
  b.kind = checkpoint_kind::sampler_weights;
  b.created_ms = 2000;
  b.expires_ms.reset();
  store->insert_checkpoint(b);
  checkpoint_record c = a;
  c.tinker_path = "tinker://m2/weights/x";
  c.model_id = "m2";
  c.created_ms = 0; // set to now
  c.expires_ms.reset();
  store->insert_checkpoint(c);

  auto got = store->get_checkpoint(a.tinker_path);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->model_id, "m1");
  EXPECT_EQ(got->kind, checkpoint_kind::weights);
  EXPECT_EQ(got->name, "step1");
  EXPECT_EQ(got->dir, "/ckpt/m1/step1");
  EXPECT_EQ(got->size_bytes, 1234);
  EXPECT_EQ(got->created_ms, 1000);
  ASSERT_TRUE(got->expires_ms);
  EXPECT_EQ(*got->expires_ms, 5000);
  EXPECT_FALSE(store->get_checkpoint(b.tinker_path)->expires_ms);
  EXPECT_EQ(store->get_checkpoint(b.tinker_path)->kind, checkpoint_kind::sampler_weights);
  EXPECT_GT(store->get_checkpoint(c.tinker_path)->created_ms, 2000);

  auto m1 = store->list_checkpoints("m1");
  ASSERT_EQ(m1.size(), 2u);
  EXPECT_EQ(m1[0].tinker_path, a.tinker_path);
  EXPECT_EQ(m1[1].tinker_path, b.tinker_path);
  EXPECT_EQ(store->list_checkpoints().size(), 3u);
  EXPECT_EQ(store->list_expired_checkpoints(4999).size(), 0u);
  auto expired = store->list_expired_checkpoints(5000);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].tinker_path, a.tinker_path);

  auto removed = store->delete_checkpoint(a.tinker_path);
  EXPECT_EQ(removed.dir, a.dir);
  EXPECT_FALSE(store->get_checkpoint(a.tinker_path));
  EXPECT_EQ(store->list_checkpoints("m1").size(), 1u);
}

TEST(FutureStoreCheckpoints, OverwriteOnlyWhenAsked) {
  auto store = future_store::open(":memory:");
  checkpoint_record a;
  a.tinker_path = "tinker://m/weights/n";
  a.model_id = "m";
  a.dir = "/d1";
  store->insert_checkpoint(a);
  auto b = a;
  b.dir = "/d2";
  expect_store_error([&] { store->insert_checkpoint(b); }, store_errc::conflict, "already exists");
  EXPECT_EQ(store->get_checkpoint(a.tinker_path)->dir, "/d1");
  store->insert_checkpoint(b, true);
  EXPECT_EQ(store->get_checkpoint(a.tinker_path)->dir, "/d2");
  EXPECT_EQ(store->list_checkpoints().size(), 1u);
}

TEST(FutureStoreCheckpoints, RejectsBadInput) {
  auto store = future_store::open(":memory:");
  checkpoint_record c;
  c.tinker_path = "tinker://m/weights/n";
  c.model_id = "m";
  c.dir = "/d";
  auto bad = c;
  bad.tinker_path = "/m/weights/n";
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid,
                     "does not start with 'tinker://'");
  bad.tinker_path = "tinker://";
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid, "'tinker://'");
  bad = c;
  bad.model_id = "";
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid, "empty model id");
  bad = c;
  bad.dir = "";
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid,
                     "empty directory");
  bad = c;
  bad.size_bytes = -1;
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid, "negative size");
  bad = c;
  bad.created_ms = 100;
  bad.expires_ms = 50;
  expect_store_error([&] { store->insert_checkpoint(bad); }, store_errc::invalid,
                     "expires (50 ms) before it was created (100 ms)");
  EXPECT_TRUE(store->list_checkpoints().empty());
  expect_store_error([&] { store->delete_checkpoint("tinker://nope"); }, store_errc::not_found,
                     "'tinker://nope'");
  EXPECT_FALSE(store->get_checkpoint("tinker://nope"));
}

TEST(FutureStoreCheckpoints, SurviveRestart) {
  temp_dir dir;
  auto path = dir.file("s.db");
  std::string sess, samp;
  {
    auto store = future_store::open(path);
    sess = store->create_session("[\"t\"]", "{}");
    model_record m;
    m.model_id = future_store::model_id_for(sess, 0);
    m.session_id = sess;
    m.base_model = "b";
    store->insert_model(m);
    sampling_session_record s;
    s.model_id = m.model_id;
    samp = store->create_sampling_session(s);
    checkpoint_record c;
    c.tinker_path = "tinker://" + m.model_id + "/weights/a";
    c.model_id = m.model_id;
    c.dir = "/d";
    store->insert_checkpoint(c);
  }
  auto store = future_store::open(path);
  EXPECT_EQ(store->get_session(sess)->tags_json, "[\"t\"]");
  EXPECT_EQ(store->list_models(sess).size(), 1u);
  EXPECT_TRUE(store->get_sampling_session(samp));
  EXPECT_EQ(store->list_checkpoints().size(), 1u);
}
